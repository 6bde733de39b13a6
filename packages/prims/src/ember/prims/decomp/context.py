"""What a decomposition works with: `DecompContext`, a builder of prims with helpers for the
chores every decomposition repeats (broadcasting, type promotion, dims, keepdim)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import sympy
import torch

from ember.ir import Builder, DType, Node, ScalarType, TensorType, Value
from ember.ir.expr import Dim, as_sympy, simplify_dim
from ember.ir.passes import PipelineError
from ember.ir.types import ScalarKind, Type
from ember.ir.verifier import dims_equal
from ember.prims.rules import broadcast_shape

Operand = Any  # a Value, a Python number, or a size expression
_T = TypeVar("_T")


class DecompositionError(PipelineError):
    """A decomposition cannot handle these arguments (or is missing), or eager refuses them
    (argmax of bool, an integer to a negative integer power): names the op. A PipelineError,
    so `ember opt/check -p decompose` report it in one line (a ValueError, as before)."""


class EagerRuntimeError(DecompositionError, RuntimeError):
    """Eager raises RuntimeError on these arguments: so does the decomposition (a backend
    that decomposes at compile time raises what eager raises, at the first call)."""


class EagerNotImplementedError(DecompositionError, NotImplementedError):
    """Eager has no kernel for these dtypes (NotImplementedError, a RuntimeError)."""


def runtime_scalar_error(op: str, operand: str, v: Value) -> DecompositionError:
    """A size-like operand that is a run-time scalar: a decomposition would have to trust the
    declared result shape (which nothing checks at run time) instead of the scalar's value."""
    return DecompositionError(f"{op}: {operand} is a run-time scalar (%{v.name}); ember needs "
                              f"it as a literal or a size expression")


class DecompContext:
    """Emits prims for one aten node. `node` is the node being decomposed (its declared result
    types say what the decomposition must produce); emitted nodes carry its location."""

    def __init__(self, builder: Builder, node: Node, table: Any, rng: Any = None):
        self.b = builder
        self.node = node
        self.table = table  # the DecompositionTable, for `call`
        self.rng = rng  # the graph's philox state (decomp/random.py), set by the decompose pass

    # ---- emitting ----
    def prim(self, name: str, *args: Any, **kwargs: Any) -> Value:
        """Emit `prims.<name>(args, kwargs)`; one result."""
        return self.b.op(f"prims.{name}", list(args), kwargs)

    def prims(self, name: str, *args: Any, **kwargs: Any) -> list[Value]:
        """Emit a multi-result prim."""
        return self.b.emit(f"prims.{name}", list(args), kwargs)

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run another op's decomposition inline (as torch's decompositions call each other)."""
        return self.table.apply(self, op, list(args), kwargs)

    # ---- facts about operands ----
    @property
    def out_types(self) -> list[Type]:
        return [r.type for r in self.node.results]

    def out_dtype(self, i: int = 0) -> DType:
        t = self.out_types[i]
        if not isinstance(t, TensorType):
            raise DecompositionError(f"{self.node.op}: result {i} is not a tensor")
        return t.dtype

    @staticmethod
    def is_tensor(x: Operand) -> bool:
        return isinstance(x, Value) and isinstance(x.type, TensorType)

    def ttype(self, x: Operand) -> TensorType:
        if not self.is_tensor(x):
            raise DecompositionError(f"{self.node.op}: expected a tensor operand, got {x!r}")
        assert isinstance(x, Value) and isinstance(x.type, TensorType)
        return x.type

    def shape(self, x: Operand) -> tuple[Dim, ...]:
        return self.ttype(x).shape

    def rank(self, x: Operand) -> int:
        return self.ttype(x).rank

    def dtype(self, x: Operand) -> DType:
        return self.ttype(x).dtype

    def device(self, x: Operand) -> str:
        return self.ttype(x).device

    def norm_dim(self, d: int, rank: int) -> int:
        """A dim in [-rank, rank) as a non-negative one (rank 0 takes -1 and 0 as torch does)."""
        r = max(rank, 1)
        if not -r <= d < r:
            raise DecompositionError(f"{self.node.op}: dim {d} out of range for rank {rank}")
        return d % r

    def norm_dims(self, dims: Sequence[int] | int | None, rank: int) -> list[int]:
        """Reduction dims: None or [] mean all dims; each normalized, sorted, unique."""
        if dims is None:
            return list(range(rank))
        if isinstance(dims, int):
            dims = [dims]
        if len(dims) == 0:
            return list(range(rank))
        out = sorted({self.norm_dim(d, rank) for d in dims})
        return [d for d in out if d < rank] if rank else []

    # ---- conversions ----
    def convert(self, x: _T, dtype: DType) -> _T:
        """x in dtype: tensors get a convert_element_type (if needed); numbers pass through."""
        if not self.is_tensor(x):
            return x
        if self.dtype(x) == dtype:
            return x
        return self.prim("convert_element_type", x, dtype=dtype)  # type: ignore[return-value]

    def broadcast_to(self, x: _T, shape: Sequence[Dim]) -> _T:
        """x broadcast (numpy rules) to shape; numbers pass through."""
        if not self.is_tensor(x):
            return x
        xs = self.shape(x)
        if len(xs) == len(shape) and all(dims_equal(a, b) for a, b in zip(xs, shape,
                                                                          strict=True)):
            return x
        off = len(shape) - len(xs)
        return self.prim("broadcast_in_dim", x, shape=list(shape),  # type: ignore[return-value]
                         broadcast_dims=list(range(off, len(shape))))

    def broadcast_shapes(self, *xs: Operand) -> tuple[Dim, ...]:
        shape: tuple[Dim, ...] = ()
        for x in xs:
            if self.is_tensor(x):
                shape = broadcast_shape(self.node.op, shape, self.shape(x))
        return shape

    def broadcast(self, *xs: Operand) -> list[Operand]:
        shape = self.broadcast_shapes(*xs)
        return [self.broadcast_to(x, shape) for x in xs]

    def result_dtype(self, *xs: Operand) -> DType:
        """torch's type promotion over operands: tensors, 0-dim tensors and numbers."""
        return promote(*(_category(self, x) for x in xs if x is not None))

    def keepdim(self, x: Value, dims: Sequence[int], rank: int) -> Value:
        """Re-insert reduced dims as size 1."""
        return self.prim("unsqueeze", x, dims=list(dims)) if dims else x

    def numel(self, x: Operand) -> Dim:
        n: Any = 1
        for d in self.shape(x):
            n = as_sympy(n) * as_sympy(d)
        return simplify_dim(n)

    def full(self, shape: Sequence[Dim], value: Any, dtype: DType, device: str) -> Value:
        return self.prim("full", shape=list(shape), value=value, dtype=dtype, device=device)


def _category(ctx: DecompContext, x: Operand) -> tuple[str, torch.dtype]:
    if ctx.is_tensor(x):
        t = ctx.ttype(x)
        return ("dim" if t.rank else "zero"), t.dtype.torch
    if isinstance(x, Value) and isinstance(x.type, ScalarType):
        return "number", {ScalarKind.i64: torch.int64, ScalarKind.f64: torch.float32,
                          ScalarKind.bool: torch.bool}[x.type.kind]
    if isinstance(x, bool):
        return "number", torch.bool
    if isinstance(x, (int, sympy.Expr)):
        return "number", torch.int64
    if isinstance(x, float):
        return "number", torch.float32  # the default dtype
    if isinstance(x, complex):
        return "number", torch.complex64
    raise DecompositionError(f"cannot promote {x!r}")


def promote(*operands: tuple[str, torch.dtype]) -> DType:
    """torch's ResultTypeState: dimensioned tensors outrank 0-dim tensors outrank numbers,
    unless a lower group has a higher category (bool < integer < floating < complex)."""
    state: dict[str, torch.dtype | None] = {"dim": None, "zero": None, "number": None}
    for group, dt in operands:
        cur = state[group]
        state[group] = dt if cur is None else torch.promote_types(cur, dt)
    out = _combine(state["dim"], _combine(state["zero"], state["number"]))
    if out is None:
        raise DecompositionError("nothing to promote")
    return DType.from_torch(out)


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return _to_complex(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def _to_complex(dt: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(
        dt, torch.complex64)


def is_sym(x: Any) -> bool:
    return isinstance(x, sympy.Expr)
