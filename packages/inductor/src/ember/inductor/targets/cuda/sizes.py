"""The size symbols a Triton kernel's body reads (render.py): its run-time size arguments.

A kernel takes as arguments the sizes of its buffers' shapes and ranges, and also those its
body reads that no buffer carries: a size as an operand (`prims.add(%pos, s1)`: a cache
position plus the prompt length, transformers' static cache at batch 8), in a load's index
(an offset into a buffer) or in `loop.index`. Loop variables (i0, r0, ...) are not sizes.
"""

from __future__ import annotations

from typing import Any

import sympy

from ember.inductor.indexing import parse_index
from ember.ir import Graph, Ref


def _is_loop_var(name: str) -> bool:
    return name[:1] in "ir" and name[1:].isdigit()


def _sym_set(e: Any) -> set[sympy.Symbol]:
    if isinstance(e, sympy.Basic):
        return {f for f in e.free_symbols
                if isinstance(f, sympy.Symbol) and not _is_loop_var(f.name)}
    if isinstance(e, (list, tuple)):
        return {f for x in e for f in _sym_set(x)}
    return set()


def body_symbols(body: Graph, items: dict[str, Any]) -> dict[str, set[sympy.Symbol]]:
    """The size symbols body `body` (and the reduction bodies it refers to) reads, apart from
    its loop variables: "index", in load/index expressions; "value", as operands and in other
    attributes (prims.full's value, a fused reduction's ranges)."""
    out: dict[str, set[sympy.Symbol]] = {"index": set(), "value": set()}
    seen: set[str] = set()
    todo = [body]
    while todo:
        g = todo.pop()
        for n in g.nodes:
            for k, v in n.kwargs.items():
                if k == "index" and n.op in ("loop.load", "loop.index"):
                    idx = v if isinstance(v, list) else [v]
                    out["index"] |= _sym_set([parse_index(x) for x in idx])
                else:
                    out["value"] |= _sym_set(v)
            out["value"] |= _sym_set([a for a in n.args if isinstance(a, sympy.Basic)])
            ref = n.args[0] if n.op == "loop.reduce" and n.args else None
            if isinstance(ref, Ref) and ref.name not in seen:
                seen.add(ref.name)
                sub = items.get(ref.name)
                if isinstance(sub, Graph):
                    todo.append(sub)
    return out
