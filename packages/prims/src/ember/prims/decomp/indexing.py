"""Decompositions of indexing ops (index, index_put, index_select, gather, scatter, masked_fill,
embedding, select_scatter, slice_scatter, as_strided) and of sorting and scans over a dim
(sort, topk, cummax, cummin, logcumsumexp).

Advanced indexing (`index.Tensor`, `index_put`) is a gather/scatter on the linearized indexed
dims: the indexed dims are moved to the front and flattened to one dim of size N, the index
tensors (broadcast together to shape B, negative entries wrapped) combine into one linear i64
index, and one `prims.gather` (or `scatter`, `scatter_add`) along that dim does the work. The
result dims follow numpy: B replaces the indexed dims in place when they are adjacent, else B
comes first. Only integer index tensors: a bool or uint8 mask selects a data-dependent number
of elements, so its result has no static shape (capture must lower it to `nonzero` first).
Out-of-range indices are not checked (eager raises; ember's result is undefined).

`as_strided` reads its input as row-major contiguous storage with storage offset 0 (values have
no layout): it gathers from the flattened input at `storage_offset + sum(i_d * stride_d)`,
which is what eager gives for a contiguous input.

cummax, cummin and logcumsumexp have no scan prim: they compare every position with every
earlier one (a [.., n, n] triangle), O(n^2) in the scanned dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ember.ir import DType, Value
from ember.ir.expr import Dim, as_sympy, simplify_dim
from ember.prims.decomp.context import DecompContext, DecompositionError
from ember.prims.decomp.pointwise import opmath
from ember.prims.decomp.shape import _clamp, _fill_value, _index
from ember.prims.decomp.table import register_decomposition

I64 = DType.i64


# ---- helpers --------------------------------------------------------------------------------


def _mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return simplify_dim(as_sympy(a) * as_sympy(b))


def _prod(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = _mul(out, d)
    return out


def _same(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(simplify_dim(as_sympy(x) - as_sympy(y)) == 0
                                    for x, y in zip(a, b, strict=True))


def _reshape(ctx: DecompContext, x: Value, shape: Sequence[Dim]) -> Value:
    return x if _same(ctx.shape(x), shape) else ctx.prim("reshape", x, shape=list(shape))


def _permute(ctx: DecompContext, x: Value, dims: Sequence[int]) -> Value:
    if list(dims) == list(range(len(dims))):
        return x
    return ctx.prim("permute", x, dims=list(dims))


def _inverse(perm: Sequence[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _iota(ctx: DecompContext, n: Dim, device: str) -> Value:
    return ctx.prim("iota", length=n, start=0, step=1, dtype=I64, device=device)


def _along(ctx: DecompContext, v: Value, shape: Sequence[Dim], dim: int) -> Value:
    """A 1-d v laid along `dim` of `shape` (broadcast over the other dims)."""
    return ctx.prim("broadcast_in_dim", v, shape=list(shape), broadcast_dims=[dim])


def _index_tensor(ctx: DecompContext, idx: Value) -> Value:
    dt = ctx.dtype(idx)
    if dt in (DType.b8, DType.u8):
        raise DecompositionError(f"{ctx.node.op}: boolean mask indices select a data-dependent "
                                 f"number of elements; only integer index tensors decompose")
    if not dt.is_integer:
        raise DecompositionError(f"{ctx.node.op}: index tensors must be integers, not {dt.name}")
    return ctx.convert(idx, I64)


def _wrap(ctx: DecompContext, idx: Value, size: Dim) -> Value:
    """Negative indices count from the end."""
    return ctx.prim("where", ctx.prim("lt", idx, 0), ctx.prim("add", idx, size), idx)


def _as_vector(ctx: DecompContext, x: Value) -> Value:
    return ctx.prim("reshape", x, shape=[1]) if ctx.rank(x) == 0 else x


def _zero_of(dt: DType) -> Any:
    return False if dt == DType.b8 else 0.0 if dt.is_floating else 0


# ---- advanced indexing ----------------------------------------------------------------------


class _Plan:
    """The linearized form of `self[indices]`: self permuted (indexed dims first) and
    flattened to [N, *rest], the linear index of shape B, and the result layout."""

    def __init__(self, ctx: DecompContext, self_: Value, indices: Sequence[Value | None]):
        shape = ctx.shape(self_)
        rank = len(shape)
        if len(indices) > rank:
            raise DecompositionError(f"{ctx.node.op}: {len(indices)} indices for rank {rank}")
        self.dims = [d for d, t in enumerate(indices) if t is not None]
        if not self.dims:
            raise DecompositionError(f"{ctx.node.op}: no index tensor")
        self.rest = [d for d in range(rank) if d not in self.dims]
        tensors = [_index_tensor(ctx, t) for t in indices if t is not None]
        self.B = list(ctx.broadcast_shapes(*tensors))
        lin: Value | None = None
        for d, t in zip(self.dims, tensors, strict=True):
            t = ctx.broadcast_to(_wrap(ctx, t, shape[d]), self.B)
            lin = t if lin is None else ctx.prim("add", ctx.prim("mul", lin, shape[d]), t)
        assert lin is not None
        self.linear = lin
        self.shape = shape
        self.perm = self.dims + self.rest
        self.rest_shape = [shape[d] for d in self.rest]
        self.nB = _prod(self.B)
        adjacent = self.dims == list(range(self.dims[0], self.dims[-1] + 1))
        self.before = self.dims[0] if adjacent else 0  # rest dims that stay before B

    def flat_self(self, ctx: DecompContext, x: Value) -> Value:
        """x as [N, *rest]."""
        x = _permute(ctx, x, self.perm)
        return _reshape(ctx, x, [_prod([self.shape[d] for d in self.dims]), *self.rest_shape])

    def unflat_self(self, ctx: DecompContext, x: Value) -> Value:
        x = _reshape(ctx, x, [self.shape[d] for d in self.perm])
        return _permute(ctx, x, _inverse(self.perm))

    def gather_index(self, ctx: DecompContext) -> Value:
        """The linear index as [nB, *rest] (for gather/scatter along dim 0)."""
        lin = _reshape(ctx, self.linear, [self.nB])
        return ctx.prim("broadcast_in_dim", lin, shape=[self.nB, *self.rest_shape],
                        broadcast_dims=[0])

    def result_perm(self) -> list[int]:
        """From [*B, *rest] to the result order [*before, *B, *after]."""
        nb, k = len(self.B), self.before
        return ([nb + i for i in range(k)] + list(range(nb))
                + list(range(nb + k, nb + len(self.rest))))

    def result_shape(self) -> list[Dim]:
        rest = self.rest_shape
        return [*rest[:self.before], *self.B, *rest[self.before:]]


@register_decomposition("aten.nonzero.default")
def nonzero(ctx: DecompContext, self: Value) -> Value:
    """Kept whole (an extern call): its row count is data, an unbacked symbol the graph binds
    before it from `(x != 0).sum()` (capture's recorder), so it has no loop form; its result
    type is the node's own (no meta kernel can give it)."""
    out: Value = ctx.b.emit(ctx.node.op, [self], types=[r.type for r in ctx.node.results])[0]
    return out


@register_decomposition("aten.index.Tensor")
def index(ctx: DecompContext, self: Value, indices: list[Value | None]) -> Value:
    plan = _Plan(ctx, self, indices)
    g = ctx.prim("gather", plan.flat_self(ctx, self), plan.gather_index(ctx), dim=0)
    g = _reshape(ctx, g, [*plan.B, *plan.rest_shape])
    return _permute(ctx, g, plan.result_perm())


@register_decomposition("aten.index_put.default")
def index_put(ctx: DecompContext, self: Value, indices: list[Value | None], values: Value,
              accumulate: bool = False) -> Value:
    """self with self[indices] = values (or += values: duplicates add up)."""
    plan = _Plan(ctx, self, indices)
    dt = ctx.dtype(self)
    comp = I64 if accumulate and dt == DType.b8 else dt  # bools accumulate as "any"
    v = ctx.convert(ctx.broadcast_to(values, plan.result_shape()), comp)
    v = _permute(ctx, v, _inverse(plan.result_perm()))
    v = _reshape(ctx, v, [plan.nB, *plan.rest_shape])
    x = plan.flat_self(ctx, ctx.convert(self, comp))
    out = ctx.prim("scatter_add" if accumulate else "scatter", x, plan.gather_index(ctx), v,
                   dim=0)
    out = plan.unflat_self(ctx, out)
    return ctx.prim("ne", out, 0) if comp != dt else out


@register_decomposition("aten.index_copy.default")
def index_copy(ctx: DecompContext, self: Value, dim: int, index: Value, source: Value) -> Value:
    """self with self.select(dim, index[i]) = source.select(dim, i): an index_put along `dim`
    (a static KV cache writes each step's new tokens at `cache_position` this way)."""
    if ctx.rank(self) == 0:
        return _reshape(ctx, ctx.convert(source, ctx.dtype(self)), [])
    d = ctx.norm_dim(dim, ctx.rank(self))
    idx = _reshape(ctx, index, [ctx.numel(index)])
    out: Value = index_put(ctx, self, [None] * d + [idx], source)
    return out


@register_decomposition("aten.index_select.default")
def index_select(ctx: DecompContext, self: Value, dim: int, index: Value) -> Value:
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    idx = _reshape(ctx, _index_tensor(ctx, index), [_prod(ctx.shape(index))])
    x = _as_vector(ctx, self)
    shape = list(ctx.shape(x))
    shape[d] = ctx.shape(idx)[0]
    out = ctx.prim("gather", x, _along(ctx, idx, shape, d), dim=d)
    return _reshape(ctx, out, ctx.shape(ctx.node.results[0])) if rank == 0 else out


@register_decomposition("aten.gather.default")
def gather(ctx: DecompContext, self: Value, dim: int, index: Value,
           sparse_grad: bool = False) -> Value:
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    idx = _index_tensor(ctx, index)
    if rank == 0 or ctx.rank(idx) == 0:
        out = ctx.prim("gather", _as_vector(ctx, self), _as_vector(ctx, idx), dim=d)
        return _reshape(ctx, out, ctx.shape(index))
    return ctx.prim("gather", self, idx, dim=d)


def _scatter(ctx: DecompContext, prim: str, self: Value, dim: int, index: Value,
             src: Value) -> Value:
    """prims.scatter / scatter_add with src cut to index's shape (eager reads only that)."""
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    idx = _index_tensor(ctx, index)
    if ctx.rank(idx) == 0 and rank == 0:
        x, idx, src = _as_vector(ctx, self), _as_vector(ctx, idx), _as_vector(ctx, src)
    else:
        x = self
    ishape = ctx.shape(idx)
    if not _same(ctx.shape(src), ishape):
        src = ctx.prim("slice", src, start=[0] * len(ishape), limit=list(ishape))
    dt = ctx.dtype(self)
    comp = I64 if prim == "scatter_add" and dt == DType.b8 else dt
    out = ctx.prim(prim, ctx.convert(x, comp), idx, ctx.convert(src, comp), dim=d)
    if comp != dt:
        out = ctx.prim("ne", out, 0)
    return _reshape(ctx, out, ctx.shape(self))


@register_decomposition("aten.scatter.src")
def scatter_src(ctx: DecompContext, self: Value, dim: int, index: Value, src: Value) -> Value:
    return _scatter(ctx, "scatter", self, dim, index, src)


@register_decomposition("aten.scatter.value")
def scatter_value(ctx: DecompContext, self: Value, dim: int, index: Value, value: Any
                  ) -> Value:
    dt = ctx.dtype(self)
    src = ctx.full(ctx.shape(index), _fill_value(value, dt), dt, ctx.device(self))
    return _scatter(ctx, "scatter", self, dim, index, src)


@register_decomposition("aten.scatter_add.default")
def scatter_add(ctx: DecompContext, self: Value, dim: int, index: Value, src: Value) -> Value:
    return _scatter(ctx, "scatter_add", self, dim, index, src)


@register_decomposition("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(ctx: DecompContext, self: Value, mask: Value, value: Any) -> Value:
    """where(mask, value, self), self and mask broadcast together (as eager's out-of-place
    form does)."""
    shape, dt = ctx.broadcast_shapes(self, mask), ctx.dtype(self)
    if ctx.dtype(mask) != DType.b8:
        raise DecompositionError(f"{ctx.node.op}: the mask must be b8")
    m, self = ctx.broadcast_to(mask, shape), ctx.broadcast_to(self, shape)
    if ctx.is_tensor(value):
        v: Any = ctx.broadcast_to(ctx.convert(value, dt), shape)
    else:
        v = _fill_value(value, dt)
    return ctx.prim("where", m, v, self)


@register_decomposition("aten.embedding.default")
def embedding(ctx: DecompContext, weight: Value, indices: Value, padding_idx: Any = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    """weight[indices] (padding_idx only matters for the gradient)."""
    if ctx.rank(weight) != 2:
        raise DecompositionError(f"{ctx.node.op}: the weight must be 2-d")
    ishape = ctx.shape(indices)
    m = _prod(ishape)
    dim = ctx.shape(weight)[1]
    idx = _reshape(ctx, _index_tensor(ctx, indices), [m])
    out = ctx.prim("gather", weight, _along(ctx, idx, [m, dim], 0), dim=0)
    return _reshape(ctx, out, [*ishape, dim])


# ---- view inverses ----------------------------------------------------------------------


@register_decomposition("aten.select_scatter.default")
def select_scatter(ctx: DecompContext, self: Value, src: Value, dim: int, index: Any
                   ) -> Value:
    """self with self.select(dim, index) = src."""
    shape = ctx.shape(self)
    d = ctx.norm_dim(dim, len(shape))
    rest = [i for i in range(len(shape)) if i != d]
    s = ctx.prim("broadcast_in_dim", ctx.convert(src, ctx.dtype(self)), shape=list(shape),
                 broadcast_dims=rest)
    i = _index(ctx, index, shape[d])
    hit = ctx.prim("eq", _iota(ctx, shape[d], ctx.device(self)), i)
    return ctx.prim("where", _along(ctx, hit, shape, d), s, self)


@register_decomposition("aten.slice_scatter.default")
def slice_scatter(ctx: DecompContext, self: Value, src: Value, dim: int = 0,
                  start: Dim | None = None, end: Dim | None = None, step: int = 1) -> Value:
    """self with self[start:end:step] along dim = src: src padded into place (interior
    padding for the step), selected by a padded mask."""
    shape = ctx.shape(self)
    rank = len(shape)
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op} cannot slice a 0-dim tensor")
    d = ctx.norm_dim(dim, rank)
    n = shape[d]
    lo = _clamp(ctx, 0 if start is None else start, n)
    length = ctx.shape(src)[d]  # the slice's length (src's own size keeps shapes exact)
    if length == 0:
        return self
    after = simplify_dim(as_sympy(n) - as_sympy(lo) - (as_sympy(length) - 1) * step - 1)
    config = [[0, 0, 0] for _ in range(rank)]
    config[d] = [lo, after, step - 1]
    dt = ctx.dtype(self)
    placed = ctx.prim("pad", ctx.convert(src, dt), _zero_of(dt), config=config)
    ones = ctx.full(ctx.shape(src), True, DType.b8, ctx.device(self))
    mask = ctx.prim("pad", ones, False, config=config)
    return ctx.prim("where", mask, placed, self)


@register_decomposition("aten.diagonal_scatter.default")
def diagonal_scatter(ctx: DecompContext, self: Value, src: Value, offset: int = 0,
                     dim1: int = 0, dim2: int = 1) -> Value:
    """self with self.diagonal(offset, dim1, dim2) = src. With dim1, dim2 moved last, element
    (i, j) of the diagonal (j - i == offset) is src[..., i] (offset >= 0) or src[..., j]:
    src, padded to that dim's size, broadcast along the other, selected by the diagonal."""
    shape = ctx.shape(self)
    rank = len(shape)
    d1, d2 = ctx.norm_dim(dim1, rank), ctx.norm_dim(dim2, rank)
    if d1 == d2:
        raise DecompositionError(f"{ctx.node.op}: dim1 and dim2 must differ")
    perm = [d for d in range(rank) if d not in (d1, d2)] + [d1, d2]
    x = _permute(ctx, self, perm)
    xs = ctx.shape(x)
    n1, n2 = xs[-2], xs[-1]
    along = rank - 2 if offset >= 0 else rank - 1  # src's last dim runs along i or j
    size = n1 if offset >= 0 else n2
    s = ctx.convert(src, ctx.dtype(self))
    length = ctx.shape(s)[-1]
    if length == 0:
        return self
    pad = simplify_dim(as_sympy(size) - as_sympy(length))
    if pad != 0:
        config = [[0, 0, 0] for _ in range(rank - 1)]
        config[-1] = [0, pad, 0]
        s = ctx.prim("pad", s, _zero_of(ctx.dtype(self)), config=config)
    s = ctx.prim("broadcast_in_dim", s, shape=list(xs),
                 broadcast_dims=[*range(rank - 2), along])
    dev = ctx.device(self)
    i = _along(ctx, _iota(ctx, n1, dev), [n1, n2], 0)
    j = _along(ctx, _iota(ctx, n2, dev), [n1, n2], 1)
    hit = ctx.broadcast_to(ctx.prim("eq", ctx.prim("sub", j, i), offset), xs)
    return _permute(ctx, ctx.prim("where", hit, s, x), _inverse(perm))


@register_decomposition("aten.diagonal.default")
def diagonal(ctx: DecompContext, self: Value, offset: int = 0, dim1: int = 0,
             dim2: int = 1) -> Value:
    """self.diagonal(offset, dim1, dim2): dim1 and dim2 moved last and flattened, the diagonal is
    the strided slice of that flat dim from its first element, step n2 + 1. Its length is the
    declared result's last dim (no min/max of sizes needed)."""
    shape = ctx.shape(self)
    rank = len(shape)
    d1, d2 = ctx.norm_dim(dim1, rank), ctx.norm_dim(dim2, rank)
    if d1 == d2:
        raise DecompositionError(f"{ctx.node.op}: dim1 and dim2 must differ")
    out_shape = list(ctx.ttype(ctx.node.results[0]).shape)
    length = out_shape[-1]
    if simplify_dim(as_sympy(length)) == 0:
        return ctx.full(out_shape, 0, ctx.dtype(self), ctx.device(self))
    x = _permute(ctx, self, [d for d in range(rank) if d not in (d1, d2)] + [d1, d2])
    xs = ctx.shape(x)
    n2 = xs[-1]
    flat = _reshape(ctx, x, [*xs[:-2], _mul(xs[-2], n2)])
    start = offset if offset >= 0 else _mul(-offset, n2)
    step = simplify_dim(as_sympy(n2) + 1)
    if not isinstance(step, int):
        raise DecompositionError(f"{ctx.node.op}: needs a concrete size for dim {d2} "
                                 f"(prims.slice takes integer steps), got {n2}")
    limit = simplify_dim(as_sympy(start) + (as_sympy(length) - 1) * as_sympy(step) + 1)
    lead = list(xs[:-2])
    return ctx.prim("slice", flat, start=[0] * len(lead) + [start], limit=[*lead, limit],
                    step=[1] * len(lead) + [step])


@register_decomposition("aten.as_strided.default")
def as_strided(ctx: DecompContext, self: Value, size: list[Dim], stride: list[Dim],
               storage_offset: Dim | None = None) -> Value:
    if len(size) != len(stride):
        raise DecompositionError(f"{ctx.node.op}: size and stride differ in length")
    flat = _reshape(ctx, self, [ctx.numel(self)])
    out = ctx.prim("gather", flat, _strided_positions(ctx, self, size, stride, storage_offset),
                   dim=0)
    return _reshape(ctx, out, size)


def _strided_positions(ctx: DecompContext, self: Value, size: list[Dim], stride: list[Dim],
                       storage_offset: Dim | None) -> Value:
    """The flat (row-major) positions in `self` that as_strided(size, stride, offset) reads,
    as a 1-d i64 tensor."""
    dev = ctx.device(self)
    offset = storage_offset or 0
    pos: Value | None = None
    for dim, (n, s) in enumerate(zip(size, stride, strict=True)):
        i = ctx.prim("iota", length=n, start=0, step=s, dtype=I64, device=dev)
        i = _along(ctx, i, size, dim)
        pos = i if pos is None else ctx.prim("add", pos, i)
    if pos is None:
        pos = ctx.full([], offset, I64, dev)
    elif not (isinstance(offset, int) and offset == 0):
        pos = ctx.prim("add", pos, offset)
    return _reshape(ctx, pos, [_prod(size)])


@register_decomposition("aten.as_strided_scatter.default")
def as_strided_scatter(ctx: DecompContext, self: Value, src: Value, size: list[Dim],
                       stride: list[Dim], storage_offset: Dim | None = None) -> Value:
    """self (read as its row-major storage) with the elements as_strided reads replaced by
    src; functionalization's inverse of a write through as_strided."""
    if len(size) != len(stride):
        raise DecompositionError(f"{ctx.node.op}: size and stride differ in length")
    pos = _strided_positions(ctx, self, size, stride, storage_offset)
    flat = _reshape(ctx, self, [ctx.numel(self)])
    v = _reshape(ctx, ctx.convert(src, ctx.dtype(self)), [_prod(size)])
    out = ctx.prim("scatter", flat, pos, v, dim=0)
    return _reshape(ctx, out, list(ctx.shape(self)))


# ---- sort, topk ---------------------------------------------------------------------------


def _sorted(ctx: DecompContext, self: Value, dim: int, descending: bool) -> list[Value]:
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    if rank == 0:
        return [self, ctx.full([], 0, I64, ctx.device(self))]
    return ctx.prims("sort", self, dim=d, descending=descending)


@register_decomposition("aten.sort.default")
def sort(ctx: DecompContext, self: Value, dim: int = -1, descending: bool = False
         ) -> list[Value]:
    """prims.sort is stable: one valid answer of eager's unstable sort."""
    return _sorted(ctx, self, dim, descending)


@register_decomposition("aten.sort.stable")
def sort_stable(ctx: DecompContext, self: Value, stable: bool | None, dim: int = -1,
                descending: bool = False) -> list[Value]:
    return _sorted(ctx, self, dim, descending)


@register_decomposition("aten.topk.default")
def topk(ctx: DecompContext, self: Value, k: Dim, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> list[Value]:
    """prims.topk's sorted order is one valid answer for sorted=False."""
    rank = ctx.rank(self)
    d = ctx.norm_dim(dim, rank)
    if rank == 0:  # eager gives the element for k = 0 and 1
        return [self, ctx.full([], 0, I64, ctx.device(self))]
    return ctx.prims("topk", self, k=k, dim=d, largest=largest)


# ---- cummax, cummin, logcumsumexp -------------------------------------------------------


class _Triangle:
    """x with the scanned dim moved last ([..., n]) and spread to [..., n(i), n(j)] with
    the mask j <= i."""

    def __init__(self, ctx: DecompContext, x: Value, dim: int):
        rank = ctx.rank(x)
        self.d = ctx.norm_dim(dim, rank)
        self.perm = [i for i in range(rank) if i != self.d] + [self.d]
        self.x = _permute(ctx, x, self.perm)
        shape = list(ctx.shape(self.x))
        n = shape[-1]
        self.n = n
        self.sq = [*shape, n]  # [..., i, j]
        lead = list(range(rank - 1))
        self.xj = ctx.prim("broadcast_in_dim", self.x, shape=self.sq,
                           broadcast_dims=[*lead, rank])
        dev = ctx.device(x)
        it = _iota(ctx, n, dev)
        i2 = ctx.prim("broadcast_in_dim", it, shape=[n, n], broadcast_dims=[0])
        j2 = ctx.prim("broadcast_in_dim", it, shape=[n, n], broadcast_dims=[1])
        self.j = ctx.broadcast_to(j2, self.sq)
        self.mask = ctx.broadcast_to(ctx.prim("le", j2, i2), self.sq)

    def spread_i(self, ctx: DecompContext, v: Value) -> Value:
        """A [..., n(i)] value spread over j."""
        rank = len(self.sq) - 1
        return ctx.prim("broadcast_in_dim", v, shape=self.sq, broadcast_dims=list(range(rank)))

    def back(self, ctx: DecompContext, v: Value) -> Value:
        return _permute(ctx, v, _inverse(self.perm))


def _cumext(ctx: DecompContext, self: Value, dim: int, largest: bool) -> list[Value]:
    """eager's rule: an element replaces the running extreme when it is NaN or, while the
    extreme is not NaN, when it is >= (<=) it; so the index is the last NaN so far, else the
    last position of the extreme."""
    rank = ctx.rank(self)
    if rank == 0 or ctx.shape(self)[ctx.norm_dim(dim, rank)] == 0:  # nothing to scan
        return [self, ctx.full(ctx.shape(self), 0, I64, ctx.device(self))]
    dt = ctx.dtype(self)
    x = ctx.convert(self, DType.u8) if dt == DType.b8 else self
    cdt = ctx.dtype(x)
    t = _Triangle(ctx, x, dim)
    p = ctx.prim
    if cdt.is_floating:
        fill: Any = -math.inf if largest else math.inf
    else:
        info = torch.iinfo(cdt.torch)
        fill = info.min if largest else info.max
    ext = p("amax" if largest else "amin", p("where", t.mask, t.xj, fill), dims=[rank])
    e = t.spread_i(ctx, ext)
    hit = p("eq", t.xj, e)
    if cdt.is_floating:
        hit = p("bitwise_or", hit, p("bitwise_and", p("ne", t.xj, t.xj), p("ne", e, e)))
    hit = p("bitwise_and", hit, t.mask)
    idx = p("amax", p("where", hit, t.j, -1), dims=[rank])
    vals = p("gather", t.x, idx, dim=rank - 1)  # the element itself: -0.0 and 0.0 differ
    if dt == DType.b8:
        vals = p("ne", vals, 0)
    return [t.back(ctx, vals), t.back(ctx, idx)]


@register_decomposition("aten.cummax.default")
def cummax(ctx: DecompContext, self: Value, dim: int) -> list[Value]:
    return _cumext(ctx, self, dim, largest=True)


@register_decomposition("aten.cummin.default")
def cummin(ctx: DecompContext, self: Value, dim: int) -> list[Value]:
    return _cumext(ctx, self, dim, largest=False)


@register_decomposition("aten.logcumsumexp.default")
def logcumsumexp(ctx: DecompContext, self: Value, dim: int) -> Value:
    """out[i] = logsumexp(x[:i+1]) with the running max subtracted, in opmath."""
    out = ctx.out_dtype()
    rank = ctx.rank(self)
    if rank == 0 or ctx.shape(self)[ctx.norm_dim(dim, rank)] == 0:  # nothing to scan
        return ctx.convert(self, out)
    x = ctx.convert(ctx.convert(self, out), opmath(out))
    t = _Triangle(ctx, x, dim)
    p = ctx.prim
    xs = p("where", t.mask, t.xj, -math.inf)
    m = p("amax", xs, dims=[rank])
    m = p("where", p("eq", p("abs", m), math.inf), 0.0, m)
    z = p("exp", p("sub", xs, t.spread_i(ctx, m)))
    r = p("add", p("log", p("sum", z, dims=[rank])), m)
    return ctx.convert(t.back(ctx, r), out)


# ---- histc ----------------------------------------------------------------------------------


@register_decomposition("aten.histc.default")
def histc(ctx: DecompContext, self: Value, bins: int = 100, min: Any = 0, max: Any = 0
          ) -> Value:
    """Counts of self's elements in `bins` equal bins over [min, max], as eager's kernels: an
    element x in range goes to bin trunc((x - min) * bins / (max - min)) (x == max to the
    last), computed in self's dtype (floats) or i64 (integers, as the CUDA kernel); elements out
    of range and NaN are not counted. min == max takes the data's extrema (one reduction each),
    widened by 1 either side where they are equal too. One scatter_add of ones into `bins`
    zeros: MoE routers count tokens per expert this way (transformers' grouped_mm experts)."""
    dt = ctx.dtype(self)
    if dt in (DType.b8, DType.u8) or not (dt.is_floating or dt.is_integer):
        raise DecompositionError(f"{ctx.node.op}: histc of {dt.name} tensors")
    if not isinstance(bins, int) or isinstance(bins, bool) or bins <= 0:
        raise DecompositionError(f"{ctx.node.op}: bins must be a positive integer, got {bins!r}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (min, max)):
        raise DecompositionError(f"{ctx.node.op}: min and max must be numbers (literals)")
    n = ctx.numel(self)
    dev = ctx.device(self)
    comp = dt if dt.is_floating else I64
    p = ctx.prim
    x = ctx.convert(_reshape(ctx, self, [n]), comp)
    lo: Any
    hi: Any
    if min == max and not (isinstance(n, int) and n == 0):  # the data's range
        lo, hi = p("amin", x, dims=[0]), p("amax", x, dims=[0])
        same = p("eq", lo, hi)
        lo, hi = p("where", same, p("sub", lo, 1), lo), p("where", same, p("add", hi, 1), hi)
        lo, hi = ctx.broadcast_to(lo, [n]), ctx.broadcast_to(hi, [n])
        span: Any = p("sub", hi, lo)
    else:
        if min > max:
            raise DecompositionError(f"{ctx.node.op}: max must be larger than min")
        lo, hi = (min - 1, max + 1) if min == max else (min, max)
        if dt.is_floating:  # the edges and their distance in self's dtype, as eager's
            edges = [torch.tensor(v, dtype=dt.torch) for v in (lo, hi)]
            lo, hi, span = float(edges[0]), float(edges[1]), float(edges[1] - edges[0])
        else:  # the kernel's integer edges (a C++ conversion: toward zero)
            lo, hi = int(lo), int(hi)
            span = hi - lo
    inside = p("bitwise_and", p("ge", x, lo), p("le", x, hi))  # False for NaN
    xs = p("where", inside, x, lo)  # out-of-range values never reach the int conversion
    if dt.is_floating:
        pos = p("trunc", p("div", p("mul", p("sub", xs, lo), bins), span))
        pos = ctx.convert(pos, I64)
    else:  # i64: trunc division, and the operands are >= 0
        pos = p("div", p("mul", p("sub", xs, lo), bins), span)
    pos = p("minimum", pos, bins - 1)  # x == max: the last bin includes its right edge
    ones = ctx.convert(inside, dt)  # 1 where counted
    zeros = ctx.full([bins], _zero_of(dt), dt, dev)
    return ctx.prim("scatter_add", zeros, pos, ones, dim=0)
