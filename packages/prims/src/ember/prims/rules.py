"""Reusable shape and dtype rules for prims: exact, symbolic, with clear messages.

A shape rule maps (operands, attributes) to result shapes; a dtype rule maps them to result
dtypes. `ops.py` pairs one of each per prim. Operands are IR arguments: Values (with types) or,
for elementwise prims, number literals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy

from ember.ir import Arg, DType, OpTypeError, ScalarType, TensorType, Value
from ember.ir.expr import Dim, FloorDiv, as_sympy, simplify_dim
from ember.ir.types import ScalarKind
from ember.ir.verifier import dims_equal

Shape = tuple[Dim, ...]


def tensor(a: Arg, what: str) -> TensorType:
    if isinstance(a, Value) and isinstance(a.type, TensorType):
        return a.type
    raise OpTypeError(f"{what} must be a tensor value, got {_show(a)}")


def _show(a: Arg) -> str:
    if isinstance(a, Value):
        return f"%{a.name}: {a.type}"
    return repr(a)


def is_number(a: Arg) -> bool:
    """A number operand: a literal or a Python-scalar value (i64, f64, bool)."""
    if isinstance(a, Value):
        return isinstance(a.type, ScalarType)
    return isinstance(a, (bool, int, float)) or isinstance(a, sympy.Expr)


def number_kind(a: Arg) -> str:
    if isinstance(a, Value):
        assert isinstance(a.type, ScalarType)
        return {ScalarKind.bool: "bool", ScalarKind.i64: "int", ScalarKind.f64: "float"}[
            a.type.kind]
    if isinstance(a, bool):
        return "bool"
    if isinstance(a, (int, sympy.Expr)):
        return "int"
    return "float"


def attr(kwargs: Mapping[str, Arg], name: str, op: str, default: Any = ...) -> Any:
    if name in kwargs:
        return kwargs[name]
    if default is ...:
        raise OpTypeError(f"{op} needs the attribute {name}=")
    return default


def int_list(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                          for x in v):
        raise OpTypeError(f"{what} must be a list of integers, got {v!r}")
    return list(v)


def dim_list(v: Any, what: str) -> list[Dim]:
    if not isinstance(v, list) or not all(
            (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, sympy.Expr)
            for x in v):
        raise OpTypeError(f"{what} must be a list of sizes, got {v!r}")
    return [simplify_dim(x) for x in v]


def check_dims(dims: Sequence[int], rank: int, what: str, unique: bool = True) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise OpTypeError(f"{what}: dim {d} out of range for rank {rank} (prims take "
                              f"non-negative dims)")
    if unique and len(set(dims)) != len(dims):
        raise OpTypeError(f"{what}: repeated dims {list(dims)}")


def same_shapes(op: str, types: Sequence[TensorType]) -> Shape:
    """Elementwise prims take operands of one shape: broadcasting is explicit."""
    shape = types[0].shape
    for t in types[1:]:
        if t.rank != len(shape) or not all(dims_equal(a, b) for a, b in
                                           zip(t.shape, shape, strict=True)):
            raise OpTypeError(f"{op}: operand shapes differ ({types[0]} vs {t}); broadcast "
                              f"them first with prims.broadcast_in_dim")
    return shape


def same_device(op: str, types: Sequence[TensorType]) -> str:
    devs = {t.device for t in types}
    if len(devs) > 1:
        raise OpTypeError(f"{op}: operands are on different devices {sorted(devs)}")
    return types[0].device if types else "cpu"


def elementwise_operands(op: str, args: Sequence[Arg], arity: int) -> list[TensorType]:
    """Check an elementwise prim's operands: `arity` of them, at least one tensor, tensors of
    one shape and dtype, numbers of a kind the tensor dtype can hold exactly."""
    if len(args) != arity:
        raise OpTypeError(f"{op} takes {arity} operand(s), got {len(args)}")
    tensors = [a.type for a in args if isinstance(a, Value) and isinstance(a.type, TensorType)]
    if not tensors:
        raise OpTypeError(f"{op} needs at least one tensor operand")
    for a in args:
        if not (isinstance(a, Value) and isinstance(a.type, TensorType)) and not is_number(a):
            raise OpTypeError(f"{op}: operand {_show(a)} is neither a tensor nor a number")
    same_shapes(op, tensors)
    same_device(op, tensors)
    return tensors


def same_dtype(op: str, args: Sequence[Arg], tensors: Sequence[TensorType]) -> DType:
    dt = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype != dt:
            raise OpTypeError(f"{op}: operand dtypes differ ({dt.name} vs {t.dtype.name}); "
                              f"convert first with prims.convert_element_type")
    for a in args:
        if is_number(a):
            k = number_kind(a)
            if (k == "float" and not (dt.is_floating or dt.is_complex)) or (
                    k == "int" and dt == DType.b8):
                raise OpTypeError(f"{op}: a {k} number cannot combine with {dt.name} without "
                                  f"a conversion")
    return dt


def broadcast_shape(op: str, a: Shape, b: Shape) -> Shape:
    """numpy broadcasting of two shapes; symbolic dims must be equal or 1."""
    out: list[Dim] = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        if dims_equal(x, y) or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise OpTypeError(f"{op}: shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(reversed(out))


def slice_length(start: Dim, limit: Dim, step: Dim) -> Dim:
    """Elements of range(start, limit, step) for 0 <= start <= limit, step >= 1."""
    if isinstance(start, int) and isinstance(limit, int) and isinstance(step, int):
        return max(0, -(-(limit - start) // step))
    return simplify_dim(FloorDiv(as_sympy(limit) - as_sympy(start) + as_sympy(step) - 1,
                                 as_sympy(step)))


def numel(shape: Shape) -> Dim:
    r: Dim = 1
    for d in shape:
        r = simplify_dim(as_sympy(r) * as_sympy(d)) if not (isinstance(r, int) and
                                                           isinstance(d, int)) else r * d
    return r
