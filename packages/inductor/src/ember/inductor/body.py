"""Building kernel bodies: small graphs over index values (see loopir.py), shared by the lowering
and fusion passes, and declaring their domains (ir-v1.1) once a pass has placed them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from ember.inductor.indexing import index_value
from ember.ir import Builder, Graph, Loc, Module, Node, Ref, TensorType, Value
from ember.ir.expr import Dim, to_text


class BodyBuilder:
    """Collects the buffers a body reads (outer values -> body parameters) and its nodes;
    identical loads (same buffer, same index) are emitted once."""

    def __init__(self, module: Module, name: str):
        self.module = module
        self.name = name
        self.b = Builder(module)
        self.params: dict[Value, Value] = {}  # outer buffer -> body parameter
        self._loads: dict[tuple[Value, tuple[Dim, ...]], Value] = {}

    def buffer(self, outer: Value) -> Value:
        p = self.params.get(outer)
        if p is None:
            p = Value(self.b.fresh(outer.name), outer.type)
            self.params[outer] = p
        return p

    def load(self, outer: Value, index: Sequence[Dim], loc: Loc | None = None) -> Value:
        values = [index_value(e) for e in index]
        key = (outer, tuple(values))
        v = self._loads.get(key)
        if v is None:
            assert isinstance(outer.type, TensorType)
            v = self.b.op("loop.load", [self.buffer(outer)], {"index": values},
                          type=TensorType(outer.type.dtype, (), None, outer.type.device),
                          name=f"{outer.name}.load", loc=loc)
            self._loads[key] = v
        return v

    def finish(self, result: Value) -> Graph:
        return Graph(self.name, list(self.params.values()), [result.type], self.b.nodes, [result])

    def outer_args(self) -> list[Value]:
        return list(self.params)


def body_size(g: Graph) -> int:
    """Nodes that compute (loads excluded), for fusion's max_nodes."""
    return sum(1 for n in g.nodes if n.op != "loop.load")


def fresh_body_name(module: Module, base: str, taken: set[str]) -> str:
    def used(k: int) -> bool:
        return f"{base}_k{k}" in module.items or f"{base}_k{k}" in taken

    # `{base}_k{k}` with k - 1 used and k free (the first free k where the used names are
    # k0..kN, as passes make them): found by doubling, then bisecting, in O(log N) lookups;
    # counting up from k0 made a 32-layer graph's thousands of bodies quadratic (seconds)
    k = 0
    if used(0):
        lo, hi = 0, 1
        while used(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # lo used, hi free
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if used(mid) else (lo, mid)
        k = hi
    name = f"{base}_k{k}"
    taken.add(name)
    return name


def node_text(n: Node) -> str:
    """`%a = prims.add` (for provenance comments)."""
    res = ", ".join("%" + r.name for r in n.results)
    return f"{res} = {n.op}"


BODY_OPS = ("loop.pointwise", "loop.reduction", "loop.reduce")
KERNEL_OPS = ("loop.pointwise", "loop.reduction")


def declare_domains(module: Module) -> None:
    """Write each kernel body's domain (ir-v1.1 `domain(i0 < 4, r0 < 8)`) from the kernels that
    run it: a loop.pointwise/loop.reduction binds i<k> to its ranges and r<k> to its
    reduce_ranges; a loop.reduce binds its body's i<k> to the enclosing body's first loops and
    r<k> to its own reduce_ranges. The passes that make or reshape bodies call this last. A body
    that two kernels run over different extents (bodies are shared by structure) declares none,
    and is checked from each kernel as in ir-v1.0."""
    seen: dict[str, dict[str, Dim]] = {}
    clash: set[str] = set()
    names = body_names(module)
    tops = [g for g in module.graphs.values() if g.name not in names]

    def visit(name: str, loops: list[Dim], red: list[Dim], depth: int) -> None:
        g = module.items.get(name)
        if not isinstance(g, Graph) or depth > 64:
            return
        domain = {**{f"i{k}": d for k, d in enumerate(loops)},
                  **{f"r{k}": d for k, d in enumerate(red)}}
        if name in seen:
            if {k: to_text(d) for k, d in seen[name].items()} \
                    != {k: to_text(d) for k, d in domain.items()}:
                clash.add(name)
            return
        seen[name] = g.domain = domain
        for n in g.nodes:
            if n.op == "loop.reduce" and isinstance(n.args[0], Ref):
                outer, inner = n.kwargs.get("ranges"), n.kwargs.get("reduce_ranges")
                whole = [*loops, *red]
                if isinstance(outer, list) and isinstance(inner, list) \
                        and len(outer) <= len(whole):
                    visit(n.args[0].name, whole[:len(outer)], list(inner), depth + 1)

    for top in tops:
        for n in top.nodes:
            if n.op in KERNEL_OPS and n.args and isinstance(n.args[0], Ref):
                ranges = n.kwargs.get("ranges")
                red = n.kwargs.get("reduce_ranges", []) if n.op == "loop.reduction" else []
                if isinstance(ranges, list) and isinstance(red, list):
                    visit(n.args[0].name, list(ranges), list(red), 0)
    for name in clash:
        g = module.items[name]
        assert isinstance(g, Graph)
        g.domain = None



def body_names(module: Module) -> set[str]:
    """The graphs of `module` that are kernel bodies (referenced by a loop node, or by a
    `loop.reduce` inside another body)."""
    return {a.name for g in module.graphs.values() for n in g.nodes if n.op in BODY_OPS
            for a in n.args if isinstance(a, Ref)}


class SignMemo:
    """What `body_signature` computed, by object identity (each object kept here, so no id is
    reused while the memo lives; the caller must not change the graphs meanwhile): each
    body's signature, and the text of each index expression. Printing sympy expressions is
    the cost, and fusion's copies of a body share their expression objects (Graph.clone)."""

    def __init__(self) -> None:
        self.sigs: dict[int, tuple[Graph, tuple[object, ...]]] = {}
        self.texts: dict[int, tuple[object, str]] = {}

    def text(self, x: object) -> str:
        """`repr(x)`, lists and tuples item by item, each sympy expression printed once."""
        if isinstance(x, (list, tuple)):
            inner = ", ".join(self.text(y) for y in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner},)"
        if not isinstance(x, sympy.Basic):
            return repr(x)
        hit = self.texts.get(id(x))
        if hit is None or hit[0] is not x:
            hit = self.texts[id(x)] = (x, repr(x))
        return hit[1]


def body_signature(items: Mapping[str, object], g: Graph, memo: SignMemo | None = None
                   ) -> tuple[object, ...]:
    """A body's structure, equal for bodies that compute the same thing whatever their names
    (fusion copies bodies; duplicates are merged, and C++ computes a reduction once).
    `memo` is kept by callers that sign many bodies: each one is signed once (see SignMemo)."""
    memo = memo if memo is not None else SignMemo()
    if (hit := memo.sigs.get(id(g))) is not None and hit[0] is g:
        return hit[1]
    pos: dict[Value, str] = {p: f"p{k}:{p.type}" for k, p in enumerate(g.params)}
    out: list[object] = []
    for k, n in enumerate(g.nodes):
        args: list[object] = []
        for a in n.args:
            sub = items.get(a.name) if isinstance(a, Ref) else None
            args.append(pos[a] if isinstance(a, Value) else
                        body_signature(items, sub, memo) if isinstance(sub, Graph)
                        else memo.text(a))
        out.append((n.op, tuple(args), tuple((key, memo.text(v)) for key, v in
                                             sorted(n.kwargs.items(), key=lambda kv: kv[0])),
                    str(n.results[0].type)))
        pos[n.results[0]] = f"n{k}"
    sig = (tuple(out), tuple(pos[o] for o in g.outputs))
    memo.sigs[id(g)] = (g, sig)
    return sig
