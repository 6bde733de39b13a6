"""VJP rules of matmul, convolution, the indexing prims, and ops kept whole as externs.

Convolution's gradients are torch's own backward kernel, `aten.convolution_backward`, as
extern calls (as AOTAutograd and TorchInductor keep them): one call per gradient, each with an
output mask for just that gradient, so the joint graph's dead code elimination drops the call a
graph does not need (the first layer's input gradient), and the two calls cost what one call
for both does. Written in prims (as
ember first did: the input gradient a stride-dilated, padded convolution of the cotangent with
the weight's channels swapped per group and its taps reversed; the weight gradient a
convolution of the input, batch as channels, with the cotangent), the weight gradient is a
convolution with an image-sized kernel, which oneDNN ran 2-5x slower than its backward kernel
(conv+BN training on 2 cores), and both needed transposed copies of the activations. Fused CPU
attention (kept whole by `decompose{keep_attention=true}`) differentiates
through torch's own fused backward kernel, an extern call like the forward.
"""

from __future__ import annotations

from typing import Any

from ember.autograd.vjp.core import Grad, VJPContext, attr_list, is_float_tensor, vjp
from ember.ir import Node, Value
from ember.ir.expr import Dim, as_sympy, simplify_dim


def _swap_last(ctx: VJPContext, x: Value) -> Value:
    r = len(ctx.shape(x))
    return ctx.p("permute", x, dims=[*range(r - 2), r - 1, r - 2])


@vjp("prims.matmul")
def _matmul(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    a, b = node.args
    ct = cts[0]
    assert isinstance(a, Value) and isinstance(b, Value) and ct is not None
    return [ctx.p("matmul", ct, _swap_last(ctx, b)), ctx.p("matmul", _swap_last(ctx, a), ct)]


def _is_zero(d: Dim) -> bool:
    return isinstance(d, int) and d == 0


@vjp("prims.convolution")
def _convolution(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, w = node.args
    ct = cts[0]
    assert isinstance(x, Value) and isinstance(w, Value) and ct is not None
    xs, ws, cs = ctx.shape(x), ctx.shape(w), ctx.shape(ct)
    if any(_is_zero(d) for d in (*xs, *ws, *cs)):
        return [ctx.zeros(ctx.t(x)), ctx.zeros(ctx.t(w))]
    return [_conv_backward(ctx, ct, x, w, node, [True, False, False]),
            _conv_backward(ctx, ct, x, w, node, [False, True, False])]


def _conv_backward(ctx: VJPContext, ct: Value, x: Value, w: Value, node: Node,
                   mask: list[bool]) -> Value:
    """One gradient of prims.convolution from torch's backward kernel (`mask` picks it)."""
    stride, padding, dilation = (attr_list(node, k) for k in ("stride", "padding", "dilation"))
    n = len(ctx.shape(x)) - 2
    (g,) = ctx.op(CONV_BACKWARD, ct, x, w, None, stride, padding, dilation, False, [0] * n,
                  node.kwargs.get("groups", 1), mask)
    return g


# ---- indexing ------------------------------------------------------------------------------

@vjp("prims.gather")
def _gather(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, idx = node.args
    ct = cts[0]
    assert isinstance(x, Value) and isinstance(idx, Value) and ct is not None
    dim = node.kwargs["dim"]
    assert isinstance(dim, int)
    xs, js = ctx.shape(x), ctx.shape(idx)
    if len(xs) == len(js) > dim >= 0 and js[dim] == 1 and all(
            a == b for d, (a, b) in enumerate(zip(xs, js, strict=True)) if d != dim):
        # one index per row along `dim` (cross-entropy's pick of the target's log-probability):
        # a one-hot select, pointwise, so it fuses into its reader instead of a scatter into a
        # dense zeros buffer (the same values: 0 + ct is ct, also for NaN and inf)
        keep = [d for d in range(len(xs)) if d != dim]
        cols = ctx.bcast(ctx.p("iota", length=xs[dim], start=0, step=1, dtype=ctx.t(idx).dtype,
                               device=ctx.t(x).device), xs, [dim])
        hit = ctx.p("eq", cols, ctx.bcast(ctx.p("squeeze", idx, dims=[dim]), xs, keep))
        spread = ctx.bcast(ctx.p("squeeze", ct, dims=[dim]), xs, keep)
        return [ctx.where(hit, spread, 0.0), None]
    return [ctx.p("scatter_add", ctx.zeros(ctx.t(x)), idx, ct, dim=dim), None]


def _src_grad(ctx: VJPContext, ct: Value, idx: Value, src: Value, dim: Any) -> Value:
    """src's cotangent: the cotangent at the indexed places, zero-padded to src's shape where
    src is larger than the index (its extra elements are not used)."""
    g = ctx.p("gather", ct, idx, dim=dim)
    ss, gs = ctx.shape(src), ctx.shape(g)
    if all(a == b for a, b in zip(ss, gs, strict=True)):
        return g
    config = [[0, simplify_dim(as_sympy(a) - as_sympy(b)), 0] for a, b in zip(ss, gs,
                                                                              strict=True)]
    return ctx.p("pad", g, 0.0, config=config)


@vjp("prims.scatter")
def _scatter(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    # torch: self gets grad with the written places zeroed; src gets grad gathered (every
    # src element, also one a duplicate index overwrote)
    x, idx, src = node.args
    ct = cts[0]
    assert isinstance(idx, Value) and isinstance(src, Value) and ct is not None
    dim = node.kwargs["dim"]
    gx = ctx.p("scatter", ct, idx, ctx.full(ctx.t(ct), 0.0, shape=ctx.shape(idx)), dim=dim)
    return [gx, None, _src_grad(ctx, ct, idx, src, dim)]


@vjp("prims.scatter_add")
def _scatter_add(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, idx, src = node.args
    ct = cts[0]
    assert isinstance(idx, Value) and isinstance(src, Value) and ct is not None
    return [ct, None, _src_grad(ctx, ct, idx, src, node.kwargs["dim"])]


# ---- externs -------------------------------------------------------------------------------

CONV_BACKWARD = "aten.convolution_backward.default"
FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"


@vjp(FLASH_CPU)
def _flash_cpu(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    # logsumexp (result 1) is not differentiable in torch either
    args, kw = node.args, node.kwargs
    q, k, v = args[:3]
    ct = cts[0]
    assert ct is not None
    dropout = args[3] if len(args) > 3 else kw.get("dropout_p", 0.0)
    causal = args[4] if len(args) > 4 else kw.get("is_causal", False)
    if dropout not in (0, 0.0, None):
        raise ValueError(f"{FLASH_CPU} with dropout_p={dropout} has no VJP rule (eager's "
                         f"random numbers cannot be replayed); decompose it instead")
    out, lse = node.results
    extra = {key: kw[key] for key in ("attn_mask", "scale") if key in kw}
    gq, gk, gv = ctx.op(FLASH_CPU.replace(".default", "_backward.default"), ct, q, k, v, out,
                        lse, 0.0, causal, **extra)
    grads: list[Grad] = [gq, gk, gv]
    grads += [None] * (len(args) - 3)
    return [g if is_float_tensor(a) else None for a, g in zip(args, grads, strict=True)]
