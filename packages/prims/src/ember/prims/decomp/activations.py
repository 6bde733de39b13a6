"""Decompositions of activation functions (relu, gelu, silu, elu, softplus, ...).

As in pointwise.py: the math runs in opmath (f16/bf16 -> f32) and the result is converted to
the declared dtype; each formula follows eager's CPU kernel step by step, so NaN and inf land
where eager puts them (gelu(-inf) and mish(-inf) are NaN, elu(-inf) is -alpha * scale).
sigmoid and tanh are in pointwise.py.
"""

from __future__ import annotations

import math
from typing import Any

from ember.ir import Value
from ember.ir.expr import FloorDiv, as_sympy, simplify_dim
from ember.prims.decomp.context import DecompContext, DecompositionError
from ember.prims.decomp.pointwise import (
    clamp_to,
    is_number,
    maximum,
    minimum,
    opmath,
    scalar_as,
)
from ember.prims.decomp.table import register_decomposition


def _in_opmath(ctx: DecompContext, x: Value) -> Value:
    return ctx.convert(x, opmath(ctx.out_dtype()))


def _out(ctx: DecompContext, y: Value) -> Value:
    return ctx.convert(y, ctx.out_dtype())


def _product(a: Any, b: Any) -> Any:
    """a * b for literal numbers (an activation's folded coefficients)."""
    if not (is_number(a) and is_number(b)):
        raise DecompositionError("activation coefficients must be literal numbers")
    return a * b


@register_decomposition("aten.relu.default")
def relu(ctx: DecompContext, self: Value) -> Value:
    return maximum(ctx, self, 0)  # NaN stays NaN, as eager's clamp_min(x, 0)


@register_decomposition("aten.hardtanh.default")
def hardtanh(ctx: DecompContext, self: Value, min_val: Any = -1, max_val: Any = 1) -> Value:
    return clamp_to(ctx, self, min_val, max_val)


@register_decomposition("aten.threshold.default")
def threshold(ctx: DecompContext, self: Value, threshold: Any, value: Any) -> Value:
    """x <= threshold ? value : x, in x's dtype (numbers truncated for integers); eager
    compares f16/bf16 in f32 (the threshold is not rounded)."""
    out = ctx.out_dtype()
    le = ctx.prim("le", _in_opmath(ctx, self), scalar_as(out, threshold))
    return ctx.prim("where", le, scalar_as(out, value), self)


@register_decomposition("aten.gelu.default")
def gelu(ctx: DecompContext, self: Value, approximate: str = "none") -> Value:
    p = ctx.prim
    x = _in_opmath(ctx, self)
    if approximate == "none":  # x * 0.5 * (1 + erf(x / sqrt(2)))
        cdf = p("add", 1, p("erf", p("mul", x, math.sqrt(0.5))))
        return _out(ctx, p("mul", p("mul", x, 0.5), cdf))
    if approximate == "tanh":  # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
        beta = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
        cube = p("mul", p("mul", x, x), x)
        inner = p("mul", beta, p("add", x, p("mul", 0.044715, cube)))
        return _out(ctx, p("mul", p("mul", 0.5, x), p("add", 1, p("tanh", inner))))
    raise DecompositionError(f"{ctx.node.op}: unknown approximate={approximate!r}")


def _sigmoid_of(ctx: DecompContext, x: Value) -> Value:
    """1 / (1 + exp(-x))"""
    return ctx.prim("div", 1, ctx.prim("add", 1, ctx.prim("exp", ctx.prim("neg", x))))


@register_decomposition("aten.silu.default")
def silu(ctx: DecompContext, self: Value) -> Value:
    x = _in_opmath(ctx, self)
    return _out(ctx, ctx.prim("div", x, ctx.prim("add", 1, ctx.prim("exp", ctx.prim("neg", x)))))


@register_decomposition("aten.mish.default")
def mish(ctx: DecompContext, self: Value) -> Value:
    p = ctx.prim
    x = _in_opmath(ctx, self)
    return _out(ctx, p("mul", x, p("tanh", p("log1p", p("exp", x)))))


@register_decomposition("aten.softplus.default")
def softplus(ctx: DecompContext, self: Value, beta: Any = 1, threshold: Any = 20) -> Value:
    """x * beta > threshold ? x : log1p(exp(x * beta)) / beta"""
    p = ctx.prim
    x = _in_opmath(ctx, self)
    xb = p("mul", x, beta)
    soft = p("div", p("log1p", p("exp", xb)), beta)
    return _out(ctx, p("where", p("gt", xb, threshold), x, soft))


@register_decomposition("aten.leaky_relu.default")
def leaky_relu(ctx: DecompContext, self: Value, negative_slope: Any = 0.01) -> Value:
    p = ctx.prim
    x = _in_opmath(ctx, self)
    return _out(ctx, p("where", p("gt", x, 0), x, p("mul", x, negative_slope)))


def _elu(ctx: DecompContext, self: Value, alpha: Any = 1, scale: Any = 1,
         input_scale: Any = 1) -> Value:
    """x > 0 ? x * scale : expm1(x * input_scale) * (alpha * scale)"""
    p = ctx.prim
    x = _in_opmath(ctx, self)
    neg = p("mul", p("expm1", p("mul", x, input_scale)), _product(alpha, scale))
    return _out(ctx, p("where", p("gt", x, 0), p("mul", x, scale), neg))


register_decomposition("aten.elu.default")(_elu)


@register_decomposition("aten.celu.default")
def celu(ctx: DecompContext, self: Value, alpha: Any = 1.0) -> Value:
    """elu(x, alpha, 1, 1 / alpha), as eager defines it."""
    if not is_number(alpha):
        raise DecompositionError(f"{ctx.node.op}: alpha must be a literal number")
    return _elu(ctx, self, alpha, 1.0, 1.0 / float(alpha))


@register_decomposition("aten.hardsigmoid.default")
def hardsigmoid(ctx: DecompContext, self: Value) -> Value:
    """min(max(x + 3, 0), 6) / 6"""
    x = _in_opmath(ctx, self)
    return _out(ctx, ctx.prim("div", _relu6_of(ctx, ctx.prim("add", x, 3)), 6))


@register_decomposition("aten.hardswish.default")
def hardswish(ctx: DecompContext, self: Value) -> Value:
    """x * min(max(x + 3, 0), 6) / 6"""
    x = _in_opmath(ctx, self)
    gate = _relu6_of(ctx, ctx.prim("add", x, 3))
    return _out(ctx, ctx.prim("div", ctx.prim("mul", x, gate), 6))


def _relu6_of(ctx: DecompContext, x: Value) -> Value:
    return minimum(ctx, maximum(ctx, x, 0), 6)


@register_decomposition("aten.softshrink.default")
def softshrink(ctx: DecompContext, self: Value, lambd: Any = 0.5) -> Value:
    """x > l ? x - l : (x < -l ? x + l : x * 0)"""
    p = ctx.prim
    x = _in_opmath(ctx, self)
    neg_l = -lambd if is_number(lambd) else p("neg", lambd)
    inner = p("where", p("lt", x, neg_l), p("add", x, lambd), p("mul", x, 0))
    return _out(ctx, p("where", p("gt", x, lambd), p("sub", x, lambd), inner))


@register_decomposition("aten.hardshrink.default")
def hardshrink(ctx: DecompContext, self: Value, lambd: Any = 0.5) -> Value:
    """-l <= x <= l ? 0 : x, in x's dtype"""
    p = ctx.prim
    if not is_number(lambd):
        raise DecompositionError(f"{ctx.node.op}: lambd must be a literal number")
    inside = p("bitwise_and", p("ge", self, -lambd), p("le", self, lambd))
    return p("where", inside, 0, self)


@register_decomposition("aten._prelu_kernel.default")
def prelu_kernel(ctx: DecompContext, self: Value, weight: Value) -> Value:
    """x > 0 ? x : weight * x (weight broadcasts)"""
    p = ctx.prim
    x, w = (_in_opmath(ctx, v) for v in ctx.broadcast(self, weight))
    return _out(ctx, p("where", p("gt", x, 0), x, p("mul", w, x)))


@register_decomposition("aten.glu.default")
def glu(ctx: DecompContext, self: Value, dim: int = -1) -> Value:
    """a * sigmoid(b) where a, b are the halves of `dim`."""
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    shape = ctx.shape(self)
    half = simplify_dim(FloorDiv(as_sympy(shape[d]), 2))
    x = _in_opmath(ctx, self)

    def part(start: Any, limit: Any) -> Value:
        lo = [start if i == d else 0 for i in range(rank)]
        hi = [limit if i == d else n for i, n in enumerate(shape)]
        return ctx.prim("slice", x, start=lo, limit=hi, step=[1] * rank)

    a = part(0, half)
    b = part(half, simplify_dim(as_sympy(half) * 2))
    return _out(ctx, ctx.prim("mul", a, _sigmoid_of(ctx, b)))
