"""The CPU target's convolution gradients channels-last: `loop.conv2d_backward_nhwc`.

A training backward's convolution gradients are torch's backward kernel,
`aten.convolution_backward` (the VJP rule in ember.autograd, one call per gradient). Handed
NCHW tensors, oneDNN runs its NCHW path, slower than channels-last (2-core EPYC, a 16->32
3x3 layer at 16x32x32, 1 thread: ~1.5 + 1.8 ms for the input and weight gradients vs ~1.4 +
1.4 ms; 2 threads: 1.5 + 1.1 vs 0.7 + 0.8 ms), and the forward's activations are NHWC
buffers already (conv.py). So, as eager does under `channels_last` and TorchInductor does on
CPU, the lowering rule here hands the kernel channels-last views: the cotangent and the
input as NHWC buffers (the buffer a value already is a permuted view of, e.g. a saved
convolution output; else a copy kernel its pointwise producer fuses into: the BatchNorm
backward writes the cotangent NHWC directly), and the input gradient comes back as an NHWC
buffer the graph reads through a permuted view (no NCHW copy of it):

    %gi = loop.extern(%g_nhwc, %x_nhwc, %w, op="loop.conv2d_backward_nhwc", mask=[true, false],
                      stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)
        : f32[N, H, W, C]

`mask=[input, weight]` says which gradients it returns, in that order (the input gradient
NHWC, the weight gradient OIHW). Other convolution gradients (transposed, other ranks or
dtypes, a bias gradient) stay the plain extern call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ember.inductor.indexing import ivar
from ember.inductor.lowering import View, _Lowering
from ember.inductor.targets.cpu.conv import _nhwc_buffer
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

BACKWARD_OP = "loop.conv2d_backward_nhwc"


def _mask(kw: Mapping[str, Any]) -> list[bool]:
    m = kw.get("mask")
    if not isinstance(m, list) or len(m) != 2 or not all(b.__class__ is bool for b in m) \
            or not any(m):
        raise OpTypeError(f"{BACKWARD_OP}: mask= is [input, weight], two booleans, one true "
                          f"at least")
    return [bool(b) for b in m]


def _infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    mask = _mask(kw)
    if len(args) != 3 or not all(isinstance(a, Value) and isinstance(a.type, TensorType)
                                 and a.type.rank == 4 and a.type.dtype == DType.f32
                                 for a in args):
        raise OpTypeError(f"{BACKWARD_OP} takes the NHWC cotangent, the NHWC input and the "
                          f"OIHW weight (f32, 4-d)")
    g, x, w = (a.type for a in args)  # type: ignore[union-attr]
    assert isinstance(g, TensorType) and isinstance(x, TensorType) and isinstance(w, TensorType)
    groups = kw.get("groups", 1)
    if g.shape[0] != x.shape[0] or g.shape[3] != w.shape[0] or not isinstance(groups, int) \
            or groups < 1 or (isinstance(x.shape[3], int) and isinstance(w.shape[1], int)
                              and x.shape[3] != w.shape[1] * groups):
        raise OpTypeError(f"{BACKWARD_OP}: cotangent {list(g.shape)}, input {list(x.shape)} "
                          f"and weight {list(w.shape)} (groups={groups}) do not fit")
    for k in ("stride", "padding", "dilation"):
        v = kw.get(k)
        if not isinstance(v, list) or len(v) != 2 or not all(isinstance(i, int) for i in v):
            raise OpTypeError(f"{BACKWARD_OP}: {k}= is a list of two integers")
    out: list[Type] = []
    if mask[0]:
        out.append(TensorType(x.dtype, x.shape, None, x.device))
    if mask[1]:
        out.append(TensorType(w.dtype, w.shape, None, w.device))
    return out


def _run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    g, x, w = args
    mask = _mask(kw)
    with torch.no_grad():  # a gradient is computed here, never differentiated
        gi, gw, _ = torch.ops.aten.convolution_backward(
            g.permute(0, 3, 1, 2), x.permute(0, 3, 1, 2), w, None, list(kw["stride"]),
            list(kw["padding"]), list(kw["dilation"]), False, [0, 0], int(kw.get("groups", 1)),
            [mask[0], mask[1], False])
    out = []
    if mask[0]:  # channels-last from oneDNN: this permute is contiguous, not a copy
        out.append(gi.permute(0, 2, 3, 1).contiguous())
    if mask[1]:
        out.append(gw.contiguous())
    return out[0] if len(out) == 1 else tuple(out)


BACKWARD_OPDEF = OpDef(BACKWARD_OP, "the input (NHWC) and/or weight (OIHW) gradient of a 2-d "
                       "convolution from the NHWC cotangent and input (torch's "
                       "convolution_backward on channels-last views; an extern's op)",
                       _infer, _run, aliasing="fresh")
if default_registry().lookup(BACKWARD_OP) is None:
    default_registry().register(BACKWARD_OPDEF)


def _nhwc_type(t: TensorType) -> TensorType:
    return TensorType(t.dtype, (t.shape[0], t.shape[2], t.shape[3], t.shape[1]), None,
                      t.device)


def _fits(n: Node) -> list[bool] | None:
    """The [input, weight] mask of an `aten.convolution_backward` this rule lowers: 2-d, f32,
    not transposed, no bias gradient, concrete channels and no zero sizes; else None."""
    a = list(n.args)
    if len(a) != 11 or n.kwargs:
        return None
    g, x, w, _bias, stride, padding, dilation, transposed, out_pad, groups, mask = a
    if not all(isinstance(v, Value) and isinstance(v.type, TensorType) and v.type.rank == 4
               and v.type.dtype == DType.f32 for v in (g, x, w)):
        return None
    if transposed is not False or not isinstance(groups, int) or out_pad != [0, 0] \
            or not isinstance(mask, list) or len(mask) != 3 or mask[2] is not False \
            or not any(mask[:2]) or not all(isinstance(m, bool) for m in mask):
        return None
    if not all(isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) for i in v)
               for v in (stride, padding, dilation)):
        return None
    ts = [v.type for v in (g, x, w) if isinstance(v, Value) and isinstance(v.type, TensorType)]
    sizes = [d for t in ts for d in t.shape]
    if len(ts) != 3 or 0 in sizes or not isinstance(ts[0].shape[1], int) \
            or not isinstance(ts[1].shape[1], int):
        return None
    if len(n.results) != sum(mask[:2]):
        return None
    return [bool(mask[0]), bool(mask[1])]


def lower_conv_backward(lw: _Lowering, n: Node) -> None:
    """`aten.convolution_backward` channels-last (module docstring), or the plain extern."""
    mask = _fits(n)
    if mask is None:
        lw.passthrough(n, n.op)
        return
    g, x, w = n.args[:3]
    assert isinstance(g, Value) and isinstance(x, Value) and isinstance(w, Value)
    xt, wt = x.type, w.type
    assert isinstance(xt, TensorType) and isinstance(wt, TensorType)
    i = [ivar(k) for k in range(4)]
    bufs = []
    for v in (g, x):
        b = _nhwc_buffer(lw, v, f"{v.name}.nhwc")
        assert isinstance(v.type, TensorType)
        # later readers (the other gradient's call) find the NHWC buffer, not a second copy
        lw.env[v] = View(b, (i[0], i[2], i[3], i[1]), v.type)
        bufs.append(b)
    gb, xb = bufs
    stride, padding, dilation, groups = n.args[4], n.args[5], n.args[6], n.args[9]
    kw: dict[str, Arg] = {"op": BACKWARD_OP, "mask": mask, "stride": stride,
                          "padding": padding, "dilation": dilation, "groups": groups}
    types: list[Type] = []
    if mask[0]:
        types.append(_nhwc_type(xt))
    if mask[1]:
        types.append(wt)
    names = [f"{r.name}.nhwc" if k == 0 and mask[0] else r.name
             for k, r in enumerate(n.results)]
    for r in n.results:
        lw.b.taken.discard(r.name)
    outs = lw.b.emit("loop.extern", [gb, xb, lw.extern_operand(w)], kw, types=types,
                     names=names, loc=n.loc)
    for k, (r, o) in enumerate(zip(n.results, outs, strict=True)):
        if k == 0 and mask[0]:  # the NHWC gradient read as [N, C, H, W]
            assert isinstance(r.type, TensorType)
            lw.env[r] = View(o, (i[0], i[2], i[3], i[1]), r.type)
        else:
            lw.env[r] = o


__all__ = ["BACKWARD_OP", "lower_conv_backward"]
