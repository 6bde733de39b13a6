"""The `fuse` pass: merge loop kernels so intermediate buffers are never written.

Rule (this increment): a `loop.pointwise` kernel whose buffer is read by exactly one other kernel
(pointwise or reduction) and is not a graph output is inlined into that reader: each load of the
buffer becomes the producer's body, with the producer's loop variables replaced by the load's
index expressions (a view between them is already part of that index). Applied until nothing
changes, this fuses pointwise chains into one kernel and pointwise producers into reductions. A
fused body may hold at most `max_nodes` computing nodes. `why_not_fused` says, for two kernels,
which rule kept them apart.
"""

from __future__ import annotations

from ember.inductor.body import BodyBuilder, body_size
from ember.inductor.indexing import index_text, ivar, parse_index
from ember.inductor.indexing import substitute as subst_index
from ember.ir import Graph, Module, Node, Ref, Value
from ember.ir.passes import register_pass

KERNEL_OPS = ("loop.pointwise", "loop.reduction")


def _body(m: Module, n: Node) -> Graph:
    ref = n.args[0]
    assert isinstance(ref, Ref)
    g = m.items[ref.name]
    assert isinstance(g, Graph)
    return g


def why_not_fused(m: Module, g: Graph, producer: Node, consumer: Node, max_nodes: int = 64
                  ) -> str | None:
    """None if `fuse` may inline `producer` into `consumer`, else the reason it may not."""
    if producer.op != "loop.pointwise":
        return f"the producer is {producer.op}; only loop.pointwise is inlined (this increment)"
    if consumer.op not in KERNEL_OPS:
        return f"the consumer is {consumer.op}, not a loop kernel"
    r = producer.results[0]
    if r in g.outputs:
        return f"%{r.name} is a graph output and must be written anyway"
    readers = {id(n) for n in g.nodes if r in list(n.operands())}
    if readers != {id(consumer)}:
        return f"%{r.name} has {len(readers)} readers (inlining would recompute it)"
    size = body_size(_body(m, producer)) + body_size(_body(m, consumer))
    if size > max_nodes:
        return f"the fused body would have {size} nodes > max_nodes={max_nodes}"
    return None


def inline(m: Module, producer: Node, consumer: Node) -> tuple[Graph, list[Value]]:
    """The consumer's body with every load of the producer's buffer replaced by its body, and
    the outer buffers the new body reads."""
    pbody, cbody = _body(m, producer), _body(m, consumer)
    bb = BodyBuilder(m, cbody.name)
    outer_c = dict(zip(cbody.params, consumer.args[1:], strict=True))
    outer_p = dict(zip(pbody.params, producer.args[1:], strict=True))
    r = producer.results[0]
    vals: dict[Value, Value] = {}

    def copy(n: Node, vmap: dict[Value, Value], outer: dict[Value, object],
             sub: dict | None) -> None:
        if n.op == "loop.load":
            buf = outer[n.args[0]]  # type: ignore[index]
            assert isinstance(buf, Value)
            index = [subst_index(parse_index(str(s)), sub or {})
                     for s in n.kwargs["index"]]  # type: ignore[union-attr]
            vmap[n.results[0]] = bb.load(buf, index, n.loc)
            return
        kwargs = dict(n.kwargs)
        if n.op == "loop.index":
            kwargs["index"] = index_text(subst_index(parse_index(str(kwargs["index"])),
                                                     sub or {}))
        args = [vmap.get(a, a) if isinstance(a, Value) else a for a in n.args]
        vmap[n.results[0]] = bb.b.op(n.op, args, kwargs, type=n.results[0].type,
                                     name=n.results[0].name, loc=n.loc)

    for n in cbody.nodes:
        if n.op == "loop.load" and outer_c[n.args[0]] is r:  # type: ignore[index]
            sub = {ivar(k): parse_index(str(s))
                   for k, s in enumerate(n.kwargs["index"])}  # type: ignore[arg-type]
            pvals: dict[Value, Value] = {}
            for pn in pbody.nodes:
                copy(pn, pvals, outer_p, sub)
            vals[n.results[0]] = pvals[pbody.outputs[0]]
        else:
            copy(n, vals, outer_c, None)
    return bb.finish(vals[cbody.outputs[0]]), bb.outer_args()


def fuse_graph(m: Module, g: Graph, max_nodes: int) -> None:
    changed = True
    while changed:
        changed = False
        for p in g.nodes:
            if p.op != "loop.pointwise":
                continue
            readers = [n for n in g.nodes if p.results[0] in list(n.operands())]
            if len(readers) != 1 or why_not_fused(m, g, p, readers[0], max_nodes) is not None:
                continue
            c = readers[0]
            body, outer = inline(m, p, c)
            del m.items[_body(m, p).name]
            m.items[body.name] = body
            c.args = [c.args[0], *outer]
            g.nodes.remove(p)
            changed = True
            break


@register_pass("fuse", "fuse loop kernels: pointwise chains, pointwise producers into reductions")
def fuse(module: Module, *, max_nodes: int = 64) -> Module:
    out = module.clone()
    bodies = {a.name for g in out.graphs.values() for n in g.nodes if n.op in KERNEL_OPS
              for a in n.args if isinstance(a, Ref)}
    for g in list(out.graphs.values()):
        if g.name not in bodies:
            fuse_graph(out, g, max_nodes)
    return out
