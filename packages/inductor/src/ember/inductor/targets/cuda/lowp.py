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


# cuda_math: which f32 math a kernel's body uses. "accurate" (the default, and every kernel
# that stores an f32/f16 value): the OPS table's. "bf16" (schedule-cuda writes it on kernels
# whose every result is bf16, computed under cuda_lowp=f32): the prelude's cheaper 1 + erf
# and gelu, whose errors are a small part of a bf16 ulp (prelude.py states the bound).
MATH_MODES = ("accurate", "bf16")


def read_math(node: Node) -> str:
    """The node's `cuda_math` mode ("accurate" where it has none), checked."""
    from ember.inductor.schedule import ScheduleError
    v = node.kwargs.get("cuda_math", "accurate")
    if v not in MATH_MODES:
        raise ScheduleError(f"{node.op}: cuda_math={v!r} is not valid (one of "
                            f"{', '.join(MATH_MODES)})")
    return str(v)


def bf16_results(node: Node) -> bool:
    """Whether every result of the kernel is a bf16 tensor (cuda_math="bf16" may apply)."""
    return bool(node.results) and all(
        isinstance(r.type, TensorType) and r.type.dtype == DType.bf16 for r in node.results)


def _scaled(x: Value) -> tuple[Value, float]:
    """x = y * C (C a positive number) as (y, C), else (x, 1.0)."""
    m = x.node
    if m is not None and m.op == "prims.mul" and len(m.args) == 2:
        y = [a for a in m.args if isinstance(a, Value)]
        k = [a for a in m.args if isinstance(a, float) and 0 < a < 1e4]
        if len(y) == 1 and len(k) == 1:
            return y[0], k[0]
    return x, 1.0


def _erf1p(n: Node | None) -> tuple[Value, float] | None:
    """n = 1 + erf(y * C) as (y, C) (C folds into _erf1p_bf16's coefficients), else None."""
    if n is None or n.op != "prims.add" or len(n.args) != 2:
        return None
    erf = [a for a in n.args if isinstance(a, Value) and a.node is not None
           and a.node.op == "prims.erf" and isinstance(a.node.args[0], Value)]
    one = [a for a in n.args if isinstance(a, (int, float)) and not isinstance(a, bool)
           and a == 1]
    if len(erf) != 1 or len(one) != 1:
        return None
    x = erf[0].node.args[0]  # type: ignore[union-attr]
    assert isinstance(x, Value)
    return _scaled(x)


def bf16_math(n: Node, env: dict[Value, str]) -> str | None:
    """The cheaper f32 text of body op `n` under cuda_math="bf16", or None: 1 + erf(y C) (from
    y: relative error in the lower tail); a gelu's (y * 0.5) * (1 + erf(y C)) as
    y * (1 + erf(y C)) / 2 (two multiplies fewer)."""
    e = _erf1p(n)
    if e is not None:
        return f"_erf1p_bf16({env[e[0]]}, {e[1]!r})" if e[0] in env else None
    if n.op != "prims.mul" or len(n.args) != 2 or \
            not all(isinstance(a, Value) for a in n.args):
        return None
    a, b = n.args
    assert isinstance(a, Value) and isinstance(b, Value)
    for p, q in ((a, b), (b, a)):
        e = _erf1p(p.node)
        if e is not None and e[0] in env and _scaled(q) == (e[0], 0.5):
            return f"({env[e[0]]} * _gelu_phi_bf16({env[e[0]]}, {e[1]!r}))"
    return None


__all__ = ["LOWP_DEFAULT", "LOWP_MODES", "MATH_MODES", "bf16_math", "bf16_results",
           "has_lowp_values", "read_lowp", "read_math"]
