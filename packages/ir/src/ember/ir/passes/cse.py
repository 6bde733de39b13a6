"""cse: merge nodes that compute the same op on the same arguments."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import sympy

from ember.ir.graph import Arg, Module, Value, map_args
from ember.ir.passes.manager import register_pass
from ember.ir.passes.utils import is_mergeable
from ember.ir.registry import OpRegistry


def arg_key(a: Arg) -> Hashable:
    """A hashable key that tells apart everything the printer tells apart (1 vs 1.0 vs true,
    0.0 vs -0.0); values by identity."""
    if isinstance(a, list):
        return ("list", tuple(arg_key(x) for x in a))
    if isinstance(a, Value):
        return ("value", id(a))
    if isinstance(a, float):
        return ("float", "nan" if math.isnan(a) else a.hex())
    if isinstance(a, sympy.Expr):
        return ("expr", a)
    return (type(a).__name__, a)


def _substitution(mapping: dict[Value, Value]) -> Callable[[Value], Value]:
    return lambda v: mapping.get(v, v)


@register_pass("cse", "merge nodes with the same op, arguments and result types")
def cse(module: Module, *, registry: OpRegistry) -> Module:
    out = module.clone()
    for g in out.graphs.values():
        seen: dict[Hashable, list[Value]] = {}
        mapping: dict[Value, Value] = {}  # merged result -> the earlier, equal result
        sub = _substitution(mapping)

        kept = []
        for n in g.nodes:
            n.args = [map_args(a, sub) for a in n.args]
            n.kwargs = {k: map_args(a, sub) for k, a in n.kwargs.items()}
            if not is_mergeable(n, registry, out):
                kept.append(n)
                continue
            key = (n.op, tuple(arg_key(a) for a in n.args),
                   tuple(sorted((k, arg_key(a)) for k, a in n.kwargs.items())),  # any order
                   tuple(str(r.type) for r in n.results))
            prev = seen.get(key)
            if prev is None:
                seen[key] = n.results
                kept.append(n)
            else:
                mapping.update(zip(n.results, prev, strict=True))
        g.nodes = kept
        g.outputs = [sub(o) for o in g.outputs]
    return out
