"""Decompositions of shape and view ops: view/reshape, permute/transpose, expand, squeeze,
slicing, splitting, joining, repeat/roll/flip, constant padding, copies and conversions.

Values in ember's IR are immutable, so a view is just an op producing a value: aliasing is
the business of functionalization (capture) and the runtime, not of these decompositions. An
op that changes nothing (a clone, a full slice, a permutation that is the identity) emits no
prim and returns its operand.

Sizes may be symbolic: clamping (slice ends, negative indices) uses `min`/`max` over size
expressions, `view`'s -1 is `numel // product(others)` (an exact quotient when sympy can
divide), and roll's shift is `mod(shift, size)`. Where the number of results depends on a
size (split, unbind) the decomposition specialises at the symbols' hints, as the aten node's
own result types do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ember.ir import DType, Value
from ember.ir.expr import INT64_MAX, Dim, FloorDiv, PyMod, as_sympy, evaluate, simplify_dim
from ember.ir.verifier import dims_equal
from ember.prims.decomp.context import DecompContext, DecompositionError, runtime_scalar_error
from ember.prims.decomp.table import register_decomposition

# ---- size arithmetic (ints stay ints; expressions stay exact) ------------------------------


def _add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return simplify_dim(as_sympy(a) + as_sympy(b))


def _mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return simplify_dim(as_sympy(a) * as_sympy(b))


def _le(ctx: DecompContext, a: Dim, b: Dim) -> bool:
    """a <= b for every size the declared symbol bounds allow (False when unknown): each
    symbol s with `min=m` is written as m + t, t >= 0."""
    diff = as_sympy(b) - as_sympy(a)
    symbols = ctx.b.module.symbols
    shift = {s: s + (symbols[s.name].min or 0) for s in diff.free_symbols
             if isinstance(s, sympy.Symbol) and s.name in symbols}
    return bool(sympy.expand(diff.subs(shift, simultaneous=True)).is_nonnegative)


def _min(ctx: DecompContext, a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if _le(ctx, a, b) or _le(ctx, b, a):
        return a if _le(ctx, a, b) else b
    return simplify_dim(sympy.Min(as_sympy(a), as_sympy(b)))


def _max(ctx: DecompContext, a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if _le(ctx, a, b) or _le(ctx, b, a):
        return b if _le(ctx, a, b) else a
    return simplify_dim(sympy.Max(as_sympy(a), as_sympy(b)))


def _prod(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = _mul(out, d)
    return out


def _exact_div(n: Dim, d: Dim) -> Dim:
    """n / d where d divides n (a reshape's -1): the exact quotient when sympy finds one, else
    `n // d`."""
    if isinstance(n, int) and isinstance(d, int):
        return n // d if d else 0
    q = sympy.cancel(as_sympy(n) / as_sympy(d))
    if q.is_integer:  # e.g. 3 * s0 * s1 / s1 = 3 * s0; not s0 / 2
        return simplify_dim(q)
    return simplify_dim(FloorDiv(as_sympy(n), as_sympy(d)))


def _hint(ctx: DecompContext, d: Dim) -> int:
    """A size at the symbols' hints (what the aten node's meta kernel saw)."""
    if isinstance(d, int):
        return d
    if isinstance(d, Value):  # a scalar known only at run time (passes.py refuses most)
        raise runtime_scalar_error(ctx.node.op, "a size", d)
    try:
        return evaluate(d, ctx.b.module.hints())
    except Exception as e:
        raise DecompositionError(f"{ctx.node.op}: size {d} has no value at the symbols' "
                                 f"hints ({e})") from None


def _negative(ctx: DecompContext, i: Dim) -> bool:
    """Whether an index argument counts from the end (decided at the hints when symbolic)."""
    return _hint(ctx, i) < 0


def _same_shape(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b, strict=True))


# ---- building blocks --------------------------------------------------------------------


def _reshape(ctx: DecompContext, x: Value, shape: Sequence[Dim]) -> Value:
    if _same_shape(ctx.shape(x), shape):
        return x
    return ctx.prim("reshape", x, shape=list(shape))


def _slice_dim(ctx: DecompContext, x: Value, dim: int, start: Dim, limit: Dim,
               step: int = 1) -> Value:
    """x[start:limit:step] along dim (0 <= start <= limit <= size)."""
    shape = ctx.shape(x)
    if step == 1 and dims_equal(start, 0) and dims_equal(limit, shape[dim]):
        return x
    starts: list[Dim] = [0] * len(shape)
    limits: list[Dim] = list(shape)
    starts[dim], limits[dim] = start, limit
    kw: dict[str, Any] = {"start": starts, "limit": limits}
    if step != 1:
        steps = [1] * len(shape)
        steps[dim] = step
        kw["step"] = steps
    return ctx.prim("slice", x, **kw)


def _squeeze(ctx: DecompContext, x: Value, dims: Sequence[int]) -> Value:
    shape = ctx.shape(x)
    drop = sorted({d for d in dims if isinstance(shape[d], int) and shape[d] == 1})
    return ctx.prim("squeeze", x, dims=drop) if drop else x


def _unsqueeze(ctx: DecompContext, x: Value, dim: int) -> Value:
    return ctx.prim("unsqueeze", x, dims=[dim])


def _index(ctx: DecompContext, i: Dim, size: Dim) -> Dim:
    """A possibly negative index as a non-negative one."""
    return _add(i, size) if _negative(ctx, i) else i


def _permute(ctx: DecompContext, x: Value, dims: Sequence[int]) -> Value:
    if list(dims) == list(range(len(dims))):
        return x
    return ctx.prim("permute", x, dims=list(dims))


# ---- views: reshape, permute, expand, squeeze ---------------------------------------------


def _infer_size(ctx: DecompContext, x: Value, size: Sequence[Dim]) -> list[Dim]:
    """view/reshape sizes with the -1 (at most one) filled in."""
    out = list(size)
    holes = [i for i, s in enumerate(out) if isinstance(s, int) and s == -1]
    if len(holes) > 1:
        raise DecompositionError(f"{ctx.node.op}: only one dimension can be -1, got {size}")
    if holes:
        others = _prod([s for i, s in enumerate(out) if i != holes[0]])
        out[holes[0]] = _exact_div(ctx.numel(x), others)
    return out


@register_decomposition("aten.view.default", "aten.view_copy.default",
                        "aten._unsafe_view.default")
def view(ctx: DecompContext, self: Value, size: list[Dim]) -> Value:
    return _reshape(ctx, self, _infer_size(ctx, self, size))


@register_decomposition("aten.reshape.default")
def reshape(ctx: DecompContext, self: Value, shape: list[Dim]) -> Value:
    return _reshape(ctx, self, _infer_size(ctx, self, shape))


@register_decomposition("aten.flatten.using_ints")
def flatten(ctx: DecompContext, self: Value, start_dim: int = 0, end_dim: int = -1) -> Value:
    shape = ctx.shape(self)
    if not shape:
        return _reshape(ctx, self, [1])
    s, e = ctx.norm_dim(start_dim, len(shape)), ctx.norm_dim(end_dim, len(shape))
    if s > e:
        raise DecompositionError(f"{ctx.node.op}: start_dim {start_dim} comes after end_dim "
                                 f"{end_dim}")
    return _reshape(ctx, self, [*shape[:s], _prod(shape[s:e + 1]), *shape[e + 1:]])


@register_decomposition("aten.permute.default", "aten.permute_copy.default")
def permute(ctx: DecompContext, self: Value, dims: list[int]) -> Value:
    rank = ctx.rank(self)
    if len(dims) != rank:
        raise DecompositionError(f"{ctx.node.op}: {len(dims)} dims for rank {rank}")
    perm = [ctx.norm_dim(d, rank) for d in dims]
    return _permute(ctx, self, perm)


@register_decomposition("aten.transpose.int", "aten.transpose_copy.int")
def transpose(ctx: DecompContext, self: Value, dim0: int, dim1: int) -> Value:
    rank = ctx.rank(self)
    a, b = ctx.norm_dim(dim0, rank), ctx.norm_dim(dim1, rank)
    perm = list(range(rank))
    if rank:
        perm[a], perm[b] = perm[b], perm[a]
    return _permute(ctx, self, perm)


@register_decomposition("aten.t.default", "aten.t_copy.default")
def t(ctx: DecompContext, self: Value) -> Value:
    rank = ctx.rank(self)
    if rank > 2:
        raise DecompositionError(f"{ctx.node.op} takes a tensor of rank <= 2, got {rank}")
    return _permute(ctx, self, [1, 0]) if rank == 2 else self


@register_decomposition("aten.expand.default", "aten.expand_copy.default")
def expand(ctx: DecompContext, self: Value, size: list[Dim], implicit: bool = False) -> Value:
    shape = ctx.shape(self)
    off = len(size) - len(shape)
    if off < 0:
        raise DecompositionError(f"{ctx.node.op}: {len(size)} sizes for rank {len(shape)}")
    out: list[Dim] = []
    for i, s in enumerate(size):
        minus_one = isinstance(s, int) and s == -1
        if i < off:
            if minus_one:
                raise DecompositionError(f"{ctx.node.op}: -1 is not allowed for a new "
                                         f"leading dim ({size})")
            out.append(s)
        else:
            out.append(shape[i - off] if minus_one else s)
    return ctx.broadcast_to(self, out)


@register_decomposition("aten.squeeze.default", "aten.squeeze_copy.default")
def squeeze(ctx: DecompContext, self: Value) -> Value:
    return _squeeze(ctx, self, range(ctx.rank(self)))


@register_decomposition("aten.squeeze.dim", "aten.squeeze_copy.dim")
def squeeze_dim(ctx: DecompContext, self: Value, dim: int) -> Value:
    rank = ctx.rank(self)
    return _squeeze(ctx, self, [ctx.norm_dim(dim, rank)] if rank else [])


@register_decomposition("aten.squeeze.dims", "aten.squeeze_copy.dims")
def squeeze_dims(ctx: DecompContext, self: Value, dim: list[int]) -> Value:
    rank = ctx.rank(self)
    dims = [ctx.norm_dim(d, rank) for d in dim]
    if len(set(dims)) != len(dims):
        raise DecompositionError(f"{ctx.node.op}: repeated dims {dim}")
    return _squeeze(ctx, self, dims if rank else [])


@register_decomposition("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def unsqueeze(ctx: DecompContext, self: Value, dim: int) -> Value:
    return _unsqueeze(ctx, self, ctx.norm_dim(dim, ctx.rank(self) + 1))


# ---- slicing and splitting ----------------------------------------------------------------


@register_decomposition("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(ctx: DecompContext, self: Value, dim: int = 0, start: Dim | None = None,
           end: Dim | None = None, step: int = 1) -> Value:
    """Eager's clamping: negative bounds count from the end, then both clamp to [0, size] and
    the end to at least the start."""
    rank = ctx.rank(self)
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op} cannot slice a 0-dim tensor")
    if not isinstance(step, int) or step < 1:
        raise DecompositionError(f"{ctx.node.op}: step must be a positive int, got {step}")
    d = ctx.norm_dim(dim, rank)
    n = ctx.shape(self)[d]
    a: Dim = 0 if start is None else start
    b: Dim = INT64_MAX if end is None else end
    lo = _clamp(ctx, a, n)
    if isinstance(a, int) and isinstance(b, int) and (a < 0) == (b < 0):
        hi = _clamp(ctx, max(a, b), n)  # the same clamp of the larger bound: simpler
    else:
        hi = _max(ctx, lo, _clamp(ctx, b, n))
    return _slice_dim(ctx, self, d, lo, hi, step)


def _clamp(ctx: DecompContext, i: Dim, n: Dim) -> Dim:
    """A slice bound as eager clamps it: negative counts from the end, then into [0, n]."""
    if isinstance(i, int) and isinstance(n, int):
        return min(max(i + n if i < 0 else i, 0), n)
    if isinstance(i, int):  # a literal bound of a symbolic size: drop the clamps that hold
        if i >= INT64_MAX:
            return n  # sizes never exceed INT64_MAX
        return (0 if i == 0 else _min(ctx, i, n)) if i >= 0 else _max(ctx, _add(n, i), 0)
    return _min(ctx, _max(ctx, _index(ctx, i, n), 0), n)


@register_decomposition("aten.select.int", "aten.select_copy.int")
def select(ctx: DecompContext, self: Value, dim: int, index: Dim) -> Value:
    rank = ctx.rank(self)
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op} cannot select from a 0-dim tensor")
    d = ctx.norm_dim(dim, rank)
    i = _index(ctx, index, ctx.shape(self)[d])
    return _squeeze(ctx, _slice_dim(ctx, self, d, i, _add(i, 1)), [d])


@register_decomposition("aten.narrow.default", "aten.narrow_copy.default")
def narrow(ctx: DecompContext, self: Value, dim: int, start: Dim, length: Dim) -> Value:
    rank = ctx.rank(self)
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op} cannot narrow a 0-dim tensor")
    d = ctx.norm_dim(dim, rank)
    s = _index(ctx, start, ctx.shape(self)[d])
    return _slice_dim(ctx, self, d, s, _add(s, length))


@register_decomposition("aten.split.Tensor", "aten.split_copy.Tensor")
def split(ctx: DecompContext, self: Value, split_size: Dim, dim: int = 0) -> list[Value]:
    """Chunks of split_size (the last one smaller). The number of chunks is fixed at the hints;
    the last chunk runs to the (possibly symbolic) end."""
    rank = ctx.rank(self)
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op} cannot split a 0-dim tensor")
    d = ctx.norm_dim(dim, rank)
    n = ctx.shape(self)[d]
    n_hint, k_hint = _hint(ctx, n), _hint(ctx, split_size)
    if k_hint < 0 or (k_hint == 0 and n_hint != 0):
        raise DecompositionError(f"{ctx.node.op}: split_size {split_size} for a dim of size "
                                 f"{n}")
    count = max(1, -(-n_hint // k_hint)) if k_hint else 1
    return [_slice_dim(ctx, self, d, _mul(i, split_size),
                       n if i == count - 1 else _mul(i + 1, split_size))
            for i in range(count)]


@register_decomposition("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def split_with_sizes(ctx: DecompContext, self: Value, split_sizes: list[Dim],
                     dim: int = 0) -> list[Value]:
    rank = ctx.rank(self)
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op} cannot split a 0-dim tensor")
    d = ctx.norm_dim(dim, rank)
    out, start = [], 0
    for s in split_sizes:
        end = _add(start, s)
        out.append(_slice_dim(ctx, self, d, start, end))
        start = end
    return out


@register_decomposition("aten.unbind.int", "aten.unbind_copy.int")
def unbind(ctx: DecompContext, self: Value, dim: int = 0) -> list[Value]:
    """One result per index of dim: as many as the dim has at the hints."""
    rank = ctx.rank(self)
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op} cannot unbind a 0-dim tensor")
    d = ctx.norm_dim(dim, rank)
    return [_squeeze(ctx, _slice_dim(ctx, self, d, i, i + 1), [d])
            for i in range(_hint(ctx, ctx.shape(self)[d]))]


# ---- joining ------------------------------------------------------------------------------


@register_decomposition("aten.cat.default")
def cat(ctx: DecompContext, tensors: list[Value], dim: int = 0) -> Value:
    """Operands promote to the result dtype; 1-d empty tensors are skipped (eager's legacy
    rule), as are operands empty along dim when others remain."""
    out = ctx.out_dtype()
    if not tensors:
        raise DecompositionError(f"{ctx.node.op} needs at least one tensor")
    kept = [x for x in tensors if not (ctx.shape(x) == (0,))]
    if not kept:
        return ctx.full([0], False if out == DType.b8 else 0, out, ctx.device(tensors[0]))
    rank = ctx.rank(kept[0])
    if rank == 0:
        raise DecompositionError(f"{ctx.node.op}: zero-dimensional tensors cannot be joined")
    d = ctx.norm_dim(dim, rank)
    nonempty = [x for x in kept if not (isinstance(ctx.shape(x)[d], int)
                                         and ctx.shape(x)[d] == 0)]
    xs = [ctx.convert(x, out) for x in (nonempty or kept[:1])]
    return xs[0] if len(xs) == 1 else ctx.prim("concatenate", xs, dim=d)


@register_decomposition("aten.stack.default")
def stack(ctx: DecompContext, tensors: list[Value], dim: int = 0) -> Value:
    out = ctx.out_dtype()
    if not tensors:
        raise DecompositionError(f"{ctx.node.op} needs at least one tensor")
    d = ctx.norm_dim(dim, ctx.rank(tensors[0]) + 1)
    xs = [_unsqueeze(ctx, ctx.convert(x, out), d) for x in tensors]
    return xs[0] if len(xs) == 1 else ctx.prim("concatenate", xs, dim=d)


@register_decomposition("aten.repeat.default")
def repeat(ctx: DecompContext, self: Value, repeats: list[Dim]) -> Value:
    """Broadcast x to [r0, .., r_i, x_i, ..] (a new dim before each of x's) and merge pairs."""
    shape = ctx.shape(self)
    off = len(repeats) - len(shape)
    if off < 0:
        raise DecompositionError(f"{ctx.node.op}: {len(repeats)} repeats for rank "
                                 f"{len(shape)}")
    if off == 0 and all(isinstance(r, int) and r == 1 for r in repeats):
        return self
    wide: list[Dim] = list(repeats[:off])
    bdims: list[int] = []
    merged: list[Dim] = list(repeats[:off])
    for r, n in zip(repeats[off:], shape, strict=True):
        wide += [r, n]
        bdims.append(len(wide) - 1)
        merged.append(_mul(r, n))
    big = ctx.prim("broadcast_in_dim", self, shape=wide, broadcast_dims=bdims)
    return _reshape(ctx, big, merged)


# ---- reordering ---------------------------------------------------------------------------


def _roll_dim(ctx: DecompContext, x: Value, d: int, shift: Dim) -> Value:
    n = ctx.shape(x)[d]
    if isinstance(n, int) and isinstance(shift, int):
        if n == 0 or shift % n == 0:
            return x
        cut: Dim = n - shift % n
    else:
        cut = simplify_dim(as_sympy(n) - PyMod(as_sympy(shift), as_sympy(n)))
    tail = _slice_dim(ctx, x, d, cut, n)
    head = _slice_dim(ctx, x, d, 0, cut)
    return ctx.prim("concatenate", [tail, head], dim=d)


@register_decomposition("aten.roll.default")
def roll(ctx: DecompContext, self: Value, shifts: list[Dim], dims: list[int]) -> Value:
    """out[i] = x[(i - shift) mod n]: the last `shift` elements move to the front."""
    shape = ctx.shape(self)
    if not dims:
        if len(shifts) != 1:
            raise DecompositionError(f"{ctx.node.op}: without dims it takes one shift")
        flat = _roll_dim(ctx, _reshape(ctx, self, [ctx.numel(self)]), 0, shifts[0])
        return _reshape(ctx, flat, shape)
    if len(shifts) != len(dims):
        raise DecompositionError(f"{ctx.node.op}: {len(shifts)} shifts for {len(dims)} dims")
    x = self
    for s, dim in zip(shifts, dims, strict=True):
        x = _roll_dim(ctx, x, ctx.norm_dim(dim, len(shape)), s)
    return x


@register_decomposition("aten.flip.default")
def flip(ctx: DecompContext, self: Value, dims: list[int]) -> Value:
    rank = ctx.rank(self)
    ds = [ctx.norm_dim(d, rank) for d in dims]
    if len(set(ds)) != len(ds):
        raise DecompositionError(f"{ctx.node.op}: repeated dims {dims}")
    ds = sorted(d for d in ds if d < rank)
    return ctx.prim("rev", self, dims=ds) if ds else self


# ---- padding ------------------------------------------------------------------------------


def _fill_value(value: Any, dtype: DType) -> Any:
    """A Python number as eager writes it into a tensor of dtype (integers truncate and wrap)."""
    if isinstance(value, Value):
        return value
    if dtype == DType.b8:
        return bool(value)
    if dtype.is_integer:
        return int(torch.tensor(int(value), dtype=torch.int64).to(dtype.torch).item())
    return float(value)


@register_decomposition("aten.constant_pad_nd.default")
def constant_pad_nd(ctx: DecompContext, self: Value, pad: list[Dim], value: Any = 0) -> Value:
    """pad = [lo, hi] pairs from the last dim backwards; negative amounts crop."""
    rank = ctx.rank(self)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise DecompositionError(f"{ctx.node.op}: pad {pad} needs pairs for at most {rank} "
                                 f"dims")
    config: list[list[Dim]] = [[0, 0, 0] for _ in range(rank)]
    for i in range(len(pad) // 2):
        config[rank - 1 - i] = [pad[2 * i], pad[2 * i + 1], 0]
    if all(dims_equal(c, 0) for row in config for c in row):
        return self
    return ctx.prim("pad", self, _fill_value(value, ctx.dtype(self)), config=config)


# ---- copies, aliases and conversions ------------------------------------------------------


@register_decomposition("aten.clone.default")
def clone(ctx: DecompContext, self: Value, memory_format: str | None = None) -> Value:
    """Values are immutable: a copy is the value itself (layouts are not part of the type)."""
    return self


@register_decomposition("aten.alias.default", "aten.alias_copy.default",
                        "aten.detach.default", "aten.detach_copy.default",
                        "aten.lift_fresh.default", "aten.lift_fresh_copy.default")
def alias(ctx: DecompContext, self: Value) -> Value:
    return self


@register_decomposition("aten._to_copy.default")
def _to_copy(ctx: DecompContext, self: Value, dtype: DType | None = None,
             layout: str | None = None, device: str | None = None,
             pin_memory: bool | None = None, non_blocking: bool = False,
             memory_format: str | None = None) -> Value:
    """A dtype conversion on the same device (moves between devices are not decomposed)."""
    if layout not in (None, "strided"):
        raise DecompositionError(f"{ctx.node.op}: only strided layout, not {layout}")
    if device is not None and torch.device(device) != torch.device(ctx.device(self)):
        raise DecompositionError(f"{ctx.node.op}: copies between devices ({ctx.device(self)} "
                                 f"-> {device}) are not decomposed")
    return ctx.convert(self, dtype) if dtype is not None else self
