"""Decompositions of reductions: sum, mean, var/std (and var_mean/std_mean), amax/amin,
max/min (values and indices), argmax/argmin, prod, any/all, logsumexp, cumsum/cumprod.

Pattern: reduce in the opmath dtype of the declared result (f16/bf16 -> f32, as eager's kernels
accumulate), let the prim drop the reduced dims, re-insert them for keepdim, convert to the
declared dtype. Dims follow torch: None or [] mean every dim (except `any.dims`/`all.dims`,
where [] reduces nothing, as in eager).

Empty reductions: sum, prod, mean (NaN), var (NaN), any and all have values over an empty set.
amax/amin/max/min/argmax/argmin over an empty dim are errors in eager; their decompositions
report a statically empty dim and otherwise assume the dim is non-empty at run time, as the
prims do. logsumexp over a statically empty dim is -inf (log of an empty sum), as in eager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy

from ember.ir import DType, Value
from ember.ir.expr import Dim, as_sympy, simplify_dim
from ember.prims.decomp.context import DecompContext, DecompositionError, EagerRuntimeError
from ember.prims.decomp.pointwise import opmath
from ember.prims.decomp.table import register_decomposition

# ---- helpers (norms.py uses them too) ------------------------------------------------------


def reduced_count(ctx: DecompContext, x: Value, dims: Sequence[int]) -> Dim:
    """How many elements each output of a reduction over `dims` combines (maybe symbolic)."""
    n: Any = 1
    shape = ctx.shape(x)
    for d in dims:
        n = as_sympy(n) * as_sympy(shape[d])
    return simplify_dim(n)


def expand_back(ctx: DecompContext, r: Value, shape: Sequence[Dim], dims: Sequence[int]
                ) -> Value:
    """A reduction result (shape without `dims`) broadcast back to `shape`."""
    if not dims:
        return r
    kept = [i for i in range(len(shape)) if i not in dims]
    return ctx.prim("broadcast_in_dim", r, shape=list(shape), broadcast_dims=kept)


def reduce(ctx: DecompContext, prim: str, x: Value, dims: Sequence[int]) -> Value:
    """prims.<prim> over dims (nothing emitted for no dims: the reduction is the identity)."""
    return ctx.prim(prim, x, dims=list(dims)) if dims else x


def keep(ctx: DecompContext, r: Value, dims: Sequence[int], keepdim: bool) -> Value:
    """The reduced dims back as size 1 if keepdim."""
    return ctx.keepdim(r, dims, ctx.rank(r) + len(dims)) if keepdim else r


def divide(ctx: DecompContext, x: Value, n: Any) -> Value:
    """x / n for a count n (a number or size expression); nothing emitted for n == 1."""
    return x if isinstance(n, int) and n == 1 else ctx.prim("div", x, n)


def as_vector(ctx: DecompContext, x: Value) -> Value:
    """A 0-dim tensor as shape [1], so dim 0 exists (torch lets 0-dim tensors take dim 0/-1)."""
    return ctx.prim("reshape", x, shape=[1]) if ctx.rank(x) == 0 else x


def moments(ctx: DecompContext, x: Value, dims: Sequence[int], *, empty_mean_zero: bool = False
            ) -> tuple[Value, Value, Value]:
    """(mean, sum of squared deviations, x - mean) over dims, two-pass, in x's dtype. The mean
    over an empty set is NaN (0 / 0), or 0 with `empty_mean_zero` (as eager's norm kernels)."""
    n = reduced_count(ctx, x, dims)
    n_mean: Any = n
    if empty_mean_zero:  # the sum of an empty set is 0: dividing by max(n, 1) gives 0
        n_mean = max(n, 1) if isinstance(n, int) else sympy.Max(as_sympy(n), 1)
    mean = divide(ctx, reduce(ctx, "sum", x, dims), n_mean)
    xc = ctx.prim("sub", x, expand_back(ctx, mean, ctx.shape(x), dims))
    m2 = reduce(ctx, "sum", ctx.prim("mul", xc, xc), dims)
    return mean, m2, xc


def _truth(ctx: DecompContext, x: Value) -> Value:
    """x as b8: nonzero (NaN included) is true."""
    return x if ctx.dtype(x) == DType.b8 else ctx.prim("ne", x, 0)


def all_of(ctx: DecompContext, b: Value, dims: Sequence[int]) -> Value:
    """b8 `all` over dims: no false element (true over an empty set)."""
    if not dims:
        return b
    false = ctx.convert(ctx.prim("bitwise_not", b), DType.i64)
    return ctx.prim("eq", ctx.prim("sum", false, dims=list(dims)), 0)


def any_of(ctx: DecompContext, b: Value, dims: Sequence[int]) -> Value:
    """b8 `any` over dims: some true element (false over an empty set)."""
    if not dims:
        return b
    return ctx.prim("ne", ctx.prim("sum", ctx.convert(b, DType.i64), dims=list(dims)), 0)


def _check_nonempty(ctx: DecompContext, x: Value, dims: Sequence[int]) -> None:
    shape = ctx.shape(x)
    for d in dims:
        if shape[d] == 0:
            raise DecompositionError(f"{ctx.node.op}: reduction over the empty dim {d} of "
                                     f"{ctx.ttype(x)} has no identity (eager raises too)")


# ---- sum, prod, mean ------------------------------------------------------------------------


def _accumulate(ctx: DecompContext, prim: str, x: Value, dims: Sequence[int], keepdim: bool
                ) -> Value:
    """sum/prod as eager: the input converted to the result dtype, accumulated in opmath."""
    out = ctx.out_dtype()
    y = ctx.convert(ctx.convert(x, out), opmath(out))
    return ctx.convert(keep(ctx, reduce(ctx, prim, y, dims), dims, keepdim), out)


@register_decomposition("aten.sum.default", "aten.sum.dim_IntList")
def sum_(ctx: DecompContext, self: Value, dim: list[int] | None = None, keepdim: bool = False,
         dtype: DType | None = None) -> Value:
    return _accumulate(ctx, "sum", self, ctx.norm_dims(dim, ctx.rank(self)), keepdim)


@register_decomposition("aten.prod.default", "aten.prod.dim_int")
def prod(ctx: DecompContext, self: Value, dim: int | None = None, keepdim: bool = False,
         dtype: DType | None = None) -> Value:
    return _accumulate(ctx, "prod", self, ctx.norm_dims(dim, ctx.rank(self)), keepdim)


@register_decomposition("aten.mean.default", "aten.mean.dim")
def mean(ctx: DecompContext, self: Value, dim: list[int] | None = None, keepdim: bool = False,
         dtype: DType | None = None) -> Value:
    """The input goes straight to opmath (eager's CPU kernel sums f16 as f32 without rounding
    to the result dtype first); an empty mean is 0 / 0 = NaN."""
    out = ctx.out_dtype()
    dims = ctx.norm_dims(dim, ctx.rank(self))
    x = ctx.convert(self, opmath(out))
    r = divide(ctx, reduce(ctx, "sum", x, dims), reduced_count(ctx, x, dims))
    return ctx.convert(keep(ctx, r, dims, keepdim), out)


# ---- var, std, var_mean, std_mean ----------------------------------------------------------


def _var_divisor(ctx: DecompContext, x: Value, n: Dim, correction: float,
                 shape: Sequence[Dim]) -> Any:
    """max(0, n - correction), eager's divisor: a number, a size expression, or (a symbolic n
    with a fractional correction) a tensor of `shape`."""
    if isinstance(n, int):
        return max(0, n - correction)
    if float(correction).is_integer():
        return sympy.Max(0, as_sympy(n) - int(correction))
    d = ctx.full([], n, ctx.dtype(x), ctx.device(x))
    d = ctx.prim("maximum", ctx.prim("sub", d, correction), 0)
    return ctx.prim("broadcast_in_dim", d, shape=list(shape), broadcast_dims=[])


def _var_mean(ctx: DecompContext, self: Value, dim: list[int] | int | None,
              correction: float | None, unbiased: bool, keepdim: bool
              ) -> tuple[Value, Value]:
    """(var, mean) in opmath, keepdim applied. Two-pass: the mean, then the squared
    deviations divided by max(0, n - correction) (NaN or inf where that is 0, as eager)."""
    if not (ctx.dtype(self).is_floating or ctx.dtype(self).is_complex):
        raise DecompositionError(f"{ctx.node.op}: var/std take floating tensors")
    c = (1 if unbiased else 0) if correction is None else correction
    dims = ctx.norm_dims(dim, ctx.rank(self))
    x = ctx.convert(self, opmath(ctx.out_dtype()))
    mu, m2, _ = moments(ctx, x, dims)
    var = ctx.prim("div", m2, _var_divisor(ctx, x, reduced_count(ctx, x, dims), c, ctx.shape(m2)))
    return keep(ctx, var, dims, keepdim), keep(ctx, mu, dims, keepdim)


@register_decomposition("aten.var.correction", "aten.var.dim")
def var(ctx: DecompContext, self: Value, dim: list[int] | None = None,
        correction: float | None = None, keepdim: bool = False, unbiased: bool = True
        ) -> Value:
    v, _ = _var_mean(ctx, self, dim, correction, unbiased, keepdim)
    return ctx.convert(v, ctx.out_dtype())


@register_decomposition("aten.std.correction")
def std(ctx: DecompContext, self: Value, dim: list[int] | None = None,
        correction: float | None = None, keepdim: bool = False) -> Value:
    v, _ = _var_mean(ctx, self, dim, correction, True, keepdim)
    return ctx.convert(ctx.prim("sqrt", v), ctx.out_dtype())


@register_decomposition("aten.var_mean.correction")
def var_mean(ctx: DecompContext, self: Value, dim: list[int] | None = None,
             correction: float | None = None, keepdim: bool = False) -> tuple[Value, Value]:
    v, mu = _var_mean(ctx, self, dim, correction, True, keepdim)
    return ctx.convert(v, ctx.out_dtype(0)), ctx.convert(mu, ctx.out_dtype(1))


@register_decomposition("aten.std_mean.correction")
def std_mean(ctx: DecompContext, self: Value, dim: list[int] | None = None,
             correction: float | None = None, keepdim: bool = False) -> tuple[Value, Value]:
    v, mu = _var_mean(ctx, self, dim, correction, True, keepdim)
    return (ctx.convert(ctx.prim("sqrt", v), ctx.out_dtype(0)),
            ctx.convert(mu, ctx.out_dtype(1)))


# ---- amax, amin, max, min, argmax, argmin ---------------------------------------------------
# Exact in any dtype: no opmath. NaN propagates (the prims' semantics, as eager); argmax and
# argmin give the first index of the extreme (NaN counting as the extreme).


def _extreme(ctx: DecompContext, prim: str, self: Value, dims: list[int], keepdim: bool
             ) -> Value:
    _check_nonempty(ctx, self, dims)
    return keep(ctx, reduce(ctx, prim, self, dims), dims, keepdim)


@register_decomposition("aten.amax.default")
def amax(ctx: DecompContext, self: Value, dim: list[int], keepdim: bool = False) -> Value:
    return _extreme(ctx, "amax", self, ctx.norm_dims(dim, ctx.rank(self)), keepdim)


@register_decomposition("aten.amin.default")
def amin(ctx: DecompContext, self: Value, dim: list[int], keepdim: bool = False) -> Value:
    return _extreme(ctx, "amin", self, ctx.norm_dims(dim, ctx.rank(self)), keepdim)


def _arg(ctx: DecompContext, prim: str, x: Value, dim: int) -> Value:
    """prims.argmax/argmin of a tensor of rank >= 1 (b8 compared as u8: False < True)."""
    return ctx.prim(prim, ctx.convert(x, DType.u8) if ctx.dtype(x) == DType.b8 else x, dim=dim)


def _extreme_with_index(ctx: DecompContext, reduce_prim: str, arg_prim: str, self: Value,
                        dim: int, keepdim: bool) -> tuple[Value, Value]:
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    x = as_vector(ctx, self)
    _check_nonempty(ctx, x, [d])
    values = ctx.prim(reduce_prim, x, dims=[d])
    indices = _arg(ctx, arg_prim, x, d)
    if keepdim and rank:
        return ctx.keepdim(values, [d], rank), ctx.keepdim(indices, [d], rank)
    return values, indices


@register_decomposition("aten.max.dim")
def max_dim(ctx: DecompContext, self: Value, dim: int, keepdim: bool = False
            ) -> tuple[Value, Value]:
    return _extreme_with_index(ctx, "amax", "argmax", self, dim, keepdim)


@register_decomposition("aten.min.dim")
def min_dim(ctx: DecompContext, self: Value, dim: int, keepdim: bool = False
            ) -> tuple[Value, Value]:
    return _extreme_with_index(ctx, "amin", "argmin", self, dim, keepdim)


@register_decomposition("aten.max.default")
def max_(ctx: DecompContext, self: Value) -> Value:
    return _extreme(ctx, "amax", self, list(range(ctx.rank(self))), False)


@register_decomposition("aten.min.default")
def min_(ctx: DecompContext, self: Value) -> Value:
    return _extreme(ctx, "amin", self, list(range(ctx.rank(self))), False)


def _arg_reduction(ctx: DecompContext, prim: str, self: Value, dim: int | None, keepdim: bool
                   ) -> Value:
    if ctx.dtype(self) == DType.b8:  # eager's argmax/argmin refuse bool (max.dim takes it)
        raise EagerRuntimeError(f"{ctx.node.op}: {prim}(): does not support bool input")
    rank = ctx.rank(self)
    if dim is not None:
        return _index_only(ctx, prim, self, dim, keepdim)
    flat = ctx.prim("reshape", self, shape=[ctx.numel(self)])  # dim=None: the flat index
    _check_nonempty(ctx, flat, [0])
    i = _arg(ctx, prim, flat, 0)
    return ctx.keepdim(i, list(range(rank)), rank) if keepdim else i


def _index_only(ctx: DecompContext, prim: str, self: Value, dim: int, keepdim: bool) -> Value:
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    x = as_vector(ctx, self)
    _check_nonempty(ctx, x, [d])
    i = _arg(ctx, prim, x, d)
    return ctx.keepdim(i, [d], rank) if keepdim and rank else i


@register_decomposition("aten.argmax.default")
def argmax(ctx: DecompContext, self: Value, dim: int | None = None, keepdim: bool = False
           ) -> Value:
    return _arg_reduction(ctx, "argmax", self, dim, keepdim)


@register_decomposition("aten.argmin.default")
def argmin(ctx: DecompContext, self: Value, dim: int | None = None, keepdim: bool = False
           ) -> Value:
    return _arg_reduction(ctx, "argmin", self, dim, keepdim)


# ---- any, all -------------------------------------------------------------------------------


def _logical_dims(ctx: DecompContext, dim: list[int] | int | None, rank: int) -> list[int]:
    """any/all dims: None reduces every dim; an int that dim; a list its dims ([]: none)."""
    if dim is None:
        return list(range(rank))
    if isinstance(dim, int):
        return ctx.norm_dims(dim, rank)
    return ctx.norm_dims(dim, rank) if dim else []


@register_decomposition("aten.any.default", "aten.any.dim", "aten.any.dims")
def any_(ctx: DecompContext, self: Value, dim: list[int] | int | None = None,
         keepdim: bool = False) -> Value:
    """b8 (u8 for u8 input, as eager): true where some element is nonzero (NaN counts)."""
    dims = _logical_dims(ctx, dim, ctx.rank(self))
    r = any_of(ctx, _truth(ctx, self), dims)
    return ctx.convert(keep(ctx, r, dims, keepdim), ctx.out_dtype())


@register_decomposition("aten.all.default", "aten.all.dim", "aten.all.dims")
def all_(ctx: DecompContext, self: Value, dim: list[int] | int | None = None,
         keepdim: bool = False) -> Value:
    """b8 (u8 for u8 input, as eager): true where every element is nonzero."""
    dims = _logical_dims(ctx, dim, ctx.rank(self))
    r = all_of(ctx, _truth(ctx, self), dims)
    return ctx.convert(keep(ctx, r, dims, keepdim), ctx.out_dtype())


# ---- logsumexp ------------------------------------------------------------------------------


@register_decomposition("aten.logsumexp.default")
def logsumexp(ctx: DecompContext, self: Value, dim: list[int], keepdim: bool = False
              ) -> Value:
    """log(sum(exp(x - m))) + m with m the max, taken as 0 where it is infinite (as eager:
    all -inf gives -inf, any +inf gives +inf). Integers compute in the default float dtype."""
    out = ctx.out_dtype()
    x = ctx.convert(self, opmath(out))
    dims = ctx.norm_dims(dim, ctx.rank(x))
    n = reduced_count(ctx, x, dims)
    if isinstance(n, int) and n == 0:  # no max over an empty set: log(0) = -inf
        r = ctx.prim("log", reduce(ctx, "sum", ctx.prim("exp", x), dims))
        return ctx.convert(keep(ctx, r, dims, keepdim), out)
    m = reduce(ctx, "amax", x, dims)
    m = ctx.prim("where", ctx.prim("eq", ctx.prim("abs", m), math.inf), 0.0, m)
    z = ctx.prim("exp", ctx.prim("sub", x, expand_back(ctx, m, ctx.shape(x), dims)))
    r = ctx.prim("add", ctx.prim("log", reduce(ctx, "sum", z, dims)), m)
    return ctx.convert(keep(ctx, r, dims, keepdim), out)


# ---- cumsum, cumprod ------------------------------------------------------------------------


def _scan(ctx: DecompContext, prim: str, self: Value, dim: int) -> Value:
    """The input converted to the result dtype (as eager), scanned in opmath."""
    out = ctx.out_dtype()
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    x = ctx.convert(ctx.convert(self, out), opmath(out))
    r = ctx.prim(prim, x, dim=d) if rank else x  # a 0-dim scan is the identity
    return ctx.convert(r, out)


@register_decomposition("aten.cumsum.default")
def cumsum(ctx: DecompContext, self: Value, dim: int, dtype: DType | None = None) -> Value:
    return _scan(ctx, "cumsum", self, dim)


@register_decomposition("aten.cumprod.default")
def cumprod(ctx: DecompContext, self: Value, dim: int, dtype: DType | None = None) -> Value:
    return _scan(ctx, "cumprod", self, dim)


# ---- norms of vectors ---------------------------------------------------------------------
@register_decomposition("aten.linalg_vector_norm.default")
def linalg_vector_norm(ctx: DecompContext, self: Value, ord: float = 2,
                       dim: list[int] | None = None, keepdim: bool = False,
                       dtype: DType | None = None) -> Value:
    """sum(|x| ** ord) ** (1 / ord), with the special orders 0 (count of non-zeros), 1, 2,
    inf (max |x|) and -inf (min |x|) spelled out as eager computes them."""
    out = ctx.out_dtype()
    dims = ctx.norm_dims(dim, ctx.rank(self))
    x = ctx.prim("abs", ctx.convert(self, opmath(out)))
    if ord == math.inf:
        r = reduce(ctx, "amax", x, dims)
    elif ord == -math.inf:
        r = reduce(ctx, "amin", x, dims)
    elif ord == 0:
        r = reduce(ctx, "sum", ctx.convert(ctx.prim("ne", x, 0), opmath(out)), dims)
    elif ord == 1:
        r = reduce(ctx, "sum", x, dims)
    elif ord == 2:
        r = ctx.prim("sqrt", reduce(ctx, "sum", ctx.prim("mul", x, x), dims))
    else:
        powered = reduce(ctx, "sum", ctx.prim("pow", x, float(ord)), dims)
        r = ctx.prim("pow", powered, 1.0 / float(ord))
    return ctx.convert(keep(ctx, r, dims, keepdim), out)
