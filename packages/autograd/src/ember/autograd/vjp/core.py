"""The VJP registry: one rule per differentiable op, one reason per op without a derivative.

A rule is registered with `@vjp("prims.exp")` over a function

    rule(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]

`node` is the forward node (its `args`, `kwargs` and `results` are the forward graph's values);
`cts[i]` is the cotangent of `node.results[i]` (None where no gradient flows into that result).
The rule emits prims through `ctx` and returns one entry per positional argument of the node:
the argument's cotangent (a Value of exactly the argument's type), None where the argument has
no gradient (numbers, index tensors, integer values), or for a list argument (concatenate) a
list of those. Rules compute every operand's cotangent; the joint graph drops the unneeded ones
and dead code elimination removes what only they used.

Ops with no derivative (comparisons, creation, integer results, random draws, rounding) are
listed once in `NO_DERIVATIVE` (nondiff.py) with the reason; the coverage test checks every
prim has exactly one of the two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from ember.ir import Builder, DType, Node, TensorType, Value
from ember.ir.expr import Dim

Grad: TypeAlias = Value | None | list[Value | None]
Rule = Callable[["VJPContext", Node, list[Value | None]], list[Grad]]

VJP_RULES: dict[str, Rule] = {}


class VJPError(ValueError):
    """A joint graph cannot be built: an op lacks a rule, or a rule broke its contract."""


def vjp(*ops: str) -> Callable[[Rule], Rule]:
    """Register `fn` as the VJP rule of each op in `ops` (twice is an error)."""

    def deco(fn: Rule) -> Rule:
        for op in ops:
            if op in VJP_RULES:
                raise ValueError(f"a VJP rule for {op} is already registered")
            VJP_RULES[op] = fn
        return fn
    return deco


def is_float_tensor(v: Any) -> bool:
    """A value that carries gradients: a tensor of a floating dtype."""
    return (isinstance(v, Value) and isinstance(v.type, TensorType)
            and (v.type.dtype.is_floating or v.type.dtype.is_complex))


class VJPContext:
    """Emits the backward prims of one forward node."""

    def __init__(self, builder: Builder, requires_grad: set[Value] | None = None):
        self.b = builder
        # the forward values a gradient is wanted for (None: unknown, take all): for a rule
        # whose kernel has no derivative for an operand torch does not differentiate either
        self.requires_grad = requires_grad

    def needs_grad(self, v: Any) -> bool:
        """Whether a gradient of forward value `v` is wanted (a float tensor, and on the path
        from the inputs that get gradients where that is known)."""
        return is_float_tensor(v) and (self.requires_grad is None or v in self.requires_grad)

    def p(self, name: str, *args: Any, **kwargs: Any) -> Value:
        """Emit `prims.<name>(args, kwargs)`, one result."""
        return self.b.op(f"prims.{name}", list(args), kwargs)

    def ps(self, name: str, *args: Any, **kwargs: Any) -> list[Value]:
        return self.b.emit(f"prims.{name}", list(args), kwargs)

    def op(self, op: str, *args: Any, **kwargs: Any) -> list[Value]:
        """Emit any op (an extern such as a fused attention backward)."""
        return self.b.emit(op, list(args), kwargs)

    def producer(self, v: Value) -> Node | None:
        """The backward node (emitted so far) that computes `v`, if any."""
        for n in reversed(self.b.nodes):
            if v in n.results:
                return n
        return None

    @staticmethod
    def t(v: Any) -> TensorType:
        if not (isinstance(v, Value) and isinstance(v.type, TensorType)):
            raise VJPError(f"expected a tensor value, got {v!r}")
        return v.type

    def shape(self, v: Any) -> tuple[Dim, ...]:
        return self.t(v).shape

    def full(self, like: TensorType, value: Any, shape: Sequence[Dim] | None = None,
             dtype: DType | None = None) -> Value:
        dt = dtype or like.dtype
        if dt.is_floating and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        return self.p("full", shape=list(like.shape if shape is None else shape), value=value,
                      dtype=dt, device=like.device)

    def zeros(self, like: TensorType) -> Value:
        return self.full(like, 0.0 if like.dtype.is_floating else 0)

    def tensor(self, x: Any, like: TensorType) -> Value:
        """A number operand (literal or scalar value) as a tensor shaped like `like`."""
        if isinstance(x, Value) and isinstance(x.type, TensorType):
            return x
        if isinstance(x, Value):  # an i64/f64/bool graph scalar: added to zeros
            return self.p("add", self.zeros(like), x)
        return self.full(like, x)

    # arithmetic shorthands (operands: values or numbers)
    def add(self, a: Any, b: Any) -> Value:
        return self.p("add", a, b)

    def sub(self, a: Any, b: Any) -> Value:
        return self.p("sub", a, b)

    def mul(self, a: Any, b: Any) -> Value:
        return self.p("mul", a, b)

    def div(self, a: Any, b: Any) -> Value:
        return self.p("div", a, b)

    def neg(self, a: Value) -> Value:
        return self.p("neg", a)

    def where(self, c: Value, a: Any, b: Any) -> Value:
        return self.p("where", c, a, b)

    def convert(self, x: Value, dtype: DType) -> Value:
        return x if self.t(x).dtype == dtype else self.p("convert_element_type", x, dtype=dtype)

    def bcast(self, x: Value, shape: Sequence[Dim], dims: Sequence[int]) -> Value:
        """x's dim i as dim dims[i] of shape (a reduced value back to its operand's shape)."""
        return self.p("broadcast_in_dim", x, shape=list(shape), broadcast_dims=list(dims))


def attr_list(node: Node, name: str, default: list[Any] | None = None) -> list[Any]:
    """A list attribute of the forward node (dims, sizes, config rows)."""
    v = node.kwargs.get(name, default)
    if not isinstance(v, list):
        raise VJPError(f"{node.op}: attribute {name}= is {v!r}, not a list")
    return list(v)


def kept_dims(rank: int, reduced: Sequence[int]) -> list[int]:
    return [d for d in range(rank) if d not in reduced]
