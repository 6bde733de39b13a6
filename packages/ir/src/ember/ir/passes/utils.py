"""Utilities that passes share: purity of ops, use maps, value replacement."""

from __future__ import annotations

from collections.abc import Mapping

from ember.ir.graph import Graph, Node, Value, map_args
from ember.ir.registry import OpRegistry


def is_removable(node: Node, registry: OpRegistry) -> bool:
    """A node may be deleted or merged only if its op is known and has no side effects.

    Unknown ops are kept: nothing is known about them.
    """
    op = registry.lookup(node.op)
    return op is not None and not op.has_side_effects


def is_mergeable(node: Node, registry: OpRegistry) -> bool:
    """Two equal nodes may be merged if the op is pure and deterministic."""
    op = registry.lookup(node.op)
    return op is not None and not op.has_side_effects and not op.nondeterministic


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


def live_values(graph: Graph, registry: OpRegistry) -> set[Value]:
    """Values needed for the outputs or by nodes that must stay."""
    live: set[Value] = set(graph.outputs)
    for n in reversed(graph.nodes):
        if any(r in live for r in n.results) or not is_removable(n, registry):
            live.update(n.results)
            live.update(n.operands())
    return live
