"""VJP rules of matmul, convolution, the indexing prims, and ops kept whole as externs.

Convolution's input gradient is a stride-dilated, padded convolution of the cotangent with the
weight's channels swapped per group and its taps reversed; its weight gradient is a convolution
of the input (batch as channels) with the cotangent, stride and dilation exchanged, cut to the
kernel size. Fused CPU attention (kept whole by `decompose{keep_attention=true}`) differentiates
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


def _mul(*xs: Dim) -> Dim:
    out: Any = 1
    for x in xs:
        out = as_sympy(out) * as_sympy(x)
    return simplify_dim(out)


def _swap01(ctx: VJPContext, x: Value) -> Value:
    return ctx.p("permute", x, dims=[1, 0, *range(2, len(ctx.shape(x)))])


def _batch_to_channels(ctx: VJPContext, x: Value, groups: int) -> Value:
    """[A, g * B, *rest] -> [B, g * A, *rest]: channel (i, b) becomes batch b, channel i * A +
    a (the input of the weight gradient: the batch is what it sums over, per group)."""
    if groups == 1:
        return _swap01(ctx, x)
    s = list(ctx.shape(x))
    b = simplify_dim(as_sympy(s[1]) / groups)
    y = ctx.p("reshape", x, shape=[s[0], groups, b, *s[2:]])
    y = ctx.p("permute", y, dims=[2, 1, 0, *range(3, len(s) + 1)])
    return ctx.p("reshape", y, shape=[b, _mul(groups, s[0]), *s[2:]])


def _transpose_groups(ctx: VJPContext, w: Value, groups: int) -> Value:
    """A weight [g * O, C, *k] as [g * C, O, *k]: each group's in and out channels swapped."""
    if groups == 1:
        return _swap01(ctx, w)
    s = list(ctx.shape(w))
    o = simplify_dim(as_sympy(s[0]) / groups)
    y = ctx.p("reshape", w, shape=[groups, o, s[1], *s[2:]])
    y = ctx.p("permute", y, dims=[0, 2, 1, *range(3, len(s) + 1)])
    return ctx.p("reshape", y, shape=[_mul(groups, s[1]), o, *s[2:]])


def _is_zero(d: Dim) -> bool:
    return isinstance(d, int) and d == 0


@vjp("prims.convolution")
def _convolution(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, w = node.args
    ct = cts[0]
    assert isinstance(x, Value) and isinstance(w, Value) and ct is not None
    kw = node.kwargs
    stride, padding, dilation = (attr_list(node, k) for k in ("stride", "padding", "dilation"))
    groups = kw.get("groups", 1)
    g = groups if isinstance(groups, int) else 1
    xs, ws, cs = ctx.shape(x), ctx.shape(w), ctx.shape(ct)
    n = len(xs) - 2
    if any(_is_zero(d) for d in (*xs, *ws, *cs)):
        return [ctx.zeros(ctx.t(x)), ctx.zeros(ctx.t(w))]

    # input: the cotangent dilated by the stride, padded so that a stride-1 convolution with
    # the flipped, group-transposed weight gives back the input's size
    config: list[list[Dim]] = [[0, 0, 0], [0, 0, 0]]
    for i in range(n):
        reach = dilation[i] * (as_sympy(ws[2 + i]) - 1)
        lo = simplify_dim(reach - padding[i])
        # what the forward's floor division dropped at the end
        extra = (as_sympy(xs[2 + i]) + 2 * padding[i] - reach - 1
                 - (as_sympy(cs[2 + i]) - 1) * stride[i])
        config.append([lo, simplify_dim(as_sympy(lo) + extra), stride[i] - 1])
    spatial = list(range(2, 2 + n))
    wf = ctx.p("rev", _transpose_groups(ctx, w, g), dims=spatial)
    pads = config[2:]
    if all(isinstance(lo, int) and lo >= 0 and hi == lo and inner == 0
           for lo, hi, inner in pads):
        # stride 1 with the same padding on both sides (a "same" 3x3 convolution): the
        # convolution pads, instead of a padded copy of the cotangent
        gx = ctx.p("convolution", ct, wf, stride=[1] * n, padding=[lo for lo, _, _ in pads],
                   dilation=dilation, groups=g)
    else:
        gx = ctx.p("convolution", ctx.p("pad", ct, 0.0, config=config), wf, stride=[1] * n,
                   padding=[0] * n, dilation=dilation, groups=g)

    # weight: batch as channels, stride and dilation exchanged, cut to the kernel size
    gw = ctx.p("convolution", _batch_to_channels(ctx, x, g), _swap01(ctx, ct),
               stride=dilation, padding=padding, dilation=stride, groups=g)
    got = ctx.shape(gw)
    if any(a != b for a, b in zip(got[2:], ws[2:], strict=True)):
        gw = ctx.p("slice", gw, start=[0] * len(got), limit=[got[0], got[1], *ws[2:]],
                   step=[1] * len(got))
    return [gx, _swap01(ctx, gw)]


# ---- indexing ------------------------------------------------------------------------------

@vjp("prims.gather")
def _gather(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, idx = node.args
    ct = cts[0]
    assert isinstance(x, Value) and ct is not None
    return [ctx.p("scatter_add", ctx.zeros(ctx.t(x)), idx, ct, dim=node.kwargs["dim"]), None]


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
