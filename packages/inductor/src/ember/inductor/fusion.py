"""The `fuse` pass: merge loop kernels so intermediate buffers are never written.

Rule 1: a `loop.pointwise` kernel whose buffer is read by exactly one other kernel
(pointwise or reduction) and is not a graph output is inlined into that reader: each load of the
buffer becomes the producer's body, with the producer's loop variables replaced by the load's
index expressions (a view between them is already part of that index). Applied until nothing
changes, this fuses pointwise chains into one kernel and pointwise producers into reductions. A
fused body may hold at most `max_nodes` computing nodes. `why_not_fused` says, for two kernels,
which rule kept them apart.

Rule 2, after rule 1 reaches its fixpoint: a `loop.reduction` whose buffer is not a graph output
and whose readers are all `loop.pointwise` kernels of the same outer domain (the reduction's
`ranges` a prefix of the reader's, each load of the buffer at `i0..i<k-1>`) is fused into each
reader: the load becomes `loop.reduce(@reduction_body, bufs..., ranges=, reduce_ranges=,
reduction=)`, computed once per outer index by the C++ kernel before its inner loops. Softmax and
layernorm become two kernels instead of four or more. A body holding a `loop.reduce` is not
inlined further.
"""

from __future__ import annotations

from ember.inductor.body import BodyBuilder, body_names, body_size
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


def _has_reduce(g: Graph) -> bool:
    return any(n.op == "loop.reduce" for n in g.nodes)


def _outer_index(k: int) -> list[str]:
    return [f"i{j}" for j in range(k)]


def why_not_fused(m: Module, g: Graph, producer: Node, consumer: Node, max_nodes: int = 64
                  ) -> str | None:
    """None if `fuse` may fuse `producer` into `consumer`, else the reason it may not."""
    if producer.op == "loop.reduction":
        return _why_not_reduction(m, g, producer, consumer, max_nodes)
    if producer.op != "loop.pointwise":
        return f"the producer is {producer.op}; only loop kernels are fused"
    if consumer.op not in KERNEL_OPS:
        return f"the consumer is {consumer.op}, not a loop kernel"
    r = producer.results[0]
    if r in g.outputs:
        return f"%{r.name} is a graph output and must be written anyway"
    if _has_reduce(_body(m, producer)) or _has_reduce(_body(m, consumer)):
        return "a body holding a fused reduction (loop.reduce) is not inlined further"
    readers = {id(n) for n in g.nodes if r in list(n.operands())}
    if readers != {id(consumer)}:
        return f"%{r.name} has {len(readers)} readers (inlining would recompute it)"
    size = body_size(_body(m, producer)) + body_size(_body(m, consumer))
    if size > max_nodes:
        return f"the fused body would have {size} nodes > max_nodes={max_nodes}"
    return None


def _why_not_reduction(m: Module, g: Graph, producer: Node, consumer: Node, max_nodes: int
                       ) -> str | None:
    r = producer.results[0]
    if r in g.outputs:
        return f"%{r.name} is a graph output and must be written anyway"
    if consumer.op != "loop.pointwise":
        return f"a reduction fuses only into loop.pointwise readers, not {consumer.op}"
    ranges = list(producer.kwargs["ranges"])  # type: ignore[arg-type]
    k = len(ranges)
    if list(consumer.kwargs["ranges"])[:k] != ranges:  # type: ignore[arg-type]
        return (f"the reader's domain {consumer.kwargs['ranges']} does not start with the "
                f"reduction's outer domain {ranges}")
    cbody = _body(m, consumer)
    outer = dict(zip(cbody.params, consumer.args[1:], strict=True))
    for n in cbody.nodes:
        if n.op == "loop.load" and outer[n.args[0]] is r:  # type: ignore[index]
            if list(n.kwargs["index"]) != _outer_index(k):  # type: ignore[arg-type]
                return (f"the reader loads %{r.name} at {n.kwargs['index']}, not at its outer "
                        f"index {_outer_index(k)}")
        if n.op == "loop.reduce" and len(n.kwargs["ranges"]) != k:  # type: ignore[arg-type]
            return "the reader already holds a fused reduction over another outer domain"
    size = body_size(_body(m, producer)) + body_size(cbody)
    if size > max_nodes:
        return f"the fused body would have {size} nodes > max_nodes={max_nodes}"
    return None


def fuse_reduction(m: Module, producer: Node, consumer: Node) -> tuple[Graph, list[Value]]:
    """The consumer's body with each load of the reduction's buffer replaced by one
    `loop.reduce` of the reduction's body, and the outer buffers the new body reads."""
    cbody = _body(m, consumer)
    ref = producer.args[0]
    assert isinstance(ref, Ref)
    bb = BodyBuilder(m, cbody.name)
    outer_c: dict[Value, Value] = {p: a for p, a in zip(cbody.params, consumer.args[1:],
                                                        strict=True) if isinstance(a, Value)}
    r = producer.results[0]
    vals: dict[Value, Value] = {}
    reduced: Value | None = None
    for n in cbody.nodes:
        if n.op == "loop.load":
            buf = outer_c[n.args[0]]  # type: ignore[index]
            if buf is r:
                if reduced is None:
                    args = [bb.buffer(a) for a in producer.args[1:] if isinstance(a, Value)]
                    reduced = bb.b.op("loop.reduce", [ref, *args],
                                      {k: producer.kwargs[k] for k in
                                       ("ranges", "reduce_ranges", "reduction")},
                                      type=n.results[0].type, name=r.name, loc=producer.loc)
                vals[n.results[0]] = reduced
                continue
            index = [parse_index(str(s)) for s in n.kwargs["index"]]  # type: ignore[union-attr]
            vals[n.results[0]] = bb.load(buf, index, n.loc)
            continue
        args2: list[object] = [vals.get(a, a) if isinstance(a, Value) else a for a in n.args]
        if n.op == "loop.reduce":
            args2 = [n.args[0], *[bb.buffer(outer_c[a]) for a in n.args[1:]
                                  if isinstance(a, Value)]]
        vals[n.results[0]] = bb.b.op(n.op, args2, dict(n.kwargs),
                                     type=n.results[0].type, name=n.results[0].name, loc=n.loc)
    return bb.finish(vals[cbody.outputs[0]]), bb.outer_args()


def fuse_reductions(m: Module, g: Graph, max_nodes: int) -> None:
    for p in [n for n in g.nodes if n.op == "loop.reduction"]:
        readers = [n for n in g.nodes if p.results[0] in list(n.operands())]
        if not readers or any(why_not_fused(m, g, p, c, max_nodes) is not None
                              for c in readers):
            continue
        for c in readers:
            body, outer = fuse_reduction(m, p, c)
            m.items[body.name] = body
            c.args = [c.args[0], *outer]
        g.nodes.remove(p)


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


@register_pass("fuse", "fuse loop kernels: pointwise chains, pointwise producers into "
               "reductions, reductions into their pointwise readers of the same outer domain")
def fuse(module: Module, *, max_nodes: int = 64, reductions: bool = True) -> Module:
    out = module.clone()
    bodies = body_names(out)
    for g in list(out.graphs.values()):
        if g.name not in bodies:
            fuse_graph(out, g, max_nodes)
            if reductions:
                fuse_reductions(out, g, max_nodes)
    return out
