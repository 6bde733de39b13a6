"""`loop.conv2d_packed`: the channels-last convolution on a prepacked, BatchNorm-folded weight.

oneDNN computes a convolution on its own blocked weight layout; handed a plain OIHW (or
channels-last) weight, it reorders it on every call. For the deep layers of a CNN that reorder
costs more than the convolution (2 threads, batch 2: a 512-channel 3×3 layer at 7×7 takes
~24 ms with the reorder, ~4 ms on a packed weight). TorchInductor avoids it only under
`freezing`, treating the weights as constants. This op keeps the weights live:

    %y = loop.extern(%x_nhwc, %w, %a, %b, op="loop.conv2d_packed", scale=true, bias=true,
                     relu=false, stride=, padding=, dilation=, groups=) : f32[N, H, W, O]

computes `conv(x, w * a[o]) + b[o]` (then ReLU: torch's NaN-keeping relu_, in place, when
relu=true; with relu_max=c, torch's clamp_(y, 0, c), NaN kept too: ReLU6; silu=true:
torch's silu_, eager's own SiLU kernel; hardswish=true: torch's hardswish_; residual=true: an NHWC residual operand added before
the activation, by oneDNN's binary add post-op as it writes the result; into_residual=true,
set by plan-buffers where the residual is the graph's own buffer dying there (buffers.py's
INTO_FORMS): added into the residual's storage, which becomes the result, instead of a new
output), where the packed `w * a` is cached per weight tensor (`_PACKS`, dropped when the
weight dies) while the weight's version counter and data pointer stay the same (the
packed-from storage is held, so a freed storage's address cannot come back under
`w.data = ...`), under the input's size, the convolution's attributes and the bytes of `a`
(`a` is BatchNorm's rsqrt(var + eps) * gamma, a [O] vector recomputed every call). An in-place update of
the weight (an optimizer step, `load_state_dict`, `copy_` under no_grad) bumps its version and
repacks; a write that bypasses the version counter (`w.data.copy_(...)`) is not seen — the
lowering (conv.py) uses this op only for weights that are graph inputs, and the cache holds
only `nn.Parameter`s (any other tensor is packed per call, never cached: a planned buffer can
hold new values under the same version). A Parameter that changed before each of its last
`CHANGING` calls (training: an optimizer step between forwards) is used unpacked, since each pack
would serve one call; once it stops changing it is packed again. Without oneDNN it is
`torch.convolution`.

A pack is also keyed by the thread count it was made under (`torch.get_num_threads()`):
oneDNN picks its convolution's blocking, and so the weight layout it expects, by the thread
count too, and a convolution handed a weight packed for another layout reorders it on every
call with its slow generic reorder (`simple:any` in ONEDNN_VERBOSE). On the 2-core AVX-512 Xeon
(oneDNN 3.12), 3 of resnet50's 23 convolution shapes pack differently at 1 and 16 threads
(256->1024 1x1 at 14x14: Acdb48a vs Acdb64a); run at 1 thread on a 16-thread pack they took
33 / 65 / 122 ms against 3.0 / 5.2 / 3.2 ms on their own pack. Each count keeps its packs (a
model run at two counts holds two sets, within MAX_ENTRIES), so alternating counts never repacks.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.inductor.buffers import INTO_FORMS
from ember.inductor.wrapper import register_binder
from ember.ir import (
    Arg,
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

PACKED_OP = "loop.conv2d_packed"
_CONV = ("stride", "padding", "dilation", "groups")
MAX_ENTRIES = 8  # per weight: a weight shared by convolutions of other sizes or scales


@dataclass
class _Packs:
    """The packed forms of one weight tensor, valid while its version and data pointer are
    `state`: (input size, convolution attributes, the scale's bytes) -> packed weight."""
    ref: weakref.ref[torch.Tensor]
    state: tuple[int, int]
    # the packed-from data (a detached alias): held so that, after `w.data = ...` (which
    # keeps the version), no new storage can take its address and pass the pointer check
    source: torch.Tensor
    entries: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)
    # calls in a row that found the weight changed (training: every call); 0 after a reuse
    streak: int = 0


# id(weight) -> its packs; an entry drops itself when its weight dies (the weakref's
# callback runs as the weight is freed, before its id can be reused). Keyed by id, not by the
# tensor: a lookup must not build weak references or compare tensors (it runs per conv call).
_PACKS: dict[int, _Packs] = {}


def pack_threads() -> dict[int, int]:
    """The number of cached packs made under each thread count (benchmarks, tests)."""
    out: dict[int, int] = {}
    for p in _PACKS.values():
        for key in p.entries:
            out[key[-1]] = out.get(key[-1], 0) + 1
    return out


def _forget(key: int) -> Any:
    return lambda _ref: _PACKS.pop(key, None)


def is_cached(w: torch.Tensor) -> bool:
    """Whether `w` has packed forms cached (tests, debugging)."""
    p = _PACKS.get(id(w))
    return p is not None and p.ref() is w and bool(p.entries)


def _operands(args: Sequence[Any], kw: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """x, w, a (or None), b (or None) by the op's scale=/bias= flags (then the residual, if
    residual=true: args[-1])."""
    scale, bias, relu = kw.get("scale", False), kw.get("bias", False), kw.get("relu", False)
    res = kw.get("residual", False)
    hi = kw.get("relu_max")
    if scale.__class__ is not bool or bias.__class__ is not bool \
            or relu.__class__ is not bool or res.__class__ is not bool \
            or len(args) != 2 + scale + bias + res \
            or (hi is not None and (hi.__class__ is not float or not relu or not hi >= 0)) \
            or kw.get("silu", False).__class__ is not bool or (relu and kw.get("silu")) \
            or kw.get("hardswish", False).__class__ is not bool \
            or (kw.get("hardswish") and (relu or kw.get("silu"))) \
            or kw.get("into_residual", False).__class__ is not bool \
            or (kw.get("into_residual") and not res):
        raise OpTypeError(f"{PACKED_OP} takes an NHWC input, an OIHW weight, then a [O] scale "
                          f"if scale=true and a [O] bias if bias=true (scale=, bias=, relu= "
                          f"are true or false; relu_max=, with relu=true, a float >= 0; silu= true or "
                          f"false, not with relu=true; hardswish= likewise, not with silu=true either), then the NHWC residual if "
                          f"residual=true (into_residual= true or false, true only with it)")
    rest = list(args[2:len(args) - res])
    a = rest.pop(0) if kw.get("scale") else None
    b = rest.pop(0) if kw.get("bias") else None
    return args[0], args[1], a, b


def _infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    x, w, a, b = _operands(args, kw)
    nhwc = ctx.registry.lookup("loop.conv2d_nhwc") if ctx.registry else None
    assert nhwc is not None
    t = nhwc.infer(ctx, [x, w] + ([b] if b is not None else []),
                   {k: v for k, v in kw.items() if k in _CONV})[0]
    assert isinstance(t, TensorType)
    r = args[-1] if kw.get("residual") else None
    if r is not None and not (isinstance(r, Value) and isinstance(r.type, TensorType)
                              and list(r.type.shape) == list(t.shape)
                              and r.type.dtype == t.dtype):
        raise OpTypeError(f"{PACKED_OP}: the residual is an NHWC tensor of the result's shape")
    if a is not None and not (isinstance(a, Value) and isinstance(a.type, TensorType)
                              and list(a.type.shape) == [t.shape[3]]):
        raise OpTypeError(f"{PACKED_OP}: the scale has one value per output channel")
    return [t]


# oneDNN's packing is there (checked once: it is per build, and _run asks on every call)
_ONEDNN = torch.backends.mkldnn.is_available() \
    and hasattr(torch.ops.mkldnn, "_reorder_convolution_weight")
# the convolution's overloads, resolved once (a call through the op packet resolves its
# overload on every call); `_INTO`: the in-place binary form, which adds into `other`
_CONV_OPS: Any = torch.ops.mkldnn if _ONEDNN else None
_PLAIN: Any = _CONV_OPS._convolution_pointwise.default if _CONV_OPS is not None else None
_BINARY: Any = _CONV_OPS._convolution_pointwise.binary if _CONV_OPS is not None else None
_INTO: Any = _CONV_OPS._convolution_pointwise_.binary \
    if _CONV_OPS is not None and hasattr(_CONV_OPS, "_convolution_pointwise_") else None


_F32 = torch.float32


def f32_on_cpu(x: torch.Tensor, w: torch.Tensor) -> bool:
    """`x` and `w` are f32 tensors on the CPU: what oneDNN's packed weights serve (these
    convolutions; linear.py's products)."""
    # (`is`: dtypes are singletons; is_cpu, where .device builds a device object: 0.8 of
    # this check's 2.4 us on a loaded core)
    return x.dtype is _F32 and w.dtype is _F32 and x.is_cpu and w.is_cpu


def _mkldnn(x: torch.Tensor, w: torch.Tensor) -> bool:
    return _ONEDNN and f32_on_cpu(x, w)


def _scaled(w: torch.Tensor, a: torch.Tensor | None) -> torch.Tensor:
    return w if a is None else w * a.reshape(-1, *([1] * (w.dim() - 1)))


def packed_weight(w: torch.Tensor, a: torch.Tensor | None, size: Sequence[int],
                  kw: Mapping[str, Any]) -> torch.Tensor:
    """oneDNN's packed `w * a[o]` for an NCHW input of `size`: cached for a Parameter (module
    docstring), packed afresh for any other tensor. The scale is compared by its bytes (a NaN
    matches itself, -0.0 does not match 0.0: equal bytes pack to the same weight). With
    size=[] (`_matmul`): the [I, O] matrix `(w * a[o]).T` of a 1x1 convolution instead."""
    return _packed(w, a, tuple(size), _attrs(kw), kw)


def _attrs(kw: Mapping[str, Any]) -> tuple[Any, ...]:
    """The convolution attributes a packed weight depends on, as a cache key's part."""
    return (*kw["stride"], *kw["padding"], *kw["dilation"], kw.get("groups", 1))


def _packed(w: torch.Tensor, a: torch.Tensor | None, size: tuple[int, ...],
            attrs: tuple[Any, ...], kw: Mapping[str, Any]) -> torch.Tensor:
    def make() -> torch.Tensor:
        if not size:  # the 1x1 convolution's matrix, [I, O]
            return _scaled(w, a).reshape(w.shape[0], w.shape[1]).t()
        out: torch.Tensor = torch.ops.mkldnn._reorder_convolution_weight(
            _scaled(w, a).contiguous(), list(kw["padding"]), list(kw["stride"]),
            list(kw["dilation"]), int(kw.get("groups", 1)), list(size))
        return out
    key = (size, attrs, _bytes(a)) if isinstance(w, torch.nn.Parameter) else ()
    return cached_pack(w, key, make)


def _bytes(a: torch.Tensor | None) -> bytes | None:
    """The scale's bytes, a pack's key part (numpy() without detach() where no grad is
    recorded: ~1 us less a call)."""
    if a is None:
        return None
    return (a.detach() if a.requires_grad else a).numpy().tobytes()


def cached_pack(w: torch.Tensor, key: tuple[Any, ...],
                make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`make()` (a packed form of `w`, made under no_grad) cached under `key` and the thread
    count while `w`, an `nn.Parameter`, keeps its version and data pointer; for any other
    tensor made per call. (linear.py's packed matrix products share this cache: their keys
    differ.)"""
    p: _Packs | None = None
    if isinstance(w, torch.nn.Parameter):
        # oneDNN's layout depends on the thread count (module docstring): a count's own pack
        key = (key, torch.get_num_threads())
        state = (w._version, w.data_ptr())
        p = _PACKS.get(id(w))
        if p is None or p.ref() is not w or p.state != state:  # new, or the weight changed
            streak = p.streak + 1 if p is not None and p.ref() is w else 0
            p = _PACKS[id(w)] = _Packs(weakref.ref(w, _forget(id(w))), state, w.detach(),
                                       streak=streak)
        hit = p.entries.get(key)
        if hit is not None:
            p.streak = 0
            return hit
    with torch.no_grad():  # packing is not part of any autograd graph
        packed = make()
    if p is not None:
        if len(p.entries) >= MAX_ENTRIES:
            p.entries.clear()
        p.entries[key] = packed
    return packed


# A 1x1 convolution on few pixels is a small matrix product: oneDNN's per-call setup
# (~20-40 us) dwarfs it (a squeeze-excitation's [N, C, 1, 1] convolutions: ~300 us each in
# efficientnet_b0 vs ~10 us as addmm). Up to this many multiply-adds (or 16 rows) it runs as
# addmm on the NHWC rows. Measured on the 2-core EPYC at 1 thread (session 8, oneDNN on the
# packed weight against addmm, min of 3x30 calls): addmm 0.33-0.74x oneDNN's time up to 0.9M,
# 0.91x at 1.3M, 1.09x at 1.8M; beyond, oneDNN took about half: ShuffleNet's 116 channels at
# 14x14 (5.3M) 67 vs 110 us, GhostNet's 16->8 at 112x112 (3.2M) 94 vs 332 us. Against the
# 9M of session 7 (whose sweep had found addmm faster up to 9M), interleaved in one process:
# ghostnet_100 15.4 -> 14.0 ms a call, shufflenet_v2 10.9 -> 9.2, regnet_y_400mf unchanged.
SMALL_MATMUL = 3 << 19


def _matmul(x: torch.Tensor, w: torch.Tensor, kw: Mapping[str, Any]) -> bool:
    """The convolution is a small matrix product over the NHWC rows (1x1, stride 1, no
    padding, one group, few rows)."""
    return kw.get("groups", 1) == 1 and list(kw["stride"]) == [1, 1] \
        and list(kw["padding"]) == [0, 0] and _small(x, w)


def _small(x: torch.Tensor, w: torch.Tensor) -> bool:
    """`_matmul` past the attributes (stride 1, no padding, one group: `bind` checks those
    once): a 1x1 weight on few enough rows."""
    if w.dim() != 4 or w.shape[2] != 1 or w.shape[3] != 1 or x.dim() != 4 \
            or x.dtype != w.dtype:
        return False
    rows = x.shape[0] * x.shape[1] * x.shape[2]
    return rows <= 16 or rows * w.shape[0] * w.shape[1] <= SMALL_MATMUL


# A weight that changed before each of this many calls in a row (an optimizer step between
# training steps) is no longer packed: each pack would be used once, and the reorder plus the
# cache's bookkeeping cost more than oneDNN's own handling of a plain weight (conv+BN training
# at 1 thread: 3->16 channels 0.41 vs 0.22 ms, 16->32 1.98 vs 1.60 ms per call)
CHANGING = 2


def changing_weight(w: torch.Tensor) -> bool:
    """`w` (a cached Parameter) changed again after changing before each of its last CHANGING
    calls: use it unpacked. Its new state is noted, so once it stops changing (evaluation
    after training) the next call packs it again."""
    p = _PACKS.get(id(w))
    if p is None or p.ref() is not w or not isinstance(w, torch.nn.Parameter):
        return False
    state = (w._version, w.data_ptr())
    if p.state == state or p.streak < CHANGING:
        return False
    p.state, p.source, p.streak = state, w.detach(), p.streak + 1
    p.entries.clear()
    return True


def bind(kw: Mapping[str, Any]) -> Callable[..., torch.Tensor]:
    """The op with its attributes `kw` checked and converted once: a callable of the operands
    (x, w, then a, b and the residual as the flags say) returning the contiguous NHWC result.
    The generated wrapper binds each of its convolutions once (wrapper.register_binder), so a
    call pays neither the attribute checks nor the argument list and dict the reference takes
    (~4 us of the ~9 us a call spent over oneDNN's own, alone; ghostnet_100's 95 convolutions
    ~0.8 ms of a ~19 ms call). With into_residual=true (plan-buffers: the residual dies here,
    `_into_residual`) oneDNN adds the convolution into the residual's own storage, which is
    the result then: no new output (a fresh large one is mmap'd pages, faulted in as oneDNN
    writes them and unmapped when freed); a residual that is not contiguous NHWC, or a call
    not on oneDNN, takes the out-of-place path (the result is then new storage)."""
    scale, bias, res = (kw.get(k) is True for k in ("scale", "bias", "residual"))
    _operands([None] * (2 + scale + bias + res), kw)  # refuses bad attributes now
    stride, padding = list(kw["stride"]), list(kw["padding"])
    dilation, groups = list(kw["dilation"]), int(kw.get("groups", 1))
    attrs = _attrs(kw)
    one = stride == [1, 1] and padding == [0, 0] and groups == 1
    act = _activation_fn(kw)
    into = kw.get("into_residual") is True and _INTO is not None

    def call(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        a = rest[0] if scale else None
        b = rest[scale] if bias else None
        r = rest[-1] if res else None
        # one lookup of the weight's packs serves both questions below where it is unchanged
        # (the common case): not changing (changing_weight's own first test), and its pack
        # for this call, if made, is in p.entries (cached_pack's lookup)
        p = _PACKS.get(id(w))
        same = p is not None and p.ref() is w and p.state == (w._version, w.data_ptr())
        if not same and changing_weight(w):  # training: oneDNN on the plain weight
            with torch.no_grad():
                y = torch.convolution(x.permute(0, 3, 1, 2), _scaled(w, a), b, stride,
                                      padding, dilation, False, [0, 0], groups)
                if r is not None:
                    y = y.add_(r.permute(0, 3, 1, 2))
            return act(y).permute(0, 2, 3, 1).contiguous()
        if one and _small(x, w):  # NHWC rows times the [I, O] matrix: the NHWC result as it is
            rows = x.reshape(-1, x.shape[3])
            m = _lookup(p if same else None, w, a, (), attrs, kw)  # (made under no_grad)
            y = torch.mm(rows, m) if b is None else torch.addmm(b, rows, m)
            if r is not None:
                y = y.add_(r.reshape(y.shape))
            return act(y).view(x.shape[0], x.shape[1], x.shape[2], w.shape[0])
        xc = x.permute(0, 3, 1, 2)  # NCHW seen with channels-last strides
        if not _mkldnn(x, w):
            with torch.no_grad():
                y = torch.convolution(xc, _scaled(w, a), b, stride, padding, dilation, False,
                                      [0, 0], groups)
            if r is not None:
                y = y.add_(r.permute(0, 3, 1, 2))
            return act(y).permute(0, 2, 3, 1).contiguous()
        pw = _lookup(p if same else None, w, a, tuple(xc.shape), attrs, kw)
        if r is None:
            y = _PLAIN(xc, pw, b, padding, stride, dilation, groups, "none", [], "")
        elif into and r.is_contiguous():  # added into the dying residual: its storage
            y = _INTO(r.permute(0, 3, 1, 2), xc, pw, b, padding, stride, dilation, groups,
                      "add", None, None, [], None)
        else:  # oneDNN's binary add post-op: one pass
            y = _BINARY(xc, r.permute(0, 3, 1, 2), pw, b, padding, stride, dilation, groups,
                        "add", None, None, [], None)
        return act(y).permute(0, 2, 3, 1).contiguous()
    return call


def _lookup(p: _Packs | None, w: torch.Tensor, a: torch.Tensor | None, size: tuple[int, ...],
            attrs: tuple[Any, ...], kw: Mapping[str, Any]) -> torch.Tensor:
    """`_packed(w, a, size, attrs, kw)`, looked up in `p` first: the packs of `w`, unchanged
    (the binder checked it), or None."""
    if p is not None:
        hit = p.entries.get(((size, attrs, _bytes(a)), torch.get_num_threads()))
        if hit is not None:
            p.streak = 0  # (a reuse: cached_pack's hit)
            return hit
    return _packed(w, a, size, attrs, kw)


def _into_residual(n: Node) -> tuple[int, str] | None:
    """plan-buffers' in-place form (buffers.INTO_FORMS): a convolution with a residual may
    write its result over the residual (the last operand), told by into_residual=true."""
    return (len(n.args) - 1, "into_residual") if n.kwargs.get("residual") is True \
        and n.kwargs.get("into_residual") is not True and _INTO is not None else None


def _run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    _operands(args, kw)
    return bind(kw)(*args)


def _activation_fn(kw: Mapping[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """relu=, relu_max=, silu=, hardswish= as one in-place function of the result."""
    hi = kw.get("relu_max")
    if hi is not None:  # ReLU6: torch's clamp keeps NaN (oneDNN's hardtanh post-op drops it)
        return lambda y: torch.clamp_(y, 0.0, hi)
    if kw.get("relu"):  # torch's relu keeps NaN (oneDNN's post-op would map it to 0)
        return torch.relu_
    if kw.get("silu"):
        return lambda y: torch.nn.functional.silu(y, inplace=True)
    if kw.get("hardswish"):
        return lambda y: torch.nn.functional.hardswish(y, inplace=True)
    return lambda y: y


PACKED_OPDEF = OpDef(PACKED_OP, "a 2-d convolution of an NHWC buffer with an OIHW weight "
                     "scaled per output channel (scale=true: a [O] operand) plus a bias "
                     "(bias=true), relu= (relu_max=: a clamp to [0, relu_max]), silu= or hardswish=; oneDNN's "
                     "packed weight cached on the weight (an extern's op; NHWC result)", _infer, _run, aliasing="fresh")
if default_registry().lookup(PACKED_OP) is None:
    default_registry().register(PACKED_OPDEF)
register_binder(PACKED_OP, bind)
INTO_FORMS[PACKED_OP] = _into_residual

__all__ = ["PACKED_OP", "cached_pack", "changing_weight", "f32_on_cpu", "is_cached",
           "pack_threads", "packed_weight"]
