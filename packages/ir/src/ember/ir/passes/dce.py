"""dce: delete nodes whose results nothing uses."""

from __future__ import annotations

from ember.ir.graph import Module
from ember.ir.passes.manager import register_pass
from ember.ir.passes.utils import live_values
from ember.ir.registry import OpRegistry


@register_pass("dce", "remove nodes whose results are unused and that have no side effects")
def dce(module: Module, *, registry: OpRegistry) -> Module:
    out = module.clone()
    for g in out.graphs.values():
        live = live_values(g, registry, out)
        g.nodes = [n for n in g.nodes if any(r in live for r in n.results)]
    return out
