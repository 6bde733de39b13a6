"""Decompositions of pointwise aten ops (core ATen's pointwise set, clamp, lerp, addcmul, ...).

Pattern: compute in the "opmath" dtype (f16/bf16 -> f32, as eager's CPU and CUDA kernels do),
broadcast explicitly, convert the result to the dtype the aten node declares.
"""

from __future__ import annotations

from typing import Any

from ember.ir import DType, Value
from ember.prims.decomp.context import DecompContext
from ember.prims.decomp.table import register_decomposition

LOW_PRECISION = (DType.f16, DType.bf16)


def opmath(dt: DType) -> DType:
    """The dtype pointwise math runs in for results of dtype dt."""
    return DType.f32 if dt in LOW_PRECISION else dt


def _elementwise(ctx: DecompContext, prim: str, *xs: Any, compute: DType | None = None,
                 **attrs: Any) -> Value:
    """prim(*xs) broadcast, computed in `compute` (default: opmath of the result dtype) and
    converted to the declared result dtype."""
    out = ctx.out_dtype()
    comp = compute or opmath(out)
    ys = [ctx.convert(x, comp) for x in ctx.broadcast(*xs)]
    return ctx.convert(ctx.prim(prim, *ys, **attrs), out)


# ---- unary float math: integer inputs compute in the (float) result dtype ----------------
FLOAT_UNARY = {
    "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
    "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin",
    "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
    "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
    "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "lgamma": "lgamma", "digamma": "digamma",
}


def _float_unary(prim: str) -> Any:
    def decomp(ctx: DecompContext, self: Value) -> Value:
        return _elementwise(ctx, prim, self)
    decomp.__name__ = prim
    return decomp


for _aten, _prim in FLOAT_UNARY.items():
    register_decomposition(f"aten.{_aten}.default")(_float_unary(_prim))


# ---- arithmetic ---------------------------------------------------------------------------
@register_decomposition("aten.add.Tensor", "aten.add.Scalar")
def add(ctx: DecompContext, self: Any, other: Any, alpha: Any = 1) -> Value:
    if ctx.out_dtype() == DType.b8:  # bool + bool is logical or
        return _elementwise(ctx, "bitwise_or", self, other)
    out = ctx.out_dtype()
    comp = opmath(out)
    a, b = (ctx.convert(x, comp) for x in ctx.broadcast(self, other))
    if alpha != 1:
        b = ctx.prim("mul", b, alpha) if ctx.is_tensor(b) else b * alpha
    return ctx.convert(ctx.prim("add", a, b), out)


@register_decomposition("aten.mul.Tensor", "aten.mul.Scalar")
def mul(ctx: DecompContext, self: Any, other: Any) -> Value:
    if ctx.out_dtype() == DType.b8:  # bool * bool is logical and
        return _elementwise(ctx, "bitwise_and", self, other)
    return _elementwise(ctx, "mul", self, other)
