"""Decompositions of pointwise aten ops (core ATen's pointwise set, clamp, lerp, addcmul, ...).

Pattern: compute in the "opmath" dtype (f16/bf16 -> f32, as eager's CPU and CUDA kernels do),
broadcast explicitly, convert the result to the dtype the aten node declares.

Where eager's CPU kernels differ from that pattern, the decompositions follow eager (the op
database compares against it):
- ops whose result is exact in the operands' dtype (comparisons, min/max, clamp, where, fmod,
  remainder, rounding) compute in that dtype, and a Python number takes that dtype, as eager
  casts a wrapped number to the common dtype;
- f16/bf16 kernels of several steps (floor and trunc division) round after each step, unless the
  divisor is a single element (eager's "scalar" fast path computes in f32 throughout);
- f16/bf16 `pow` with a Scalar exponent or base rounds the number to the tensor's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ember.ir import DType, Value
from ember.prims.decomp.context import (
    DecompContext,
    DecompositionError,
    EagerNotImplementedError,
    EagerRuntimeError,
)
from ember.prims.decomp.table import register_decomposition

LOW_PRECISION = (DType.f16, DType.bf16)


def opmath(dt: DType) -> DType:
    """The dtype pointwise math runs in for results of dtype dt."""
    return DType.f32 if dt in LOW_PRECISION else dt


def _elementwise(ctx: DecompContext, prim: str, *xs: Any, compute: DType | None = None,
                 exact: tuple[int, ...] = ()) -> Value:
    """prim(*xs) broadcast, computed in `compute` (default: opmath of the result dtype, with
    `opmath_operands`) and converted to the declared result dtype."""
    out = ctx.out_dtype()
    ys = operands(ctx, compute, *xs) if compute else opmath_operands(ctx, *xs, exact=exact)
    return ctx.convert(ctx.prim(prim, *ys), out)


def _native(ctx: DecompContext, prim: str, *xs: Any) -> Value:
    """prim(*xs) computed in the declared result dtype itself (exact ops)."""
    return _elementwise(ctx, prim, *xs, compute=ctx.out_dtype())


def operands(ctx: DecompContext, dtype: DType, *xs: Any) -> list[Any]:
    """xs broadcast together, tensors converted to dtype (numbers pass through)."""
    return [ctx.convert(x, dtype) for x in ctx.broadcast(*xs)]


def opmath_operands(ctx: DecompContext, *xs: Any, exact: tuple[int, ...] = ()) -> list[Any]:
    """xs broadcast together and converted to opmath of the declared result dtype. For an f16
    or bf16 result they are first rounded to that dtype, as eager casts its inputs to the
    common dtype before its kernels widen them (literal numbers too), except the operands
    listed in `exact` (eager's mul/div keep a single-element divisor's own value)."""
    out = ctx.out_dtype()
    comp = opmath(out)
    ys = []
    for i, x in enumerate(ctx.broadcast(*xs)):
        if out in LOW_PRECISION and i not in exact:
            x = ctx.convert(x, out) if ctx.is_tensor(x) else round_number(x, out)
        ys.append(ctx.convert(x, comp))
    return ys


def round_number(v: Any, dtype: DType) -> Any:
    """A literal number rounded to a float dtype (other numbers pass through)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and dtype.is_floating:
        return float(torch.tensor(float(v), dtype=dtype.torch).item())
    return v


def is_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float))


def scalar_as(dtype: DType, v: Any) -> Any:
    """A literal Scalar as eager's `Scalar::to<scalar_t>()` gives it: truncated for integer
    dtypes (hardtanh(int, -1.5) clamps at -1)."""
    if isinstance(v, float) and not isinstance(v, bool) and not (dtype.is_floating or
                                                                 dtype.is_complex):
        return bool(v) if dtype == DType.b8 else int(v)
    return v


def tensor_of(ctx: DecompContext, v: Any, like: Value) -> Value:
    """v as a tensor of like's shape and dtype (a number becomes prims.full)."""
    if ctx.is_tensor(v):
        t: Value = ctx.convert(ctx.broadcast_to(v, ctx.shape(like)), ctx.dtype(like))
        return t
    return ctx.full(ctx.shape(like), v, ctx.dtype(like), ctx.device(like))


def scale(ctx: DecompContext, x: Any, factor: Any) -> Any:
    """x * factor, skipping the multiplication by a literal 1; numbers multiply in Python."""
    if is_number(factor) and factor == 1:
        return x
    if is_number(x) and is_number(factor):
        return x * factor
    return ctx.prim("mul", x, factor)


def maximum(ctx: DecompContext, a: Any, b: Any) -> Value:
    """NaN-propagating maximum of same-shaped operands; `or` on b8."""
    t = a if ctx.is_tensor(a) else b
    return ctx.prim("bitwise_or" if ctx.dtype(t) == DType.b8 else "maximum", a, b)


def minimum(ctx: DecompContext, a: Any, b: Any) -> Value:
    t = a if ctx.is_tensor(a) else b
    return ctx.prim("bitwise_and" if ctx.dtype(t) == DType.b8 else "minimum", a, b)


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


@register_decomposition("aten.sigmoid.default")
def sigmoid(ctx: DecompContext, self: Value) -> Value:
    out = ctx.out_dtype()
    x = ctx.convert(self, opmath(out))
    return ctx.convert(ctx.prim("div", 1, ctx.prim("add", 1, ctx.prim("exp", ctx.prim("neg", x)))),
                       out)


@register_decomposition("aten.reciprocal.default")
def reciprocal(ctx: DecompContext, self: Value) -> Value:
    out = ctx.out_dtype()
    return ctx.convert(ctx.prim("div", 1, ctx.convert(self, opmath(out))), out)


# ---- unary, any number type (exact: computed in the dtype itself) ------------------------
EXACT_UNARY = ("abs", "neg", "floor", "ceil", "round", "trunc", "bitwise_not")


def _exact_unary(prim: str) -> Any:
    def decomp(ctx: DecompContext, self: Value) -> Value:
        return _native(ctx, prim, self)
    decomp.__name__ = prim
    return decomp


for _name in EXACT_UNARY:
    register_decomposition(f"aten.{_name}.default")(_exact_unary(_name))


@register_decomposition("aten.sign.default")
def sign(ctx: DecompContext, self: Value) -> Value:
    if ctx.dtype(self) == DType.b8:  # sign of a bool is itself
        return self
    return _native(ctx, "sign", self)


@register_decomposition("aten.round.decimals")
def round_decimals(ctx: DecompContext, self: Value, decimals: int) -> Value:
    """eager: nearbyint(x * 10^d) / 10^d, or for d < 0 nearbyint(x / 10^-d) * 10^-d."""
    out = ctx.out_dtype()
    if decimals == 0:
        return _native(ctx, "round", self)
    x = ctx.convert(self, opmath(out))
    ten = float(10 ** abs(decimals))
    if decimals > 0:
        y = ctx.prim("div", ctx.prim("round", ctx.prim("mul", x, ten)), ten)
    else:
        y = ctx.prim("mul", ctx.prim("round", ctx.prim("div", x, ten)), ten)
    return ctx.convert(y, out)


@register_decomposition("aten.isnan.default")
def isnan(ctx: DecompContext, self: Value) -> Value:
    return ctx.prim("ne", self, self)


def _equals(target: float, absolute: bool = False) -> Any:
    def decomp(ctx: DecompContext, self: Value) -> Value:
        if not ctx.dtype(self).is_floating:
            return ctx.prim("ne", self, self)  # integers are never infinite
        return ctx.prim("eq", ctx.prim("abs", self) if absolute else self, target)
    return decomp


register_decomposition("aten.isinf.default")(_equals(math.inf, absolute=True))
register_decomposition("aten.isposinf.default")(_equals(math.inf))
register_decomposition("aten.isneginf.default")(_equals(-math.inf))


# ---- arithmetic ---------------------------------------------------------------------------
@register_decomposition("aten.add.Tensor", "aten.add.Scalar")
def add(ctx: DecompContext, self: Any, other: Any, alpha: Any = 1) -> Value:
    if ctx.out_dtype() == DType.b8:  # bool + bool is logical or
        return _elementwise(ctx, "bitwise_or", self, other)
    out = ctx.out_dtype()
    a, b = opmath_operands(ctx, self, other)
    return ctx.convert(ctx.prim("add", a, scale(ctx, b, round_number(alpha, out))), out)


def _is_bool(ctx: DecompContext, x: Any) -> bool:
    return isinstance(x, bool) or (isinstance(x, Value) and ctx.is_tensor(x)
                                   and ctx.dtype(x) == DType.b8)


def _sub(ctx: DecompContext, a: Any, b: Any, alpha: Any) -> Value:
    """a - alpha * b in opmath (eager rounds alpha to an f16/bf16 result's dtype)."""
    # eager's sub_check (rsub's meta does not run it: 1 - mask would compute)
    if _is_bool(ctx, a) and _is_bool(ctx, b):
        raise EagerRuntimeError(f"{ctx.node.op}: Subtraction, the `-` operator, with two bool "
                                f"tensors is not supported. Use the `^` or `logical_xor()` "
                                f"operator instead.")
    if _is_bool(ctx, a) or _is_bool(ctx, b):
        raise EagerRuntimeError(f"{ctx.node.op}: Subtraction, the `-` operator, with a bool "
                                f"tensor is not supported. If you are trying to invert a mask, "
                                f"use the `~` or `logical_not()` operator instead.")
    out = ctx.out_dtype()
    x, y = opmath_operands(ctx, a, b)
    y = scale(ctx, y, round_number(alpha, out) if out in LOW_PRECISION else alpha)
    if not (ctx.is_tensor(x) or ctx.is_tensor(y)):
        raise DecompositionError(f"{ctx.node.op}: no tensor operand")
    return ctx.convert(ctx.prim("sub", x, y), out)


@register_decomposition("aten.sub.Tensor", "aten.sub.Scalar")
def sub(ctx: DecompContext, self: Any, other: Any, alpha: Any = 1) -> Value:
    return _sub(ctx, self, other, alpha)


@register_decomposition("aten.rsub.Tensor", "aten.rsub.Scalar")
def rsub(ctx: DecompContext, self: Any, other: Any, alpha: Any = 1) -> Value:
    return _sub(ctx, other, self, alpha)


@register_decomposition("aten.mul.Tensor", "aten.mul.Scalar")
def mul(ctx: DecompContext, self: Any, other: Any) -> Value:
    if ctx.out_dtype() == DType.b8:  # bool * bool is logical and
        return _elementwise(ctx, "bitwise_and", self, other)
    return _elementwise(ctx, "mul", self, other, exact=_exact_scalar(ctx, other))


def _single_element(ctx: DecompContext, x: Any) -> bool:
    """A number or a tensor of one element: eager's CPU kernels take their f32 fast path."""
    return not ctx.is_tensor(x) or all(d == 1 for d in ctx.shape(x))


def _exact_scalar(ctx: DecompContext, other: Any) -> tuple[int, ...]:
    """eager's f16/bf16 mul and div take a single-element `other` at its own value in f32."""
    return (1,) if _single_element(ctx, other) else ()


def _division_operands(ctx: DecompContext, self: Any, other: Any) -> list[Any]:
    """f16/bf16 floor and trunc division run in f32 for a single-element divisor, else step
    by step in the dtype itself."""
    if _single_element(ctx, other):
        return opmath_operands(ctx, self, other, exact=(1,))
    return operands(ctx, ctx.out_dtype(), self, other)


def _div_trunc(ctx: DecompContext, self: Any, other: Any) -> Value:
    out = ctx.out_dtype()
    if not out.is_floating:
        return _native(ctx, "div", self, other)  # integer division truncates
    a, b = _division_operands(ctx, self, other)
    return ctx.convert(ctx.prim("trunc", ctx.prim("div", a, b)), out)


def _div_floor(ctx: DecompContext, self: Any, other: Any) -> Value:
    out = ctx.out_dtype()
    p = ctx.prim
    if not out.is_floating:
        a, b = operands(ctx, out, self, other)
        q = p("div", a, b)
        if out == DType.u8:
            return q
        a, b = tensor_of(ctx, a, q), tensor_of(ctx, b, q)
        inexact = p("ne", p("fmod", a, b), 0)
        signs_differ = p("bitwise_xor", p("lt", a, 0), p("lt", b, 0))
        return p("where", p("bitwise_and", inexact, signs_differ), p("sub", q, 1), q)
    a, b = _division_operands(ctx, self, other)
    a = tensor_of(ctx, a, b) if not ctx.is_tensor(a) else a
    b = tensor_of(ctx, b, a)
    return ctx.convert(_div_floor_float(ctx, a, b), out)


def _div_floor_float(ctx: DecompContext, a: Value, b: Value) -> Value:
    """eager's div_floor_floating (Python's float //), step by step in a's dtype."""
    p = ctx.prim
    mod = p("fmod", a, b)
    div = p("div", p("sub", a, mod), b)
    adjust = p("bitwise_and", p("ne", mod, 0), p("bitwise_xor", p("lt", b, 0), p("lt", mod, 0)))
    div = p("where", adjust, p("sub", div, 1), div)
    floor = p("floor", div)
    floor = p("where", p("gt", p("sub", div, floor), 0.5), p("add", floor, 1), floor)
    quotient = p("div", a, b)
    res = p("where", p("ne", div, 0), floor, p("mul", quotient, 0))  # +-0 with the sign of a/b
    return p("where", p("eq", b, 0), quotient, res)


def _true_div(ctx: DecompContext, self: Any, other: Any) -> Value:
    return _elementwise(ctx, "div", self, other, exact=_exact_scalar(ctx, other))


register_decomposition("aten.div.Tensor", "aten.div.Scalar")(_true_div)


@register_decomposition("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(ctx: DecompContext, self: Any, other: Any, rounding_mode: str | None) -> Value:
    if rounding_mode is None:
        return _true_div(ctx, self, other)
    if rounding_mode == "trunc":
        return _div_trunc(ctx, self, other)
    if rounding_mode == "floor":
        return _div_floor(ctx, self, other)
    raise DecompositionError(f"{ctx.node.op}: unknown rounding_mode {rounding_mode!r}")


@register_decomposition("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(ctx: DecompContext, self: Any, other: Any) -> Value:
    return _div_floor(ctx, self, other)


@register_decomposition("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(ctx: DecompContext, self: Any, other: Any) -> Value:
    return _native(ctx, "fmod", self, other)


@register_decomposition("aten.remainder.Tensor", "aten.remainder.Scalar",
                        "aten.remainder.Scalar_Tensor")
def remainder(ctx: DecompContext, self: Any, other: Any) -> Value:
    return _native(ctx, "remainder", self, other)


def _check_int_pow(base: DType, exponent: Any) -> None:
    """Eager refuses an integer (or bool) tensor to a negative integer Scalar power (a tensor
    exponent is computed: 2 ** -1 is 0); the prims' integer pow would return a value."""
    if not base.is_floating and not base.is_complex and isinstance(exponent, int) \
            and not isinstance(exponent, bool) and exponent < 0:
        raise EagerRuntimeError("aten.pow.Tensor_Scalar: Integers to negative integer powers "
                                "are not allowed.")


# eager's CPU pow with a Scalar exponent takes these kernels instead for f32, f64 and bf16 (not
# f16); they differ from pow at -0.0 and -inf: sqrt(-inf) is NaN, pow(-inf, 0.5) is inf
_POW_SPECIAL = {0.5: "sqrt", -0.5: "rsqrt", -1.0: "reciprocal"}


# and for f32 and f64 these as products (eager's pow_tensor_scalar_optimized_kernel): the same
# values bitwise, and ~20x faster than a vector pow call (GPT-2's GELU cubes its input)
_POW_PRODUCT = (2.0, 3.0, -2.0)


def _check_bool_pow(ctx: DecompContext, base: Any, exponent: Any) -> None:
    """Eager has no bool pow kernel: bool ** bool raises (capture's meta says i64); a bool
    tensor to a bool Scalar power is eager's special case (Tensor_Scalar), not checked here."""
    if _is_bool(ctx, base) and _is_bool(ctx, exponent):
        raise EagerNotImplementedError(f"{ctx.node.op}: \"pow\" not implemented for 'Bool'")


@register_decomposition("aten.pow.Tensor_Tensor")
def pow_tensor_tensor(ctx: DecompContext, self: Value, exponent: Value) -> Value:
    _check_bool_pow(ctx, self, exponent)
    return _elementwise(ctx, "pow", self, exponent)


@register_decomposition("aten.pow.Tensor_Scalar")
def pow_tensor_scalar(ctx: DecompContext, self: Value, exponent: Any) -> Value:
    _check_int_pow(ctx.dtype(self), exponent)
    out = ctx.out_dtype()
    if (out.is_floating and out != DType.f16 and is_number(exponent)
            and float(exponent) in _POW_SPECIAL):
        x = ctx.convert(self, opmath(out))
        special = _POW_SPECIAL[float(exponent)]
        y = ctx.prim("div", 1, x) if special == "reciprocal" else ctx.prim(special, x)
        return ctx.convert(y, out)
    if out in (DType.f32, DType.f64) and is_number(exponent) and not isinstance(exponent, bool) \
            and float(exponent) in _POW_PRODUCT:
        x = ctx.convert(self, out)
        sq = ctx.prim("mul", x, x)
        e = float(exponent)
        return ctx.prim("mul", sq, x) if e == 3.0 else sq if e == 2.0 else ctx.prim("div", 1, sq)
    if out in LOW_PRECISION:  # the exponent is rounded to the tensor's dtype
        return _native(ctx, "pow", self, exponent)
    return _elementwise(ctx, "pow", self, exponent)


@register_decomposition("aten.pow.Scalar")
def pow_scalar(ctx: DecompContext, self: Any, exponent: Value) -> Value:
    _check_bool_pow(ctx, self, exponent)
    if ctx.out_dtype() in LOW_PRECISION:  # the base is rounded to the tensor's dtype
        return _native(ctx, "pow", self, exponent)
    return _elementwise(ctx, "pow", self, exponent)


@register_decomposition("aten.atan2.default")
def atan2(ctx: DecompContext, self: Value, other: Value) -> Value:
    return _elementwise(ctx, "atan2", self, other)


@register_decomposition("aten.hypot.default")
def hypot(ctx: DecompContext, self: Value, other: Value) -> Value:
    """sqrt(a^2 + b^2); infinite where either is infinite (even if the other is NaN)."""
    out = ctx.out_dtype()
    p = ctx.prim
    a, b = opmath_operands(ctx, self, other)
    r = p("sqrt", p("add", p("mul", a, a), p("mul", b, b)))
    inf = p("bitwise_or", p("eq", p("abs", a), math.inf), p("eq", p("abs", b), math.inf))
    return ctx.convert(p("where", inf, math.inf, r), out)


@register_decomposition("aten.maximum.default")
def maximum_(ctx: DecompContext, self: Value, other: Value) -> Value:
    return maximum(ctx, *operands(ctx, ctx.out_dtype(), self, other))


@register_decomposition("aten.minimum.default")
def minimum_(ctx: DecompContext, self: Value, other: Value) -> Value:
    return minimum(ctx, *operands(ctx, ctx.out_dtype(), self, other))


# ---- bitwise, logical, comparison ---------------------------------------------------------
def _bitwise(prim: str) -> Any:
    def decomp(ctx: DecompContext, self: Any, other: Any) -> Value:
        return _native(ctx, prim, self, other)
    decomp.__name__ = prim
    return decomp


for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    register_decomposition(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar",
                           f"aten.{_name}.Scalar_Tensor")(_bitwise(_name))


def _truth(ctx: DecompContext, x: Value) -> Value:
    """x != 0 as b8 (NaN is true)."""
    return x if ctx.dtype(x) == DType.b8 else ctx.prim("ne", x, 0)


def _logical(prim: str) -> Any:
    def decomp(ctx: DecompContext, self: Value, other: Value) -> Value:
        return _native(ctx, prim, _truth(ctx, self), _truth(ctx, other))
    decomp.__name__ = prim
    return decomp


for _name, _prim in (("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor")):
    register_decomposition(f"aten.logical_{_name}.default")(_logical(_prim))


@register_decomposition("aten.logical_not.default")
def logical_not(ctx: DecompContext, self: Value) -> Value:
    if ctx.dtype(self) == DType.b8:
        return ctx.prim("bitwise_not", self)
    return ctx.prim("eq", self, 0)


def _comparison(prim: str) -> Any:
    def decomp(ctx: DecompContext, self: Any, other: Any) -> Value:
        return _elementwise(ctx, prim, self, other, compute=ctx.result_dtype(self, other))
    decomp.__name__ = prim
    return decomp


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register_decomposition(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_comparison(_name))


# ---- selection and clamping ---------------------------------------------------------------
@register_decomposition("aten.where.self")
def where(ctx: DecompContext, condition: Value, self: Value, other: Value) -> Value:
    c, a, b = ctx.broadcast(_truth(ctx, condition), self, other)
    out = ctx.out_dtype()
    return ctx.prim("where", c, ctx.convert(a, out), ctx.convert(b, out))


def clamp_to(ctx: DecompContext, self: Any, min: Any, max: Any) -> Value:
    """min(max(self, min), max) in the declared dtype, NaN-propagating (eager's clamp)."""
    out = ctx.out_dtype()
    if min is None and max is None:
        raise DecompositionError(f"{ctx.node.op}: at least one of min and max must be given")
    ys = operands(ctx, out, self, min, max)
    x: Value = ys[0]
    lo, hi = ys[1:]
    if lo is not None:
        x = maximum(ctx, x, scalar_as(out, lo))
    if hi is not None:
        x = minimum(ctx, x, scalar_as(out, hi))
    return x


@register_decomposition("aten.clamp.default", "aten.clamp.Tensor")
def clamp(ctx: DecompContext, self: Value, min: Any = None, max: Any = None) -> Value:
    return clamp_to(ctx, self, min, max)


@register_decomposition("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(ctx: DecompContext, self: Value, min: Any) -> Value:
    return clamp_to(ctx, self, min, None)


@register_decomposition("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(ctx: DecompContext, self: Value, max: Any) -> Value:
    return clamp_to(ctx, self, None, max)


@register_decomposition("aten.nan_to_num.default")
def nan_to_num(ctx: DecompContext, self: Value, nan: Any = None, posinf: Any = None,
               neginf: Any = None) -> Value:
    dt = ctx.dtype(self)
    if not dt.is_floating:
        return self  # integers and bools have no NaN or inf
    info = torch.finfo(dt.torch)
    p = ctx.prim
    x = p("where", p("eq", self, math.inf), info.max if posinf is None else posinf, self)
    x = p("where", p("eq", self, -math.inf), info.min if neginf is None else neginf, x)
    return p("where", p("ne", self, self), 0.0 if nan is None else nan, x)


# ---- fused forms: lerp, addcmul, addcdiv ----------------------------------------------------
def _lerp(ctx: DecompContext, a: Value, b: Value, w: Any, small: bool | None) -> Value:
    """eager's lerp: a + w * (b - a) where |w| < 0.5, else b - (b - a) * (1 - w)."""
    p = ctx.prim
    diff = p("sub", b, a)
    if small is True:
        return p("add", a, p("mul", w, diff))
    one_minus = p("sub", 1, w) if ctx.is_tensor(w) else 1 - w
    large = p("sub", b, p("mul", diff, one_minus))
    if small is False:
        return large
    return p("where", p("lt", p("abs", w), 0.5), p("add", a, p("mul", w, diff)), large)


@register_decomposition("aten.lerp.Scalar")
def lerp_scalar(ctx: DecompContext, self: Value, end: Value, weight: Any) -> Value:
    out = ctx.out_dtype()
    a, b = opmath_operands(ctx, self, end)
    if is_number(weight):
        return ctx.convert(_lerp(ctx, a, b, weight, abs(weight) < 0.5), out)
    return ctx.convert(_lerp(ctx, a, b, tensor_of(ctx, weight, a), None), out)


@register_decomposition("aten.lerp.Tensor")
def lerp_tensor(ctx: DecompContext, self: Value, end: Value, weight: Value) -> Value:
    out = ctx.out_dtype()
    a, b, w = opmath_operands(ctx, self, end, weight)
    return ctx.convert(_lerp(ctx, a, b, w, None), out)


def _addc(prim: str) -> Any:
    def decomp(ctx: DecompContext, self: Value, tensor1: Value, tensor2: Value,
               value: Any = 1) -> Value:
        """self + value * tensor1 (*|/) tensor2, as eager orders it, in opmath."""
        out = ctx.out_dtype()
        x, t1, t2 = opmath_operands(ctx, self, tensor1, tensor2)
        v = scalar_as(out, value)
        prod = ctx.prim(prim, t1 if is_number(v) and v == 1 else ctx.prim("mul", v, t1), t2)
        return ctx.convert(ctx.prim("add", x, prod), out)
    decomp.__name__ = f"addc{prim}"
    return decomp


register_decomposition("aten.addcmul.default")(_addc("mul"))
register_decomposition("aten.addcdiv.default")(_addc("div"))
