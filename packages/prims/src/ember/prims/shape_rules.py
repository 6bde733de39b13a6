"""Shape rules of the prims: exact and symbolic. Each maps (op, operands, attributes) to the
result shapes and raises OpTypeError with a clear message on misuse."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ember.ir import DType, OpTypeError
from ember.ir.expr import Dim, FloorDiv, as_sympy, simplify_dim
from ember.ir.verifier import dims_equal
from ember.prims.rules import (
    Shape,
    attr,
    check_dims,
    dim_list,
    elementwise_operands,
    int_list,
    is_number,
    slice_length,
    tensor,
)

Args = Sequence[Any]
Kw = Mapping[str, Any]
ShapeRule = Callable[[str, Args, Kw], list[Shape]]


def ew_shape(arity: int) -> ShapeRule:
    def rule(op: str, args: Args, kw: Kw) -> list[Shape]:
        return [elementwise_operands(op, args, arity)[0].shape]
    rule.__doc__ = "the common shape of the tensor operands (numbers take any shape)"
    return rule


def reduce_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """the operand shape without the dims in `dims`"""
    t = tensor(args[0], f"{op} operand")
    dims = int_list(attr(kw, "dims", op), f"{op} dims")
    check_dims(dims, t.rank, op)
    return [tuple(d for i, d in enumerate(t.shape) if i not in dims)]


def argreduce_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """the operand shape without `dim`"""
    t = tensor(args[0], f"{op} operand")
    dim = attr(kw, "dim", op)
    check_dims([dim], t.rank, op)
    return [tuple(d for i, d in enumerate(t.shape) if i != dim)]


def same_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """the operand shape"""
    t = tensor(args[0], f"{op} operand")
    if "dim" in kw:
        check_dims([kw["dim"]], t.rank, op)
    if "dims" in kw:
        check_dims(int_list(kw["dims"], f"{op} dims"), t.rank, op)
    return [t.shape]


def broadcast_in_dim_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`shape`; operand dim i must equal `shape[broadcast_dims[i]]` or be 1"""
    t = tensor(args[0], f"{op} operand")
    shape = dim_list(attr(kw, "shape", op), f"{op} shape")
    bdims = int_list(attr(kw, "broadcast_dims", op), f"{op} broadcast_dims")
    if len(bdims) != t.rank:
        raise OpTypeError(f"{op}: broadcast_dims has {len(bdims)} entries for rank {t.rank}")
    check_dims(bdims, len(shape), op)
    if sorted(bdims) != bdims:
        raise OpTypeError(f"{op}: broadcast_dims must increase, got {bdims}")
    for i, b in enumerate(bdims):
        if not (dims_equal(t.shape[i], shape[b]) or t.shape[i] == 1):
            raise OpTypeError(f"{op}: operand dim {i} ({t.shape[i]}) cannot broadcast to "
                              f"{shape[b]}")
    return [tuple(shape)]


def reshape_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`shape`; the number of elements must not change"""
    t = tensor(args[0], f"{op} operand")
    shape = dim_list(attr(kw, "shape", op), f"{op} shape")
    if not dims_equal(_numel(t.shape), _numel(shape)):
        raise OpTypeError(f"{op}: cannot reshape {t} ({_numel(t.shape)} elements) to {shape}")
    return [tuple(shape)]


def _numel(shape: Sequence[Dim]) -> Dim:
    n: Any = 1
    for d in shape:
        n = as_sympy(n) * as_sympy(d)
    return simplify_dim(n)


def permute_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """operand dims reordered: dim i is operand dim `dims[i]`"""
    t = tensor(args[0], f"{op} operand")
    dims = int_list(attr(kw, "dims", op), f"{op} dims")
    if sorted(dims) != list(range(t.rank)):
        raise OpTypeError(f"{op}: dims {dims} is not a permutation of range({t.rank})")
    return [tuple(t.shape[d] for d in dims)]


def slice_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`ceil((limit - start) / step)` per dim"""
    t = tensor(args[0], f"{op} operand")
    start = dim_list(attr(kw, "start", op), f"{op} start")
    limit = dim_list(attr(kw, "limit", op), f"{op} limit")
    step = int_list(attr(kw, "step", op, [1] * t.rank), f"{op} step")
    if not len(start) == len(limit) == len(step) == t.rank:
        raise OpTypeError(f"{op}: start, limit and step need one entry per dim ({t.rank})")
    for s, lim, st, n in zip(start, limit, step, t.shape, strict=True):
        if st < 1:
            raise OpTypeError(f"{op}: step must be >= 1, got {st}")
        if isinstance(s, int) and isinstance(lim, int) and not 0 <= s <= lim:
            raise OpTypeError(f"{op}: need 0 <= start <= limit, got {s}, {lim}")
        if isinstance(lim, int) and isinstance(n, int) and lim > n:
            raise OpTypeError(f"{op}: limit {lim} exceeds the dim's size {n}")
    return [tuple(slice_length(s, lim, st) for s, lim, st in zip(start, limit, step,
                                                                 strict=True))]


def pad_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`lo + hi + n + (n - 1) * interior` per dim"""
    t = tensor(args[0], f"{op} operand")
    if len(args) != 2 or not is_number(args[1]):
        raise OpTypeError(f"{op} takes (tensor, padding value)")
    config = attr(kw, "config", op)
    if not isinstance(config, list) or len(config) != t.rank:
        raise OpTypeError(f"{op}: config needs one [lo, hi, interior] per dim ({t.rank})")
    out: list[Dim] = []
    for c, n in zip(config, t.shape, strict=True):
        lo, hi, interior = dim_list(c, f"{op} config entry")
        if not isinstance(interior, int) or interior < 0:
            raise OpTypeError(f"{op}: interior padding must be a non-negative int")
        inner: Any = as_sympy(n) + as_sympy(interior) * (as_sympy(n) - 1) if interior else n
        if interior and isinstance(n, int) and n == 0:
            inner = 0
        out.append(simplify_dim(as_sympy(lo) + as_sympy(hi) + as_sympy(inner)))
    return [tuple(out)]


def concatenate_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """operand shapes, summed along `dim`; equal elsewhere"""
    if len(args) != 1 or not isinstance(args[0], list) or not args[0]:
        raise OpTypeError(f"{op} takes one non-empty list of tensors")
    ts = [tensor(a, f"{op} operand") for a in args[0]]
    dim = attr(kw, "dim", op)
    check_dims([dim], ts[0].rank, op)
    total: Any = 0
    for t in ts:
        if t.rank != ts[0].rank or not all(dims_equal(a, b) for i, (a, b) in enumerate(
                zip(t.shape, ts[0].shape, strict=True)) if i != dim):
            raise OpTypeError(f"{op}: shapes {ts[0]} and {t} differ outside dim {dim}")
        total = as_sympy(total) + as_sympy(t.shape[dim])
    return [tuple(simplify_dim(total) if i == dim else d for i, d in enumerate(ts[0].shape))]


def squeeze_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """the operand shape without `dims` (each of size 1)"""
    t = tensor(args[0], f"{op} operand")
    dims = int_list(attr(kw, "dims", op), f"{op} dims")
    check_dims(dims, t.rank, op)
    for d in dims:
        if t.shape[d] != 1:
            raise OpTypeError(f"{op}: dim {d} has size {t.shape[d]}, not 1")
    return [tuple(s for i, s in enumerate(t.shape) if i not in dims)]


def unsqueeze_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """size-1 dims inserted at output positions `dims`"""
    t = tensor(args[0], f"{op} operand")
    dims = int_list(attr(kw, "dims", op), f"{op} dims")
    rank = t.rank + len(dims)
    check_dims(dims, rank, op)
    it = iter(t.shape)
    return [tuple(1 if i in dims else next(it) for i in range(rank))]


def iota_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`[length]`"""
    if args:
        raise OpTypeError(f"{op} takes only attributes")
    return [(dim_list([attr(kw, "length", op)], f"{op} length")[0],)]


def full_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`shape`"""
    if args:
        raise OpTypeError(f"{op} takes only attributes")
    return [tuple(dim_list(attr(kw, "shape", op), f"{op} shape"))]


def philox_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`shape`"""
    if len(args) != 2 or not all(is_number(a) for a in args):
        raise OpTypeError(f"{op} takes (seed, offset) integers")
    skip = dim_list([attr(kw, "skip", op, 0)], f"{op} skip")[0]
    if isinstance(skip, int) and skip < 0:
        raise OpTypeError(f"{op}: skip must be >= 0, got {skip}")
    return [tuple(dim_list(attr(kw, "shape", op), f"{op} shape"))]


def gather_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """the index shape (index: i64, same rank)"""
    x, idx = tensor(args[0], f"{op} operand"), tensor(args[1], f"{op} index")
    dim = attr(kw, "dim", op)
    if x.rank != idx.rank or idx.dtype != DType.i64:
        raise OpTypeError(f"{op}: index must be i64 of the operand's rank, got {idx}")
    check_dims([dim], x.rank, op)
    return [idx.shape]


def scatter_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """the operand shape (index i64 and src of the same rank)"""
    x, idx, src = (tensor(a, f"{op} operand") for a in args)
    dim = attr(kw, "dim", op)
    if not (x.rank == idx.rank == src.rank) or idx.dtype != DType.i64:
        raise OpTypeError(f"{op}: operand, i64 index and src must share a rank")
    check_dims([dim], x.rank, op)
    return [x.shape]


def matmul_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`[*B, M, K] x [*B, K, N] -> [*B, M, N]`, batch dims equal"""
    a, b = tensor(args[0], f"{op} lhs"), tensor(args[1], f"{op} rhs")
    if a.rank < 2 or a.rank != b.rank:
        raise OpTypeError(f"{op}: operands need the same rank >= 2, got {a} and {b}")
    if not all(dims_equal(x, y) for x, y in zip(a.shape[:-2], b.shape[:-2], strict=True)):
        raise OpTypeError(f"{op}: batch dims differ ({a} vs {b}); broadcast them first")
    if not dims_equal(a.shape[-1], b.shape[-2]):
        raise OpTypeError(f"{op}: contraction dims differ ({a} vs {b})")
    return [a.shape[:-1] + (b.shape[-1],)]


def conv_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """`[N, O, *((in + 2p - d(k - 1) - 1) // s + 1)]`"""
    x, w = tensor(args[0], f"{op} input"), tensor(args[1], f"{op} weight")
    n = x.rank - 2
    if n < 1 or w.rank != x.rank:
        raise OpTypeError(f"{op}: input and weight need the same rank >= 3")
    stride = int_list(attr(kw, "stride", op), f"{op} stride")
    padding = int_list(attr(kw, "padding", op), f"{op} padding")
    dilation = int_list(attr(kw, "dilation", op), f"{op} dilation")
    groups = attr(kw, "groups", op, 1)
    if not len(stride) == len(padding) == len(dilation) == n:
        raise OpTypeError(f"{op}: stride, padding and dilation need {n} entries")
    if not dims_equal(as_sympy(w.shape[1]) * groups, x.shape[1]):
        raise OpTypeError(f"{op}: weight {w} does not fit input {x} with groups={groups}")
    spatial = [_conv_out(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i])
               for i in range(n)]
    return [(x.shape[0], w.shape[0], *spatial)]


def _conv_out(size: Dim, k: Dim, s: int, p: int, d: int) -> Dim:
    num = as_sympy(size) + 2 * p - d * (as_sympy(k) - 1) - 1
    return simplify_dim(FloorDiv(num, s) + 1)


def sort_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """two results of the operand shape"""
    t = tensor(args[0], f"{op} operand")
    check_dims([attr(kw, "dim", op)], t.rank, op)
    return [t.shape, t.shape]


def topk_shape(op: str, args: Args, kw: Kw) -> list[Shape]:
    """two results of the operand shape with `dim` of size k"""
    t = tensor(args[0], f"{op} operand")
    dim, k = attr(kw, "dim", op), attr(kw, "k", op)
    check_dims([dim], t.rank, op)
    shape = tuple(k if i == dim else d for i, d in enumerate(t.shape))
    return [shape, shape]
