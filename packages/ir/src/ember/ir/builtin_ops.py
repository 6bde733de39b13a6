"""Ops of ember.ir's own `graph` dialect: `graph.call(@g, args...)` runs another graph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ember.ir.graph import Arg, Graph, Ref
from ember.ir.registry import InferContext, OpDef, OpRegistry, OpTypeError
from ember.ir.types import Type

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
    return list(g.result_types)


def _call_run(interp: Interpreter, args: list[Any], kwargs: dict[str, Any]) -> Any:
    ref = args[0]
    assert isinstance(ref, Ref)
    return tuple(interp.call(ref.name, args[1:]))


GRAPH_CALL = OpDef(
    "graph.call", "call another graph of the module: graph.call(@g, %a, ...)",
    _call_infer, _call_run,
)


def register_builtin_ops(registry: OpRegistry) -> None:
    if registry.lookup(GRAPH_CALL.name) is None:
        registry.register(GRAPH_CALL)
