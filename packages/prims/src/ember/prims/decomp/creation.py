"""Decompositions of creation ops (full, zeros, ones, the *_like and new_* forms, empty, arange,
scalar_tensor) and of the ops that overwrite a tensor wholesale (copy, fill, tril, triu).

Every creation op takes the dtype and device its aten node declares (torch's meta kernels
already resolved the defaults and type inference of `fill_value`). A fill value is written as
eager writes it: truncated and wrapped for integer dtypes, `bool(v)` for b8.

`empty`, `empty_like`, `empty_strided`, `new_empty` and `new_empty_strided` have defined
contents in ember: zeros (docs/decisions.md). Strides are not part of a value's type, so the
strided forms are `full` too.

arange: the length is the one the aten node declares (torch's meta kernel computed it with
eager's rules, including its quirks for float steps and integer dtypes) unless an argument is a
size expression (then `ceil((end - start) / step)`, exact over the symbols). Values follow
eager's CPU kernel: integer dtypes `iota` with the start and step truncated to integers;
floating dtypes `start + step * i` computed in eager's accumulate type (f64 for f32 and f64
results, f32 for f16 and bf16) and rounded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from ember.ir import DType, Value
from ember.ir.expr import Dim, FloorDiv, as_sympy, simplify_dim
from ember.prims.decomp.context import DecompContext, DecompositionError, runtime_scalar_error
from ember.prims.decomp.shape import _fill_value
from ember.prims.decomp.table import register_decomposition


def _result(ctx: DecompContext, i: int = 0) -> tuple[list[Dim], DType, str]:
    """(shape, dtype, device) the aten node declares for result i."""
    t = ctx.ttype(ctx.node.results[i])
    return list(t.shape), t.dtype, t.device


def _full_result(ctx: DecompContext, value: Any, shape: Sequence[Dim] | None = None) -> Value:
    """A tensor of the declared type (or of `shape`) filled with `value` as eager writes it."""
    decl, dtype, device = _result(ctx)
    v = _num(value)
    if not isinstance(v, sympy.Expr):  # a size expression stays as it is
        v = _fill_value(v, dtype)
    return ctx.full(decl if shape is None else shape, v, dtype, device)


# ---- full, zeros, ones, empty and their _like / new_ forms ------------------------------


@register_decomposition("aten.full.default", "aten.full_like.default", "aten.new_full.default")
def full(ctx: DecompContext, fill_value: Any, **_: Any) -> Value:
    return _full_result(ctx, fill_value)


@register_decomposition("aten.zero.default")
def zero(ctx: DecompContext, self: Value) -> Value:
    """The functional zero_."""
    return _full_result(ctx, 0)


@register_decomposition("aten.zeros.default", "aten.zeros_like.default",
                        "aten.new_zeros.default", "aten.empty.memory_format",
                        "aten.empty_like.default", "aten.new_empty.default",
                        "aten.empty_strided.default", "aten.new_empty_strided.default")
def zeros(ctx: DecompContext, **_: Any) -> Value:
    """zeros; and the empty forms, whose contents ember defines as zeros."""
    return _full_result(ctx, 0)


@register_decomposition("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def ones(ctx: DecompContext, **_: Any) -> Value:
    return _full_result(ctx, 1)


@register_decomposition("aten.scalar_tensor.default")
def scalar_tensor(ctx: DecompContext, s: Any, **_: Any) -> Value:
    return _full_result(ctx, s)


# ---- arange -------------------------------------------------------------------------------


def _sym_length(start: Any, end: Any, step: Any) -> Dim:
    """ceil((end - start) / step) for integer arguments, some of them size expressions."""
    if not isinstance(step, int) or step == 0:
        raise DecompositionError(f"arange: step must be a nonzero int literal, got {step}")
    a, b = as_sympy(start), as_sympy(end)
    if step > 0:
        return simplify_dim(FloorDiv(b - a + step - 1, step))
    return simplify_dim(FloorDiv(a - b - step - 1, -step))


def _arange(ctx: DecompContext, start: Any, end: Any, step: Any) -> Value:
    for name, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, Value):  # the length would be the declared one, unchecked
            raise runtime_scalar_error(ctx.node.op, name, v)
    shape, dtype, device = _result(ctx)
    if dtype == DType.b8 or not (dtype.is_integer or dtype.is_floating):
        raise DecompositionError(f"{ctx.node.op}: no arange of {dtype.name}")
    symbolic = any(isinstance(v, sympy.Expr) and not v.is_Integer for v in (start, end, step))
    length: Dim = _sym_length(start, end, step) if symbolic else shape[0]
    if dtype.is_integer:
        return ctx.prim("iota", length=length, start=_int(start), step=_int(step), dtype=dtype,
                        device=device)
    acc = DType.f32 if dtype in (DType.f16, DType.bf16) else DType.f64
    i = ctx.prim("iota", length=length, start=0, step=1, dtype=DType.i64, device=device)
    x = ctx.convert(i, acc)
    if step != 1:
        x = ctx.prim("mul", x, _num(step))
    if start != 0:
        x = ctx.prim("add", x, _num(start))
    return ctx.convert(x, dtype)


def _int(v: Any) -> Any:
    """A Scalar as eager's `to<int64_t>()` gives it: floats truncate toward zero."""
    if isinstance(v, sympy.Expr):
        return int(v) if v.is_Integer else v
    return int(v)


def _num(v: Any) -> Any:
    if isinstance(v, sympy.Expr) and v.is_Integer:
        return int(v)
    return v


@register_decomposition("aten.arange.default")
def arange(ctx: DecompContext, end: Any, **_: Any) -> Value:
    return _arange(ctx, 0, end, 1)


@register_decomposition("aten.arange.start")
def arange_start(ctx: DecompContext, start: Any, end: Any, **_: Any) -> Value:
    return _arange(ctx, start, end, 1)


@register_decomposition("aten.arange.start_step")
def arange_start_step(ctx: DecompContext, start: Any, end: Any, step: Any = 1,
                      **_: Any) -> Value:
    return _arange(ctx, start, end, step)


# ---- copy, fill -----------------------------------------------------------------------------


@register_decomposition("aten.copy.default")
def copy(ctx: DecompContext, self: Value, src: Value, non_blocking: bool = False) -> Value:
    """The functional copy_: src broadcast to self's shape, in self's dtype."""
    if ctx.device(src) != ctx.device(self):
        raise DecompositionError(f"{ctx.node.op}: copies between devices ({ctx.device(src)} "
                                 f"-> {ctx.device(self)}) are not decomposed")
    return ctx.convert(ctx.broadcast_to(src, ctx.shape(self)), ctx.dtype(self))


@register_decomposition("aten.fill.Scalar")
def fill_scalar(ctx: DecompContext, self: Value, value: Any) -> Value:
    return _full_result(ctx, value, ctx.shape(self))


@register_decomposition("aten.fill.Tensor")
def fill_tensor(ctx: DecompContext, self: Value, value: Value) -> Value:
    if ctx.rank(value) != 0:
        raise DecompositionError(f"{ctx.node.op}: the value must be a 0-dim tensor")
    return ctx.broadcast_to(ctx.convert(value, ctx.dtype(self)), ctx.shape(self))


# ---- tril, triu -----------------------------------------------------------------------------


def _triangle(ctx: DecompContext, self: Value, diagonal: Any, lower: bool) -> Value:
    """Keep the elements with `col - row <= diagonal` (tril) or `>= diagonal` (triu) of the
    last two dims; zero the others."""
    shape = ctx.shape(self)
    rank = len(shape)
    if rank < 2:
        raise DecompositionError(f"{ctx.node.op} needs at least 2 dims")
    dev = ctx.device(self)
    rows, cols = shape[-2], shape[-1]
    p = ctx.prim
    r = p("broadcast_in_dim", p("iota", length=rows, start=0, step=1, dtype=DType.i64,
                                device=dev), shape=[rows, cols], broadcast_dims=[0])
    c = p("broadcast_in_dim", p("iota", length=cols, start=0, step=1, dtype=DType.i64,
                                device=dev), shape=[rows, cols], broadcast_dims=[1])
    keep = p("le" if lower else "ge", p("sub", c, r), _num(diagonal))
    keep = ctx.broadcast_to(keep, shape)
    dt = ctx.dtype(self)
    zero: Any = False if dt == DType.b8 else 0.0 if dt.is_floating else 0
    return p("where", keep, self, zero)


@register_decomposition("aten.tril.default")
def tril(ctx: DecompContext, self: Value, diagonal: Any = 0) -> Value:
    return _triangle(ctx, self, diagonal, lower=True)


@register_decomposition("aten.triu.default")
def triu(ctx: DecompContext, self: Value, diagonal: Any = 0) -> Value:
    return _triangle(ctx, self, diagonal, lower=False)
