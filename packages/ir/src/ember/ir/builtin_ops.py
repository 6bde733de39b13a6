"""Ops of ember.ir's own `graph` dialect: `graph.call(@g, args...)` runs another graph;
`graph.bind_symbol(%t, u0)` (ir-v1.2) binds an unbacked size symbol to a tensor's value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sympy

from ember.ir.expr import as_sympy, simplify_dim
from ember.ir.graph import BIND_SYMBOL, Arg, Graph, Ref, Value, is_unbacked
from ember.ir.printer import print_arg
from ember.ir.registry import InferContext, OpDef, OpRegistry, OpTypeError
from ember.ir.types import F64, I64, ScalarType, TensorType, Type, scalar_type_of

if TYPE_CHECKING:
    from ember.ir.interpreter import Interpreter


def _callee(ctx: InferContext, args: Sequence[Arg]) -> Graph:
    if not args or not isinstance(args[0], Ref):
        raise OpTypeError("graph.call takes @graph as its first argument")
    if ctx.module is None:
        raise OpTypeError("graph.call needs its module to find the callee")
    item = ctx.module.items.get(args[0].name)
    if not isinstance(item, Graph):
        raise OpTypeError(f"graph.call: @{args[0].name} is not a graph of this module")
    return item


def _call_infer(ctx: InferContext, args: Sequence[Arg], kwargs: Mapping[str, Arg]) -> list[Type]:
    g = _callee(ctx, args)
    if kwargs:
        raise OpTypeError("graph.call takes no keyword arguments")
    if len(args) - 1 != len(g.params):
        raise OpTypeError(f"graph.call: @{g.name} takes {len(g.params)} arguments, "
                          f"got {len(args) - 1}")
    # The callee's symbols are its own: bind each bare symbol of its parameter types to the
    # caller's dim, check the arguments against the parameters, and state the results in the
    # caller's terms.
    subst: dict[sympy.Expr, sympy.Expr] = {}
    for a, p in zip(args[1:], g.params, strict=True):
        if isinstance(a, Value) and isinstance(a.type, TensorType) \
                and isinstance(p.type, TensorType) and a.type.rank == p.type.rank:
            for d, e in zip(p.type.shape, a.type.shape, strict=True):
                if isinstance(d, sympy.Symbol) and d not in subst:
                    subst[d] = as_sympy(e)
    for i, (a, p) in enumerate(zip(args[1:], g.params, strict=True)):
        _check_call_arg(g, i, a, p, subst)
    return [_substitute(t, subst) for t in g.result_types]


def _check_call_arg(g: Graph, i: int, a: Arg, p: Value, subst: dict[sympy.Expr, sympy.Expr]
                    ) -> None:
    what = f"graph.call: argument {i + 1} of @{g.name} (parameter %{p.name}: {p.type})"
    if not isinstance(a, Value):  # a literal passes for a scalar parameter of its kind
        if isinstance(a, (bool, int, float)) and isinstance(p.type, ScalarType) and (
                scalar_type_of(a) == p.type or (p.type == F64 and scalar_type_of(a) == I64)):
            return
        raise OpTypeError(f"{what} cannot be {print_arg(a)}")
    have, want = a.type, p.type
    if isinstance(have, ScalarType) or isinstance(want, ScalarType):
        if have != want:
            raise OpTypeError(f"{what} cannot be %{a.name}: {have}")
        return
    if have.dtype != want.dtype or have.device != want.device or have.rank != want.rank:
        raise OpTypeError(f"{what} cannot be %{a.name}: {have}")
    for d, e in zip(want.shape, have.shape, strict=True):
        if as_sympy(d).free_symbols - subst.keys():
            continue  # a callee symbol that no bare dim binds: known only when it runs
        if sympy.expand(as_sympy(d).xreplace(subst) - as_sympy(e)) != 0:
            raise OpTypeError(f"{what} cannot be %{a.name}: {have}")


def _substitute(t: Type, subst: dict[sympy.Expr, sympy.Expr]) -> Type:
    if isinstance(t, ScalarType) or not subst:
        return t
    shape = tuple(simplify_dim(as_sympy(d).xreplace(subst)) for d in t.shape)
    strides = None if t.strides is None else tuple(
        simplify_dim(as_sympy(d).xreplace(subst)) for d in t.strides)
    return TensorType(t.dtype, shape, strides, t.device)


def _call_run(interp: Interpreter, args: list[Any], kwargs: dict[str, Any]) -> Any:
    ref = args[0]
    assert isinstance(ref, Ref)
    return tuple(interp.call(ref.name, args[1:]))


GRAPH_CALL = OpDef(
    "graph.call", "call another graph of the module: graph.call(@g, %a, ...)",
    _call_infer, _call_run,
    aliasing="alias",  # the callee may return its parameters or views of them
)


def _bind_infer(ctx: InferContext, args: Sequence[Arg], kwargs: Mapping[str, Arg]
                ) -> list[Type]:
    usage = "graph.bind_symbol(%t, u0) takes a one-element integer tensor and an unbacked symbol"
    if len(args) != 2 or not isinstance(args[0], Value) or not isinstance(args[0].type,
                                                                         TensorType):
        raise OpTypeError(usage)
    t = args[0].type
    if not t.dtype.is_integer or any(not (isinstance(d, int) and d == 1)
                                                        for d in t.shape):
        raise OpTypeError(f"{usage}, got %{args[0].name}: {t}")
    if not isinstance(args[1], sympy.Symbol) or not is_unbacked(args[1].name):
        raise OpTypeError(f"{usage}, got {print_arg(args[1])}")
    le = kwargs.get("le", [])
    if set(kwargs) - {"le"} or not isinstance(le, list) or not all(
            isinstance(e, int | sympy.Expr) and not isinstance(e, bool) for e in le):
        raise OpTypeError("graph.bind_symbol takes only le=[size expressions] (its asserts)")
    return [I64]


def _bind_run(interp: Interpreter, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The tensor's value (the interpreter binds the symbol and checks its asserts)."""
    return int(args[0].item())


GRAPH_BIND_SYMBOL = OpDef(
    BIND_SYMBOL, "bind unbacked symbol u0 to a one-element integer tensor's value, checked "
    "against u0's declared range and each le=[...] bound: graph.bind_symbol(%t, u0, le=[s0])",
    _bind_infer, _bind_run,
    has_side_effects=True,  # it binds the symbol later nodes read, and asserts: never removed
    aliasing="alias",  # (its result is a Python int, no storage: the trait that claims nothing)
)


def register_builtin_ops(registry: OpRegistry) -> None:
    registry.register_missing((GRAPH_CALL, GRAPH_BIND_SYMBOL))
