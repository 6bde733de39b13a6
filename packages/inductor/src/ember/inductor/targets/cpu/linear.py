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
weight is not changing every call (`changing_weight`: training) and `use_packed` says the
product is large enough for the thread count at the call (oneDNN's ~12-25 us per-call setup is
more than a small product: SMALL_LINEAR multiply-adds at 1-2 threads, more and a large K or a
bias above); otherwise it is `torch.mm(x, w.t())` (kn: `torch.mm(x, w)`), what the plain extern computes
(with a bias: `torch.addmm(b, x, ...)`, eager's linear; then eager's GELU).
"""

from __future__ import annotations

import weakref
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
# At more threads oneDNN's per-call setup stays (~25 us at 8-16 threads) while MKL's small
# products shrink: on the 16-core Xeon (session 12, benchmarks/device_queue/diag16.py: every
# linear of the zoo's transformers, min of 15; addmm vs oneDNN) addmm took 0.26-0.95x
# oneDNN's time for K <= 384 without a bias at 16 threads (32x256x256 12 vs 27 us, 256x256x256
# 39 vs 47, 392x128x640 55 vs 68), about the same from ~50M (6272x384x96 517 vs 532); oneDNN
# was faster from K = 512 (98x512x256 48 vs 44 us, 256x1024x256 200 vs 120, 394x3072x768 2106
# vs 1546) and, at K = 256, with a bias (addmm's separate bias pass: 256x256x256 66 vs 57 us),
# but not below ~SMALL_LINEAR * threads / 2 multiply-adds (2x768x1000 18 vs 28 us). `use_packed` is that rule above 2
# threads; of the table's 46 rows it picks the slower by more than 10% for 1 at 16 threads
# (32x768x384: 39 vs 44 us) and 6 at 8 (32x768x384, 98x256x512, 98x256x1280, 256x256x1024
# with a bias, 392x384x1536 and 394x192x768: 10-23%); 3-7 threads are not measured.
PACKED_K = 512

_ONEDNN = torch.backends.mkldnn.is_available() \
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
_F32 = torch.float32


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


def use_packed(m: int, k: int, n: int, bias: bool, threads: int) -> bool:
    """oneDNN's packed linear is the faster for an [m, k] x [k, n] product (with a bias) at
    `threads` threads (SMALL_LINEAR's and PACKED_K's measurements): at 1-2 threads from
    SMALL_LINEAR multiply-adds; above, from SMALL_LINEAR * threads / 2 and only with K >=
    PACKED_K or a bias."""
    macs = m * k * n
    if threads <= 2:
        return macs >= SMALL_LINEAR
    return 2 * macs >= SMALL_LINEAR * threads and (k >= PACKED_K or bias)


def _servable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """oneDNN's packed weight can serve this call (module docstring), whatever its size
    (`changing_weight` is asked apart: it notes the weight's state)."""
    return _ONEDNN and isinstance(w, torch.nn.Parameter) and f32_on_cpu(x, w) \
        and x.is_contiguous() and not (w.requires_grad and torch.is_grad_enabled())


def _packer(w: torch.Tensor, kn: bool) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
        w.detach().t().contiguous() if kn else w.detach(), None)
    return out


# act= -> oneDNN's post-op (_linear_pointwise's attr and algorithm) and eager's function
_POST_OPS: dict[str | None, tuple[str, str]] = {
    None: ("none", ""), "gelu": ("gelu", "none")}
_EAGER: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    None: lambda y: y, "gelu": torch.nn.functional.gelu}
_LINEAR_FN: Callable[..., torch.Tensor] | None = None
if _ONEDNN:  # the overload's C++ function itself: the packet's and overload's __call__
    _overload = torch.ops.mkldnn._linear_pointwise.default  # frames cost ~1-2 us a call
    _LINEAR_FN = getattr(_overload, "_op", _overload)


class _Gone:
    pass


_NOTHING: weakref.ref[Any] = weakref.ref(_Gone())  # a dead reference: the empty fast path
# a bound call's remembered state (`bind`): weight (weakly), rows, threads, pack (None: addmm),
# the weight's version and data pointer, its packed-from data
_State = tuple[weakref.ref[Any], int, int, torch.Tensor | None, int, int, torch.Tensor | None]
_EMPTY: _State = (_NOTHING, -1, -1, None, -1, -1, None)


def bind(kw: Mapping[str, Any]) -> Callable[..., torch.Tensor]:
    """The generated wrapper's call of the op (wrapper.register_binder): a callable of x, w
    (and b) returning act(x @ w.T + b), contiguous; oneDNN's linear on the cached packed `w`
    (bias and activation as its bias and post-op) where it serves and `use_packed` says, else
    torch's addmm (or mm) and eager's activation.

    The callable remembers its last call's weight (weakly), rows and thread count and what
    served it: a call with the same ones takes addmm at once where the size rule chose it,
    or, where the weight kept its version and data pointer, `x` is a contiguous f32 CPU
    tensor and autograd does not need the product, oneDNN on the remembered pack, skipping
    the pack cache's lookup. The pack is remembered only once the cache returned it as
    made before (which zeroes the weight's change streak, what `changing_weight` counts),
    and with its packed-from data held, so that its address cannot come back under
    `w.data = ...`; both are dropped when the weight dies."""
    kn, _, act = _attrs(kw)
    attr, algorithm = _POST_OPS[act]
    gelu = act is not None
    key = (LINEAR_OP, "kn") if kn else (LINEAR_OP,)
    mm, addmm, flinear, fgelu = torch.mm, torch.addmm, torch.nn.functional.linear, _EAGER[act]
    # the last call's (weight, weakly; rows; threads; pack or None: addmm; the weight's version
    # and data pointer; its packed-from data): one tuple, replaced whole, so that a call in
    # another Python thread reads one call's state, never a mix (the GIL passes inside
    # w.detach(): separate fields let a call remember one weight with another's pack)
    state: _State = _EMPTY

    def forget(ref: weakref.ref[Any]) -> None:  # the remembered weight died
        nonlocal state
        if ref is state[0]:
            state = _EMPTY

    def eager(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if kn:
            y = mm(x, w) if b is None else addmm(b, x, w)
        else:  # F.linear: addmm(b, x, w.t()) (mm without a bias) without a Python w.t()
            y = flinear(x, w, b)
        return fgelu(y) if gelu else y

    def slow(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, m: int,
             t: int) -> torch.Tensor:
        nonlocal state
        n = w.shape[1] if kn else w.shape[0]
        if not use_packed(m, x.shape[1], n, b is not None, t):
            state = (weakref.ref(w, forget), m, t, None, -1, -1, None)
            return eager(x, w, b)
        if not _servable(x, w) or changing_weight(w):
            return eager(x, w, b)
        made = False

        def make() -> torch.Tensor:
            nonlocal made
            made = True
            return _packer(w, kn)
        pw = cached_pack(w, key, make)
        if not made:  # a cache hit: the streak is 0, remember the pack
            state = (weakref.ref(w, forget), m, t, pw, w._version, w.data_ptr(), w.detach())
        assert _LINEAR_FN is not None
        return _LINEAR_FN(x, pw, None if b is None else b.contiguous(), attr, [], algorithm)

    def call(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        m = x.shape[0]
        t = torch.get_num_threads()
        s = state  # (one read: see `state`)
        if w is s[0]() and m == s[1] and t == s[2]:
            pw = s[3]
            if pw is None:  # addmm (eager's body: a frame less)
                if kn:
                    y = mm(x, w) if b is None else addmm(b, x, w)
                else:
                    y = flinear(x, w, b)
                return fgelu(y) if gelu else y
            if w._version == s[4] and w.data_ptr() == s[5] \
                    and x.is_contiguous() and x.dtype is _F32 and x.is_cpu \
                    and not (w.requires_grad and torch.is_grad_enabled()):
                assert _LINEAR_FN is not None
                return _LINEAR_FN(x, pw, None if b is None else b.contiguous(), attr, [],
                                  algorithm)
        return slow(x, w, b, m, t)
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
