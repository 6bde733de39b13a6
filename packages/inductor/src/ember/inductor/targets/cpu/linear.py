"""`loop.linear_packed`: `x @ w.T` (or `x @ w`) for a 2-d parameter `w`, on oneDNN's packed weight.

torch.mm (what eager's and torch.compile's linear call, here MKL's sgemm) took 2-2.5× the
time of oneDNN's linear on a prepacked weight for the products of LeViT and Swin on this
AMD EPYC at one thread (6272×96×384: 5.6 vs 2.2 ms). The CPU target's rule for
`prims.matmul` (`lower_matmul`) emits, where the right operand is the transpose of a 2-d f32
graph input with concrete sizes (`F.linear`'s weight), in a graph that is not a training
forward (no `saved=` attribute: training keeps torch.mm, as eager does),

    %y = loop.extern(%x, %w, op="loop.linear_packed") : f32[M, N]

on the raw [N, K] weight; where the right operand is such a [K, N] input itself (GPT-2's
`Conv1D`: `addmm(b, x, w)`), the same with kn=true (the pack is made from `w.T`). The bias
add and a GELU after the product are folded in where nothing else reads what they fold
(linear_epilogue.py): `bias=true` with the [N] bias as a third operand, `act="gelu"` (erf), computed by
oneDNN as its bias and post-op. The call
runs oneDNN's linear on the packed `w`, cached per weight by packed.py's cache (`cached_pack`: repacked when the weight's version counter or data
pointer changes, Parameters only), where `w` is an `nn.Parameter` on the CPU in f32, `x` is
contiguous, autograd does not need the product (grad mode off or `w` not requiring grad), the
weight is not changing every call (`changing_weight`: training) and the product has at least
SMALL_LINEAR multiply-adds (oneDNN's ~12 us per-call setup is more than a small product);
otherwise it is `torch.mm(x, w.t())` (kn: `torch.mm(x, w)`), what the plain extern computes
(with a bias: `torch.addmm(b, x, ...)`, eager's linear; then eager's GELU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ember.inductor.indexing import ivar
from ember.inductor.lowering import View, _Lowering
from ember.inductor.targets.cpu.linear_epilogue import ACTIVATIONS, linear_epilogue
from ember.inductor.targets.cpu.packed import cached_pack, changing_weight, f32_on_cpu
from ember.inductor.wrapper import register_binder
from ember.ir import (
    Arg,
    DType,
    InferContext,
    Interpreter,
    Node,
    OpDef,
    OpTypeError,
    TensorType,
    Type,
    Value,
    default_registry,
)

LINEAR_OP = "loop.linear_packed"

# oneDNN's packed linear against torch.mm (MKL sgemm) on the 2-core EPYC, 1 thread, min of 7
# (session 8): mm 0.21-0.46x oneDNN's time up to 0.13M multiply-adds (1x64x64 2.7 vs 12.4 us),
# 0.87x at 0.52M, 1.2x at 1.05M, 1.5x at 2.1M, 2-2.5x from 7M (LeViT's 32x384x768 221 vs
# 106 us, Swin's 6272x96x384 5608 vs 2248 us)
SMALL_LINEAR = 1 << 20

_ONEDNN = torch.backends.mkldnn.is_available() \
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


_USAGE = (f"{LINEAR_OP} takes x [M, K], w [N, K] (kn=true: w [K, N]) and, with bias=true, "
          f"b [N], all of one dtype; act= is one of {sorted(ACTIVATIONS)}")


def _attrs(kw: Mapping[str, Any]) -> tuple[bool, bool, str | None]:
    """The kn=, bias= (false when absent) and act= (None) attributes; refuses any other."""
    kn, bias, act = kw.get("kn", False), kw.get("bias", False), kw.get("act")
    if kn.__class__ is not bool or bias.__class__ is not bool \
            or (act is not None and act not in ACTIVATIONS) or set(kw) - {"kn", "bias", "act"}:
        raise OpTypeError(_USAGE)
    return bool(kn), bool(bias), act


def _infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    kn, bias, _ = _attrs(kw)
    if len(args) != 2 + bias:
        raise OpTypeError(_USAGE)
    x, w = args[0], args[1]
    if not (isinstance(x, Value) and isinstance(w, Value) and isinstance(x.type, TensorType)
            and isinstance(w.type, TensorType) and x.type.rank == 2 and w.type.rank == 2
            and x.type.dtype == w.type.dtype and x.type.shape[1] == w.type.shape[1 - kn]):
        raise OpTypeError(_USAGE)
    n = w.type.shape[kn]
    b = args[2] if bias else None
    if b is not None and not (isinstance(b, Value) and isinstance(b.type, TensorType)
                              and list(b.type.shape) == [n] and b.type.dtype == x.type.dtype):
        raise OpTypeError(_USAGE)
    return [TensorType(x.type.dtype, (x.type.shape[0], n), None, x.type.device)]


def _packed_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """oneDNN's packed weight serves this call (module docstring)."""
    return _ONEDNN and isinstance(w, torch.nn.Parameter) and f32_on_cpu(x, w) \
        and x.shape[0] * w.numel() >= SMALL_LINEAR and x.is_contiguous() \
        and not (w.requires_grad and torch.is_grad_enabled()) and not changing_weight(w)


def _pack(w: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)


def _pack_kn(w: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.ops.mkldnn._reorder_linear_weight(w.detach().t().contiguous(), None)


# act= -> oneDNN's post-op (_linear_pointwise's attr and algorithm) and eager's function
_POST_OPS: dict[str | None, tuple[str, str]] = {
    None: ("none", ""), "gelu": ("gelu", "none")}
_EAGER: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    None: lambda y: y, "gelu": torch.nn.functional.gelu}


def bind(kw: Mapping[str, Any]) -> Callable[..., torch.Tensor]:
    """The generated wrapper's call of the op (wrapper.register_binder): a callable of x, w
    (and b) returning act(x @ w.T + b), contiguous; oneDNN's linear on the cached packed `w`
    (bias and activation as its bias and post-op) where it serves, else torch's addmm (or mm)
    and eager's activation."""
    kn, _, act = _attrs(kw)
    attr, algorithm = _POST_OPS[act]
    eager = _EAGER[act]
    key = (LINEAR_OP, "kn") if kn else (LINEAR_OP,)
    pack = _pack_kn if kn else _pack

    def call(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        if _packed_ok(x, w):
            y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x, cached_pack(w, key, pack(w)), None if b is None else b.contiguous(), attr,
                [], algorithm)
            return y
        wt = w if kn else w.t()
        return eager(torch.mm(x, wt) if b is None else torch.addmm(b, x, wt))
    return call


linear = bind({})  # x @ w.T
linear_kn = bind({"kn": True})  # x @ w for a [K, N] `w` (GPT-2's Conv1D), packed from w.T


def _run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    return bind(kw)(*args)


def _parameter_weight(lw: _Lowering, b: Value) -> tuple[Value, bool] | None:
    """The 2-d graph input `w` (a parameter as it is) that `b` is the transpose of (w, False),
    or is itself (b, True: kn=true), if so."""
    lazy = lw.env.get(b)
    if isinstance(lazy, View) and lazy.index == (ivar(1), ivar(0)):
        w, kn = lazy.src, False
    elif lazy is None:
        w, kn = b, True
    else:
        return None
    wt = w.type
    if w not in lw.g.params or lw.env.get(w, w) is not w or not isinstance(wt, TensorType) \
            or wt.rank != 2 or wt.dtype != DType.f32 \
            or not all(isinstance(d, int) for d in wt.shape):
        return None
    return w, kn


def lower_matmul(lw: _Lowering, n: Node) -> None:
    """`prims.matmul(x, w.T)` or `prims.matmul(x, w)` with `w` a 2-d f32 graph input:
    `loop.linear_packed` (kn=true for the latter); any other matmul: the plain extern."""
    x, b = n.args[0], n.args[1]
    # a training forward (values saved for its backward) keeps torch.mm: its weights change
    # every step, so each pack would serve one call
    found = _parameter_weight(lw, b) if "saved" not in lw.g.attrs \
        and isinstance(b, Value) and isinstance(x, Value) \
        and isinstance(x.type, TensorType) and x.type.rank == 2 and len(n.results) == 1 \
        and x.type.dtype == DType.f32 else None
    if found is None:
        lw.passthrough(n, n.op)
        return
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    w, kn = found
    res = n.results[0]
    sizes = [*x.type.shape, w.type.shape[kn]] if isinstance(w.type, TensorType) else []
    # (symbolic rows: 0, no activation folded)
    macs = sizes[0] * sizes[1] * sizes[2] if len(sizes) == 3 \
        and all(isinstance(d, int) for d in sizes) else 0
    epi = linear_epilogue(lw, n, activation=macs >= SMALL_LINEAR)
    lw.folded.update(epi.folded)
    lw.b.taken.discard(res.name)
    kw: dict[str, Arg] = {"op": LINEAR_OP, **({"kn": True} if kn else {}),
                          **({"bias": True} if epi.bias is not None else {}),
                          **({"act": epi.act} if epi.act is not None else {})}
    args = [lw.extern_operand(x), w]
    if epi.bias is not None:
        args.append(lw.extern_operand(epi.bias))
    lw.env[res] = lw.b.emit("loop.extern", args, kw, types=[res.type], names=[res.name],
                            loc=n.loc)[0]


LINEAR_OPDEF = OpDef(LINEAR_OP, "x [M, K] times the transpose of a [N, K] weight (kn=true: "
                     "times a [K, N] one), plus a [N] bias (bias=true), then act= (gelu: "
                     "erf); oneDNN's packed weight cached on the weight (an extern's "
                     "op)", _infer, _run,
                     aliasing="fresh")
if default_registry().lookup(LINEAR_OP) is None:
    default_registry().register(LINEAR_OPDEF)
register_binder(LINEAR_OP, bind)

__all__ = ["LINEAR_OP", "SMALL_LINEAR", "linear", "linear_kn", "lower_matmul"]
