"""Utilities that passes share: purity of ops, use maps, value replacement."""

from __future__ import annotations

from collections.abc import Mapping

from ember.ir.graph import Graph, Module, Node, Ref, Value, map_args
from ember.ir.registry import OpRegistry


def effects(node: Node, registry: OpRegistry, module: Module | None = None,
            _active: frozenset[str] = frozenset()) -> tuple[bool, bool]:
    """(has side effects, is nondeterministic) of a node. Unknown ops count as both: nothing
    is known about them. `graph.call` has the effects of its callee's nodes."""
    if node.op == "graph.call" and module is not None and node.args \
            and isinstance(node.args[0], Ref):
        callee = module.items.get(node.args[0].name)
        if not isinstance(callee, Graph) or callee.name in _active:
            return True, True  # missing callee or recursion: assume the worst
        side = nondet = False
        for n in callee.nodes:
            s, d = effects(n, registry, module, _active | {callee.name})
            side, nondet = side or s, nondet or d
        return side, nondet
    op = registry.lookup(node.op)
    if op is None:
        return True, True
    return op.has_side_effects, op.nondeterministic


def is_removable(node: Node, registry: OpRegistry, module: Module | None = None) -> bool:
    """A node may be deleted if nothing uses it and it has no side effects."""
    return not effects(node, registry, module)[0]


def is_mergeable(node: Node, registry: OpRegistry, module: Module | None = None) -> bool:
    """Two equal nodes may be merged if they are pure and deterministic."""
    return effects(node, registry, module) == (False, False)


def replace_uses(graph: Graph, mapping: Mapping[Value, Value]) -> None:
    """Rewrite every use of a key of `mapping` (node operands and outputs) in place."""
    if not mapping:
        return

    def sub(v: Value) -> Value:
        while v in mapping:
            v = mapping[v]
        return v

    for n in graph.nodes:
        n.args = [map_args(a, sub) for a in n.args]
        n.kwargs = {k: map_args(a, sub) for k, a in n.kwargs.items()}
    graph.outputs = [sub(o) for o in graph.outputs]


def live_values(graph: Graph, registry: OpRegistry, module: Module | None = None) -> set[Value]:
    """Values needed for the outputs or by nodes that must stay."""
    live: set[Value] = set(graph.outputs)
    for n in reversed(graph.nodes):
        if any(r in live for r in n.results) or not is_removable(n, registry, module):
            live.update(n.results)
            live.update(n.operands())
    return live
