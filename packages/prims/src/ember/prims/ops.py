"""ember's primitive op set, `prims.*`: small, closed, declared here in one table.

Every decomposition lowers aten ops to these, and every backend implements exactly these. One
record per prim: name, group, signature, one-line doc, shape rule, dtype rule, reference, and
its traits (the facts that passes key on: aliasing, elementwise, reduction; see `Prim`).
Conventions:
- operands are positional (tensor values; elementwise prims also take numbers), attributes are
  keywords: `prims.sum(%x, dims=[0])`;
- elementwise prims need equal shapes and dtypes: broadcasting and type promotion are explicit
  (`broadcast_in_dim`, `convert_element_type`) and done by the decompositions; a number operand
  takes the tensor operand's dtype;
- dims are non-negative; reductions drop the reduced dims (keepdim is a reshape after).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ember.ir import DType, InferContext, OpDef, OpRegistry, OpTypeError, TensorType, Type
from ember.ir.registry import Aliasing
from ember.prims import philox
from ember.prims import shape_rules as S
from ember.prims.rules import (
    attr,
    elementwise_operands,
    same_device,
    same_dtype,
    tensor,
)

Args = Sequence[Any]
Kw = Mapping[str, Any]
DTypeRule = Callable[[str, Args, Kw], list[DType]]
# How a reduction prim combines elements: "associative" (associative and commutative: any
# grouping and order of the elements gives the same value up to rounding, so per-lane or
# per-thread partials may be combined), "positional" (the result is the index of the first
# extremum: the combine carries the position, ties resolve by order).
Reduction = Literal["associative", "positional"]
REDUCTION_TRAITS: tuple[Reduction, ...] = ("associative", "positional")


@dataclass(frozen=True)
class Prim:
    name: str  # without the dialect: "add" is the op prims.add
    group: str
    signature: str
    doc: str
    shape: S.ShapeRule
    dtype: DTypeRule
    ref: Callable[..., Any]
    # Traits, checked against the reference by tests/test_op_traits.py:
    # - aliasing: "fresh" where the reference always returns new storage, "alias" where a result
    #   may be an operand or a view of one (shape prims; identities: a reduction over no dims, a
    #   conversion to the operand's dtype). Buffer planning reads it for externs.
    # - elementwise: result element i is computed from the operands' elements i alone (one loop
    #   body over the result's index; fusion merges such bodies).
    # - reduction: how a reduction prim combines elements (see Reduction); None otherwise.
    aliasing: Aliasing
    elementwise: bool = False
    reduction: Reduction | None = None

    @property
    def op(self) -> str:
        return f"prims.{self.name}"

    def infer(self, ctx: InferContext, args: Args, kwargs: Kw) -> list[Type]:
        shapes = self.shape(self.op, args, kwargs)
        dtypes = self.dtype(self.op, args, kwargs)
        device = _device(self.op, args, kwargs)
        return [TensorType(dt, tuple(s), None, device)
                for s, dt in zip(shapes, dtypes, strict=True)]

    def opdef(self) -> OpDef:
        ref = self.ref
        return OpDef(self.op, self.doc, self.infer,
                     lambda interp, args, kwargs: ref(*args, **kwargs), aliasing=self.aliasing)


def _device(op: str, args: Args, kwargs: Kw) -> str:
    if "device" in kwargs:
        d = kwargs["device"]
        if not isinstance(d, str):
            raise OpTypeError(f'{op}: device= must be a string like "cpu" or "cuda:0"')
        return d
    flat: list[Any] = []
    for a in args:
        flat.extend(a if isinstance(a, list) else [a])
    types = [a.type for a in flat if isinstance(getattr(a, "type", None), TensorType)]
    return same_device(op, types)


# ---- dtype rules -------------------------------------------------------------------------

def _ew_dtype(arity: int, kinds: str, out: DType | None = None) -> DTypeRule:
    """Operands of one dtype, of the kinds allowed ("f" float/complex, "i" integer, "b" bool);
    the result has that dtype, or `out` (comparisons give b8)."""

    def rule(op: str, args: Args, kw: Kw) -> list[DType]:
        dt = same_dtype(op, args, elementwise_operands(op, args, arity))
        kind = "f" if (dt.is_floating or dt.is_complex) else "b" if dt == DType.b8 else "i"
        if kind not in kinds:
            want = {"f": "floating", "i": "integer", "b": "bool"}
            raise OpTypeError(f"{op} takes {' or '.join(want[k] for k in kinds)} operands, "
                              f"not {dt.name}")
        return [out or dt]
    want = {"f": "float", "i": "integer", "b": "b8"}
    rule.__doc__ = (f"operands of one {'/'.join(want[k] for k in kinds)} dtype; result "
                    f"{out.name if out else 'that dtype'}")
    return rule


def _where_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """`cond` b8; the branches' common dtype"""
    elementwise_operands(op, args, 3)
    if tensor(args[0], f"{op} condition").dtype != DType.b8:
        raise OpTypeError(f"{op}: the condition must be b8")
    branches = [a.type for a in args[1:] if isinstance(getattr(a, "type", None), TensorType)]
    if not branches:
        raise OpTypeError(f"{op}: at least one branch must be a tensor")
    return [same_dtype(op, args[1:], branches)]


def _first_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """the operand dtype"""
    return [tensor(args[0], f"{op} operand").dtype]


def _attr_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """`dtype`"""
    dt = attr(kw, "dtype", op)
    if not isinstance(dt, DType):
        raise OpTypeError(f"{op}: dtype= must be a dtype literal, got {dt!r}")
    return [dt]


def _convert_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """`dtype`"""
    tensor(args[0], f"{op} operand")
    return _attr_dtype(op, args, kw)


def _i64(op: str, args: Args, kw: Kw) -> list[DType]:
    """i64"""
    return [DType.i64]


def _float_attr_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """`dtype`, one of f16, bf16, f32, f64"""
    dt = _attr_dtype(op, args, kw)[0]
    if not dt.is_floating or dt.torch not in philox.SIGNIFICAND_BITS:
        raise OpTypeError(f"{op}: dtype must be f16, bf16, f32 or f64, got {dt.name}")
    return [dt]


def _int_attr_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """`dtype`, an integer type"""
    dt = _attr_dtype(op, args, kw)[0]
    if not dt.is_integer:
        raise OpTypeError(f"{op}: dtype must be an integer type, got {dt.name}")
    return [dt]


def _concat_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """the operands' common dtype"""
    dts = {tensor(a, f"{op} operand").dtype for a in args[0]}
    if len(dts) != 1:
        raise OpTypeError(f"{op}: operands have different dtypes {sorted(d.name for d in dts)}")
    return [dts.pop()]


def _matmul_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """the operands' common dtype"""
    a, b = tensor(args[0], f"{op} lhs"), tensor(args[1], f"{op} rhs")
    if a.dtype != b.dtype:
        raise OpTypeError(f"{op}: operand dtypes differ ({a.dtype.name}, {b.dtype.name})")
    return [a.dtype]


def _pair(dtype_rule: DTypeRule, second: DType) -> DTypeRule:
    def rule(op: str, args: Args, kw: Kw) -> list[DType]:
        return [dtype_rule(op, args, kw)[0], second]
    rule.__doc__ = f"({dtype_rule.__doc__}, {second.name})"
    return rule


def _gather_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """the operand dtype"""
    return [tensor(args[0], f"{op} operand").dtype]


def _scatter_dtype(op: str, args: Args, kw: Kw) -> list[DType]:
    """the operand dtype (src the same)"""
    x, src = tensor(args[0], f"{op} operand"), tensor(args[2], f"{op} src")
    if x.dtype != src.dtype:
        raise OpTypeError(f"{op}: src dtype {src.dtype.name} differs from {x.dtype.name}")
    return [x.dtype]


# ---- references ----------------------------------------------------------------------------

def _ew(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Reference of an elementwise prim: numbers become 0-dim tensors of the tensor's dtype."""

    def run(*args: Any) -> torch.Tensor:
        t = next(a for a in args if isinstance(a, torch.Tensor))
        conv = [a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=t.dtype,
                                                                   device=t.device)
                for a in args]
        out = fn(*conv)
        shape = torch.broadcast_shapes(*(a.shape for a in conv))
        return out.expand(shape) if out.shape != shape else out
    return run


def _where(c: torch.Tensor, a: Any, b: Any) -> torch.Tensor:
    t = a if isinstance(a, torch.Tensor) else b
    a, b = (x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=t.dtype, device=t.device)
            for x in (a, b))
    return torch.where(c, a, b).expand(c.shape)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def _broadcast_in_dim(x: torch.Tensor, *, shape: list[int], broadcast_dims: list[int]
                      ) -> torch.Tensor:
    view = [1] * len(shape)
    for i, b in enumerate(broadcast_dims):
        view[b] = x.shape[i]
    return x.reshape(view).expand(shape)


def _slice(x: torch.Tensor, *, start: list[int], limit: list[int], step: list[int] | None = None
           ) -> torch.Tensor:
    step = step or [1] * x.dim()
    return x[tuple(slice(s, lim, st) for s, lim, st in zip(start, limit, step, strict=True))]


def _pad(x: torch.Tensor, value: Any, *, config: list[list[int]]) -> torch.Tensor:
    for d, (_, _, interior) in enumerate(config):
        if interior and x.shape[d] > 1:
            n = x.shape[d]
            shape = list(x.shape)
            shape[d] = n + (n - 1) * interior
            y = torch.full(shape, value, dtype=x.dtype, device=x.device)
            idx = [slice(None)] * x.dim()
            idx[d] = slice(None, None, interior + 1)
            y[tuple(idx)] = x
            x = y
    pads: list[int] = []
    for lo, hi, _ in reversed(config):
        pads += [lo, hi]
    return torch.constant_pad_nd(x, pads, value)


def _reduce(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(x: torch.Tensor, *, dims: list[int]) -> torch.Tensor:
        if not dims:
            return x
        for d in sorted(dims, reverse=True):
            x = fn(x, d)
        return x
    return run


def _unsqueeze(x: torch.Tensor, *, dims: list[int]) -> torch.Tensor:
    for d in sorted(dims):
        x = x.unsqueeze(d)
    return x


def _iota(*, length: int, start: int = 0, step: int = 1, dtype: DType,
          device: str = "cpu") -> torch.Tensor:
    return torch.arange(length, dtype=torch.int64, device=device).mul(step).add(start).to(
        dtype.torch)


def _full(*, shape: list[int], value: Any, dtype: DType, device: str = "cpu") -> torch.Tensor:
    return torch.full(shape, value, dtype=dtype.torch, device=device)


def _philox_uniform(seed: int, offset: int, *, shape: list[int], dtype: DType,
                    device: str = "cpu", skip: int = 0) -> torch.Tensor:
    return philox.uniform(int(seed), int(offset) + int(skip), shape, dtype.torch, device)


def _conv(x: torch.Tensor, w: torch.Tensor, *, stride: list[int], padding: list[int],
          dilation: list[int], groups: int = 1) -> torch.Tensor:
    return torch.convolution(x, w, None, stride, padding, dilation, False, [0] * len(stride),
                             groups)


def _sort(x: torch.Tensor, *, dim: int, descending: bool = False
          ) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = torch.sort(x, dim=dim, descending=descending, stable=True)
    return v, i


def _topk(x: torch.Tensor, *, k: int, dim: int, largest: bool = True
          ) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = torch.topk(x, k, dim=dim, largest=largest, sorted=True)
    return v, i


# ---- the table -----------------------------------------------------------------------------

F, I, B = "f", "i", "b"
_T = torch


def _unary(name: str, doc: str, fn: Callable[..., torch.Tensor], kinds: str = F) -> Prim:
    return Prim(name, "elementwise unary", f"{name}(x)", doc, S.ew_shape(1),
                _ew_dtype(1, kinds), _ew(fn), aliasing="fresh", elementwise=True)


def _binary(name: str, doc: str, fn: Callable[..., torch.Tensor], kinds: str = F + I,
            out: DType | None = None, group: str = "elementwise binary") -> Prim:
    return Prim(name, group, f"{name}(a, b)", doc, S.ew_shape(2), _ew_dtype(2, kinds, out),
                _ew(fn), aliasing="fresh", elementwise=True)


PRIMS: tuple[Prim, ...] = (
    # elementwise unary: float math (integers are converted first by the decompositions)
    _unary("exp", "e ** x", _T.exp),
    _unary("exp2", "2 ** x", _T.exp2),
    _unary("expm1", "e ** x - 1, accurate near 0", _T.expm1),
    _unary("log", "natural logarithm", _T.log),
    _unary("log2", "base-2 logarithm", _T.log2),
    _unary("log10", "base-10 logarithm", _T.log10),
    _unary("log1p", "log(1 + x), accurate near 0", _T.log1p),
    _unary("sqrt", "square root", _T.sqrt),
    _unary("rsqrt", "1 / sqrt(x)", _T.rsqrt),
    _unary("sin", "sine", _T.sin),
    _unary("cos", "cosine", _T.cos),
    _unary("tan", "tangent", _T.tan),
    _unary("asin", "arcsine", _T.asin),
    _unary("acos", "arccosine", _T.acos),
    _unary("atan", "arctangent", _T.atan),
    _unary("sinh", "hyperbolic sine", _T.sinh),
    _unary("cosh", "hyperbolic cosine", _T.cosh),
    _unary("tanh", "hyperbolic tangent", _T.tanh),
    _unary("asinh", "inverse hyperbolic sine", _T.asinh),
    _unary("acosh", "inverse hyperbolic cosine", _T.acosh),
    _unary("atanh", "inverse hyperbolic tangent", _T.atanh),
    _unary("erf", "error function", _T.erf),
    _unary("erfc", "1 - erf(x), accurate for large x", _T.erfc),
    _unary("erfinv", "inverse error function", _T.erfinv),
    _unary("lgamma", "log |gamma(x)|", _T.lgamma),
    _unary("digamma", "derivative of lgamma", _T.digamma),
    # elementwise unary: any number type
    _unary("abs", "absolute value", _T.abs, F + I),
    _unary("neg", "negation (wraps for integers)", _T.neg, F + I),
    _unary("sign", "-1, 0 or 1 (0 for NaN, as torch.sign)", _T.sign, F + I),
    _unary("floor", "round toward -inf (identity on integers)", _T.floor, F + I),
    _unary("ceil", "round toward +inf (identity on integers)", _T.ceil, F + I),
    _unary("round", "round half to even (identity on integers)", _T.round, F + I),
    _unary("trunc", "round toward zero (identity on integers)", _T.trunc, F + I),
    _unary("bitwise_not", "bitwise not; logical not on b8", _T.bitwise_not, I + B),
    # elementwise binary
    _binary("add", "a + b (wraps for integers)", _T.add),
    _binary("sub", "a - b (wraps for integers)", _T.sub),
    _binary("mul", "a * b (wraps for integers)", _T.mul),
    _binary("div", "a / b; integers truncate toward zero", _div),
    _binary("fmod", "C fmod: remainder with the sign of a", _T.fmod),
    _binary("remainder", "Python %: remainder with the sign of b", _T.remainder),
    _binary("pow", "a ** b", _T.pow),
    _binary("maximum", "larger of a and b; NaN if either is NaN", _T.maximum),
    _binary("minimum", "smaller of a and b; NaN if either is NaN", _T.minimum),
    _binary("atan2", "angle of the point (b, a)", _T.atan2, F),
    _binary("bitwise_and", "bitwise and; logical and on b8", _T.bitwise_and, I + B),
    _binary("bitwise_or", "bitwise or; logical or on b8", _T.bitwise_or, I + B),
    _binary("bitwise_xor", "bitwise xor; logical xor on b8", _T.bitwise_xor, I + B),
    _binary("shift_left", "a << b", _T.bitwise_left_shift, I),
    _binary("shift_right", "a >> b, arithmetic for signed types", _T.bitwise_right_shift, I),
    # comparisons: b8 results
    _binary("eq", "a == b", _T.eq, F + I + B, DType.b8, "comparison"),
    _binary("ne", "a != b (true where either is NaN)", _T.ne, F + I + B, DType.b8, "comparison"),
    _binary("lt", "a < b", _T.lt, F + I + B, DType.b8, "comparison"),
    _binary("le", "a <= b", _T.le, F + I + B, DType.b8, "comparison"),
    _binary("gt", "a > b", _T.gt, F + I + B, DType.b8, "comparison"),
    _binary("ge", "a >= b", _T.ge, F + I + B, DType.b8, "comparison"),
    # selection and conversion
    Prim("where", "elementwise ternary", "where(cond, a, b)", "a where cond else b",
         S.ew_shape(3), _where_dtype, _where, aliasing="fresh", elementwise=True),
    Prim("convert_element_type", "conversion", "convert_element_type(x, dtype=)",
         "x converted to dtype (floats to integers truncate toward zero)", S.same_shape,
         _convert_dtype, lambda x, *, dtype: x.to(dtype.torch), aliasing="alias", elementwise=True),
    # shape
    Prim("broadcast_in_dim", "shape", "broadcast_in_dim(x, shape=, broadcast_dims=)",
         "x's dim i becomes dim broadcast_dims[i] of shape; size-1 dims expand",
         S.broadcast_in_dim_shape, _first_dtype, _broadcast_in_dim, aliasing="alias"),
    Prim("reshape", "shape", "reshape(x, shape=)", "the elements of x, row-major, in shape",
         S.reshape_shape, _first_dtype, lambda x, *, shape: x.reshape(shape), aliasing="alias"),
    Prim("permute", "shape", "permute(x, dims=)", "output dim i is x's dim dims[i]",
         S.permute_shape, _first_dtype, lambda x, *, dims: x.permute(dims), aliasing="alias"),
    Prim("slice", "shape", "slice(x, start=, limit=, step=)",
         "x[start:limit:step] per dim, 0 <= start <= limit <= size", S.slice_shape,
         _first_dtype, _slice, aliasing="alias"),
    Prim("pad", "shape", "pad(x, value, config=[[lo, hi, interior], ...])",
         "pad each dim with value: lo before, hi after (negative crops), interior between",
         S.pad_shape, _first_dtype, _pad, aliasing="fresh"),
    Prim("concatenate", "shape", "concatenate([x, ...], dim=)", "join tensors along dim",
         S.concatenate_shape, _concat_dtype, lambda xs, *, dim: torch.cat(xs, dim), aliasing="fresh"),
    Prim("squeeze", "shape", "squeeze(x, dims=)", "drop the listed size-1 dims",
         S.squeeze_shape, _first_dtype,
         lambda x, *, dims: x.reshape([s for i, s in enumerate(x.shape) if i not in dims]),
         aliasing="alias"),
    Prim("unsqueeze", "shape", "unsqueeze(x, dims=)",
         "insert size-1 dims at the listed output positions", S.unsqueeze_shape,
         _first_dtype, _unsqueeze, aliasing="alias"),
    Prim("rev", "shape", "rev(x, dims=)", "reverse the order of elements along dims",
         S.same_shape, _first_dtype, lambda x, *, dims: torch.flip(x, dims), aliasing="fresh"),
    Prim("iota", "creation", "iota(length=, start=, step=, dtype=, device=)",
         "start + step * i for i in range(length), integer dtype", S.iota_shape,
         _int_attr_dtype, _iota, aliasing="fresh"),
    Prim("full", "creation", "full(shape=, value=, dtype=, device=)",
         "a tensor of shape filled with value", S.full_shape, _attr_dtype, _full, aliasing="fresh"),
    # reductions: drop the reduced dims
    Prim("sum", "reduction", "sum(x, dims=)", "sum over dims (empty dims: identity)",
         S.reduce_shape, _first_dtype, _reduce(lambda x, d: torch.sum(x, d, dtype=x.dtype)),
         aliasing="alias", reduction="associative"),
    Prim("prod", "reduction", "prod(x, dims=)", "product over dims", S.reduce_shape,
         _first_dtype, _reduce(lambda x, d: torch.prod(x, d, dtype=x.dtype)), aliasing="alias", reduction="associative"),
    Prim("amax", "reduction", "amax(x, dims=)", "maximum over dims; NaN if any is NaN",
         S.reduce_shape, _first_dtype, _reduce(lambda x, d: torch.amax(x, d)), aliasing="alias", reduction="associative"),
    Prim("amin", "reduction", "amin(x, dims=)", "minimum over dims; NaN if any is NaN",
         S.reduce_shape, _first_dtype, _reduce(lambda x, d: torch.amin(x, d)), aliasing="alias", reduction="associative"),
    Prim("argmax", "reduction", "argmax(x, dim=)",
         "index of the first maximum along dim (NaN counts as largest)", S.argreduce_shape,
         _i64, lambda x, *, dim: torch.argmax(x, dim), aliasing="fresh", reduction="positional"),
    Prim("argmin", "reduction", "argmin(x, dim=)",
         "index of the first minimum along dim (NaN counts as smallest)", S.argreduce_shape,
         _i64, lambda x, *, dim: torch.argmin(x, dim), aliasing="fresh", reduction="positional"),
    Prim("cumsum", "scan", "cumsum(x, dim=)", "inclusive prefix sum along dim", S.same_shape,
         _first_dtype, lambda x, *, dim: torch.cumsum(x, dim, dtype=x.dtype), aliasing="fresh"),
    Prim("cumprod", "scan", "cumprod(x, dim=)", "inclusive prefix product along dim",
         S.same_shape, _first_dtype, lambda x, *, dim: torch.cumprod(x, dim, dtype=x.dtype),
         aliasing="fresh"),
    # indexing
    Prim("gather", "indexing", "gather(x, index, dim=)",
         "out[..i..] = x[..index[..i..] at dim..]", S.gather_shape, _gather_dtype,
         lambda x, index, *, dim: torch.gather(x, dim, index), aliasing="fresh"),
    Prim("scatter", "indexing", "scatter(x, index, src, dim=)",
         "x with x[..index[..i..] at dim..] = src[..i..]", S.scatter_shape, _scatter_dtype,
         lambda x, index, src, *, dim: torch.scatter(x, dim, index, src), aliasing="fresh"),
    Prim("scatter_add", "indexing", "scatter_add(x, index, src, dim=)",
         "x with src[..i..] added at x[..index[..i..] at dim..]", S.scatter_shape,
         _scatter_dtype, lambda x, index, src, *, dim: torch.scatter_add(x, dim, index, src),
         aliasing="fresh"),
    # random numbers
    Prim("philox_uniform", "random",
         "philox_uniform(seed, offset, shape=, dtype=, device=, skip=0)",
         "uniform [0, 1) numbers from Philox4x32-10 in ember's counter layout (philox.py), "
         "element i at counter offset + skip + i",
         S.philox_shape, _float_attr_dtype, _philox_uniform, aliasing="fresh"),
    # contraction, convolution, sorting
    Prim("matmul", "contraction", "matmul(a, b)",
         "batched matrix product [*B, M, K] x [*B, K, N] -> [*B, M, N]", S.matmul_shape,
         _matmul_dtype, lambda a, b: torch.matmul(a, b), aliasing="fresh"),
    Prim("convolution", "convolution",
         "convolution(x, w, stride=, padding=, dilation=, groups=)",
         "N-d cross-correlation [N, C, *in] with [O, C/groups, *k], zero padding, no bias",
         S.conv_shape, _matmul_dtype, _conv, aliasing="fresh"),
    Prim("sort", "sorting", "sort(x, dim=, descending=)",
         "stable sort along dim: (values, i64 indices); NaN sorts as largest", S.sort_shape,
         _pair(_first_dtype, DType.i64), _sort, aliasing="fresh"),
    Prim("topk", "sorting", "topk(x, k=, dim=, largest=)",
         "the k largest (or smallest) along dim, sorted: (values, i64 indices)", S.topk_shape,
         _pair(_first_dtype, DType.i64), _topk, aliasing="fresh"),
)

PRIMS_BY_OP: dict[str, Prim] = {p.op: p for p in PRIMS}


def register_prims(registry: OpRegistry) -> None:
    """Register every prim (an existing registration of the same name is an error)."""
    for p in PRIMS:
        registry.register(p.opdef())
