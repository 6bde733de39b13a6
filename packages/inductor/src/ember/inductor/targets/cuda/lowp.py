"""How a CUDA kernel computes f16/bf16 values: the `cuda_lowp` attribute of a loop node.

"f32" (the default): loads upcast to f32, every op, conversion and reduction in f32, the
result rounded to its dtype only where it is stored, as TorchInductor computes (its
`emulate_precision_casts` off). "per-op": every op's result and every conversion rounded to
its dtype, as eager rounds each op's result (ember's decompositions compute an f16/bf16 op in
f32 between two conversions, so this is two conversions per op), for results comparable with
eager's bit for bit. `schedule-cuda` writes the attribute on each kernel that holds f16/bf16
values (`schedule-cuda{lowp=per-op}` for the other mode); an edited dump replays its own.
render.py renders it. The CPU C++ target rounds per op (targets/cpu/cpp.py).
"""

from __future__ import annotations

from typing import Any

from ember.ir import DType, Graph, Node, Ref, TensorType, Value

# how f16/bf16 values are computed (module docstring): the `cuda_lowp` attribute's values
LOWP_MODES = ("f32", "per-op")
LOWP_DEFAULT = "f32"


def read_lowp(node: Node) -> str:
    """The node's `cuda_lowp` mode (LOWP_DEFAULT where it has none), checked."""
    from ember.inductor.schedule import ScheduleError
    v = node.kwargs.get("cuda_lowp", LOWP_DEFAULT)
    if v not in LOWP_MODES:
        raise ScheduleError(f"{node.op}: cuda_lowp={v!r} is not valid (one of "
                            f"{', '.join(LOWP_MODES)})")
    return str(v)


def has_lowp_values(node: Node, body: Graph, items: dict[str, Any]) -> bool:
    """Whether the kernel holds any f16/bf16 value (its buffers, its body's and its fused
    reductions' bodies' values): where cuda_lowp changes what it computes."""
    low = (DType.f16, DType.bf16)
    if any(isinstance(v, Value) and isinstance(v.type, TensorType) and v.type.dtype in low
           for v in [*node.args[1:], *node.results]):
        return True
    stack, seen = [body], set()
    while stack:
        g = stack.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        for n in g.nodes:
            if any(isinstance(r.type, TensorType) and r.type.dtype in low for r in n.results):
                return True
            sub = items.get(n.args[0].name) if n.op == "loop.reduce" and \
                isinstance(n.args[0], Ref) else None
            if isinstance(sub, Graph):
                stack.append(sub)
    return False


__all__ = ["LOWP_DEFAULT", "LOWP_MODES", "has_lowp_values", "read_lowp"]
