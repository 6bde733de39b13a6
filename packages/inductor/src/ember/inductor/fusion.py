"""The `fuse` pass: merge loop kernels so intermediate buffers are never written.

The kernels of a graph and their buffers form a dependency graph (networkx, `dependency_graph`).
Four rules run to a fixpoint:

1. **Inline** a `loop.pointwise` kernel whose buffer is read by exactly one other kernel and is
   not a graph output into that reader: each load of the buffer (also inside the bodies of
   reductions the reader holds) becomes the producer's body, its loop variables replaced by the
   load's index. A producer holding fused reductions (`loop.reduce`, computed per outer index)
   is inlined only where it is read at that outer index.
2. **Fuse a reduction into its readers**: a `loop.reduction` that is not a graph output, whose
   readers all cover its outer domain (their `ranges` start with its `ranges`) and read it only
   at the outer index `i0..i<k-1>`, becomes `loop.reduce(@its_body, bufs..., ranges=,
   reduce_ranges=, reduction=)` in each reader's body, also inside the reader's own reductions
   (variance's sum of squares reads the mean). A `loop.reduction` reader is first rewritten as a
   `loop.pointwise` whose body is its `loop.reduce`.
3. **Horizontal fusion** (`horizontal=true`): kernels over the same `ranges` that read a common
   buffer and do not depend on each other become one kernel whose body returns several values
   (a multi-output kernel); the C++ kernel then reads the common input once per outer index and
   computes independent reductions over the same domain in one pass (mean and var of a row).

4. **A graph output written by its reader**: a `loop.pointwise` kernel that is a graph output,
   read by exactly one kernel over the same `ranges` (a pointwise kernel, or a reduction no
   kernel reads), is inlined into it as in rule 1, and the reader also returns the producer's
   value at its own index (one more result): after CSE, `mean` and `var` of the same rows share
   the mean, which is an output; they stay one kernel.

5. **Recompute a cheap multi-reader producer** (`recompute=N`, N > 0; default -1: the graph's
   target's `FusionHooks.recompute`, the CPU target's RECOMPUTE_NODES): a single-output
   `loop.pointwise` kernel with no reductions in its body, at most N computing nodes, reading
   at most `RECOMPUTE_READS` buffers (or, where all but one of them are small vectors, up to
   `RECOMPUTE_READS_SMALL` buffers and 2N nodes: a BatchNorm+ReLU's masked cotangent), not a graph output, whose readers are all loop kernels
   rule 1 could fuse it into, is inlined into every reader and never written (TorchInductor
   inlines such pointwise values into each user likewise): a training backward's `x - mean`,
   `xhat`, the ReLU-masked cotangent, each read by two or three kernels, were each a full
   write and read-backs; now the readers reload the producer's inputs instead.

Softmax, layernorm(+gelu) and var become one kernel each. A fused body holds at most `max_nodes`
computing nodes, except a producer inlined into a reader that only moves its elements, each
once (a copy to another layout: the fused body is the producer's own). `why_not_fused` names the rule that keeps two kernels apart; `fuse{explain=true}`
prints it for every producer -> consumer edge left unfused (stderr).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import networkx as nx

from ember.inductor.body import (
    BodyBuilder,
    SignMemo,
    body_names,
    body_signature,
    body_size,
    declare_domains,
    fresh_body_name,
)
from ember.inductor.indexing import index_text, index_value, ivar, parse_index
from ember.inductor.indexing import substitute as subst_index
from ember.inductor.targets import Target, device_kind, graph_devices, targets
from ember.ir import Graph, Module, Node, Ref, TensorType, Value
from ember.ir.expr import Dim
from ember.ir.passes import register_pass

KERNEL_OPS = ("loop.pointwise", "loop.reduction")
# rule 5: at most this many distinct buffers read by a recomputed producer (each reader then
# reads them instead of the producer's one buffer: more would cost more reads than the write
# and read-backs it saves). Per-channel vectors count too: a BatchNorm's xhat (x, mean, rstd)
# is recomputed, while not counting vectors at all also recomputed chains reading two full-size
# buffers plus vectors, measured slower on the conv+BN training step (1 thread: 3 reads 14.8 ms,
# 2 reads 16.2 ms, vectors not counted 22 ms)
RECOMPUTE_READS = 3
RECOMPUTE_NODES = 12  # rule 5's default: the computing nodes of a producer worth recomputing
# ... or this many, where all but one are small (per-channel vectors, a [N, C] cotangent: at
# most 1/16 of the producer's elements): the re-reads are one full-size buffer plus vectors
# that stay in cache (a BatchNorm+ReLU's masked cotangent: x, mean, rstd, weight, bias, the
# pooled cotangent; written, it was a full-size buffer live next to the next one)
RECOMPUTE_READS_SMALL = 6


def _numel(v: Value) -> int | None:
    t = v.type
    if not isinstance(t, TensorType) or not all(isinstance(d, int) for d in t.shape):
        return None
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def _small(v: Value, of: Value) -> bool:
    a, b = _numel(v), _numel(of)
    return a is not None and b is not None and a * 16 <= b

# replace(buffer, index, builder) -> the value a load of `buffer` at `index` becomes, or None
Replace = Callable[[Value, list[Dim], BodyBuilder], Value | None]


def _body(m: Module, n: Node) -> Graph:
    ref = n.args[0]
    assert isinstance(ref, Ref)
    g = m.items[ref.name]
    assert isinstance(g, Graph)
    return g


def _loads(m: Module, body: Graph, outer: dict[Value, Value], depth: int | None = None
           ) -> list[tuple[Value, list[str], int | None]]:
    """Every load in `body` and the bodies of its reductions: (outer buffer, index, the outer
    depth of the reduction it sits in, None at the top)."""
    out: list[tuple[Value, list[str], int | None]] = []
    for n in body.nodes:
        if n.op == "loop.load":
            out.append((outer[n.args[0]], [index_text(s) for s in n.kwargs["index"]],  # type: ignore
                        depth))
        elif n.op == "loop.reduce":
            sub = _body(m, n)
            souter = {p: outer[a] for p, a in zip(sub.params, n.args[1:], strict=True)
                      if isinstance(a, Value)}
            k = len(n.kwargs["ranges"])  # type: ignore[arg-type]
            out += _loads(m, sub, souter, k if depth is None else min(depth, k))
    return out


def _reduce_depth(m: Module, body: Graph) -> int:
    """The longest outer domain of the reductions a body holds (0 if none)."""
    return max((len(n.kwargs["ranges"]) for n in body.nodes  # type: ignore[arg-type]
                if n.op == "loop.reduce"), default=0)


def _outer(body: Graph, node: Node) -> dict[Value, Value]:
    return {p: a for p, a in zip(body.params, node.args[1:], strict=True)
            if isinstance(a, Value)}


def _readers(g: Graph, v: Value) -> list[Node]:
    return [n for n in g.nodes if v in list(n.operands())]


Readers = Callable[[Value], list[Node]]


class _Unknown:
    """Not known yet (target_veto's `target`: look it up)."""


UNKNOWN = _Unknown()


def _operand_set(n: Node) -> set[Value]:
    """`set(n.operands())` without its nested generators: fuse asks it of every node each time
    it rebuilds its reader index or dependency graph, once per horizontal merge (2.4k nodes
    and 53 merges on maxvit_t: 40% of fuse)."""
    out: set[Value] = set()
    stack: list[object] = [*n.args, *n.kwargs.values()]
    while stack:
        a = stack.pop()
        if isinstance(a, Value):
            out.add(a)
        elif isinstance(a, list):
            stack.extend(a)
    return out


class _ReaderIndex:
    """The nodes reading each value, in graph order, kept up to date while vertical fusion
    rewrites and removes nodes (it never reorders them). Scanning the graph for every lookup
    made `fuse` cubic in the node count: 287 s of a 305 s mobilenetv2 compile."""

    def __init__(self, g: Graph):
        self.target = graph_target(g)  # fusion keeps every value's device
        self.pos = {id(n): k for k, n in enumerate(g.nodes)}
        self.of: dict[Value, list[Node]] = {}
        self.reads: dict[int, set[Value]] = {}
        for n in g.nodes:  # in graph order: each list is built sorted
            vals = self.reads[id(n)] = _operand_set(n)
            for v in vals:
                self.of.setdefault(v, []).append(n)

    def __call__(self, v: Value) -> list[Node]:
        return list(self.of.get(v, ()))

    def add(self, n: Node) -> None:
        vals = _operand_set(n)
        self.reads[id(n)] = vals
        for v in vals:
            lst = self.of.setdefault(v, [])
            lst.append(n)
            lst.sort(key=lambda x: self.pos[id(x)])

    def drop(self, n: Node) -> None:
        for v in self.reads.pop(id(n), set()):
            self.of[v] = [x for x in self.of[v] if x is not n]


def _at_outer(index: list[str], k: int) -> bool:
    return index[:k] == [f"i{j}" for j in range(k)]


def recompute_veto(m: Module, g: Graph, producer: Node, readers: list[Node], recompute: int,
                   max_nodes: int = 64, index: Readers | None = None) -> str | None:
    """Rule 5: None if `producer` may be inlined into all of `readers` (recomputed in each),
    else why not."""
    r = producer.results[0]
    if producer.op != "loop.pointwise" or len(producer.results) != 1:
        return "only single-output pointwise kernels are recomputed"
    if r in g.outputs:
        return f"%{r.name} is a graph output and must be written anyway"
    pbody = _body(m, producer)
    ops = set(producer.operands())
    # one full-size read (the rest small vectors): twice the computing nodes are worth it
    one_large = sum(1 for v in ops if not _small(v, r)) <= 1
    if _reduce_depth(m, pbody) or body_size(pbody) > recompute * (2 if one_large else 1):
        return f"%{r.name} is too costly to recompute (recompute={recompute})"
    if len(ops) > RECOMPUTE_READS and not (len(ops) <= RECOMPUTE_READS_SMALL and one_large):
        return f"%{r.name} reads more than {RECOMPUTE_READS} buffers"
    for c in readers:
        why = why_not_fused(m, g, producer, c, max_nodes, index, several=True)
        if why is not None:
            return why
    return None


def why_not_fused(m: Module, g: Graph, producer: Node, consumer: Node, max_nodes: int = 64,
                  readers: Readers | None = None, several: bool = False) -> str | None:
    """None if `fuse` may fuse `producer` into `consumer`, else the reason it may not
    (`readers`: an index of g's readers, else g is scanned; `several`: rule 5, the producer
    may have other readers)."""
    read = readers if readers is not None else (lambda v: _readers(g, v))
    if producer.op not in KERNEL_OPS:
        return f"the producer is {producer.op}; only loop kernels are fused"
    if consumer.op not in KERNEL_OPS:
        return f"the consumer is {consumer.op}, not a loop kernel"
    r = producer.results[0]
    # rule 4 (a graph output written by its reader) where the reader covers the same domain
    # and is not a reduction that rule 2 may still fuse into its own readers
    if r in g.outputs and not (producer.op == "loop.pointwise"
                               and consumer.kwargs["ranges"] == producer.kwargs["ranges"]
                               and (consumer.op == "loop.pointwise"
                                    or not read(consumer.results[0]))):
        return f"%{r.name} is a graph output and must be written anyway"
    pbody, cbody = _body(m, producer), _body(m, consumer)
    if producer.op == "loop.pointwise":
        if len(producer.results) > 1:
            return "the producer is a multi-output kernel"
        rs = read(r)
        if not several and [id(n) for n in rs] != [id(consumer)]:
            return f"%{r.name} has {len(rs)} readers (inlining would recompute it)"
        k = _reduce_depth(m, pbody)
    else:
        k = len(producer.kwargs["ranges"])  # type: ignore[arg-type]
        if list(consumer.kwargs["ranges"])[:k] != list(producer.kwargs["ranges"]):  # type: ignore
            return (f"the reader's domain {consumer.kwargs['ranges']} does not start with the "
                    f"reduction's outer domain {producer.kwargs['ranges']}")
    for buf, index, depth in _loads(m, cbody, _outer(cbody, consumer)):
        if buf is not r or k == 0:
            continue
        if not _at_outer(index, k):
            return (f"the reader loads %{r.name} at {index}, not at its outer index "
                    f"{[f'i{j}' for j in range(k)]}")
        if depth is not None and depth < k:
            return f"%{r.name} is read inside a reduction over a shorter outer domain"
    size = body_size(pbody) + body_size(cbody)
    if size > max_nodes and not _moves_once(m, cbody, consumer, r):
        return f"the fused body would have {size} nodes > max_nodes={max_nodes}"
    return target_veto(m, g, producer, consumer,
                       readers.target if isinstance(readers, _ReaderIndex) else UNKNOWN)


def _moves_once(m: Module, cbody: Graph, consumer: Node, r: Value) -> bool:
    """Whether `consumer` only moves `r`'s elements, each once: no computing node, one load
    (of `r`), as many iterations as `r` has elements (a copy to another layout: a max pool's
    window chain copied NHWC for its convolution). Inlined, the body is the producer's own, so
    max_nodes does not apply; apart, the producer writes a buffer the copy reads back."""
    if consumer.op != "loop.pointwise" or body_size(cbody) != 0:
        return False
    loads = _loads(m, cbody, _outer(cbody, consumer))
    n = 1
    for d in consumer.kwargs["ranges"]:  # type: ignore[union-attr]
        if not isinstance(d, int):
            return False
        n *= d
    return len(loads) == 1 and loads[0][0] is r and n == _numel(r)


def graph_target(g: Graph) -> Target | None:
    """The target of g's one device kind (None: several kinds, or none registered)."""
    kinds = {device_kind(d) for d in graph_devices(g)} or {"cpu"}
    return targets().get(kinds.pop()) if len(kinds) == 1 else None


def target_veto(m: Module, g: Graph, a: Node, b: Node,
                target: Target | None | _Unknown = UNKNOWN) -> str | None:
    """The reason the target of g's device gives (its FusionHooks.veto) to keep kernels a and
    b apart, or None (no target, no veto, or the veto lets them fuse). `target`: g's target as
    `graph_target` gives it, where the caller knows it (fusion asks for thousands of pairs
    of one graph: each look-up scans every value's device)."""
    if isinstance(target, _Unknown):
        target = graph_target(g)
    veto = target.fusion.veto if target is not None else None
    why = veto(m, g, a, b) if veto is not None else None
    return f"the {target.device_kind} target keeps them apart: {why}" \
        if why is not None and target is not None else None


# ---- rebuilding bodies -------------------------------------------------------------------------

class _Rebuild:
    """Copies bodies into a builder, replacing loads (`replace`) and rebuilding the bodies of
    the reductions they hold the same way (new graphs of the module)."""

    def __init__(self, m: Module, base: str, taken: set[str]):
        self.m, self.base, self.taken = m, base, taken

    def copy(self, body: Graph, outer: dict[Value, Value], bb: BodyBuilder,
             replace: Replace | None, subst: dict | None = None) -> dict[Value, Value]:
        vals: dict[Value, Value] = {}
        for n in body.nodes:
            res = n.results[0]
            if n.op == "loop.load":
                buf = outer[n.args[0]]  # type: ignore[index]
                index = [subst_index(parse_index(s), subst or {})
                         for s in n.kwargs["index"]]  # type: ignore[union-attr]
                new = replace(buf, index, bb) if replace is not None else None
                vals[res] = new if new is not None else bb.load(buf, index, n.loc)
                continue
            kwargs = dict(n.kwargs)
            if n.op == "loop.reduce":
                sub = _body(self.m, n)
                sbb = BodyBuilder(self.m, fresh_body_name(self.m, self.base, self.taken))
                souter = {p: outer[a] for p, a in zip(sub.params, n.args[1:], strict=True)
                          if isinstance(a, Value)}
                svals = self.copy(sub, souter, sbb, replace)
                newsub = sbb.finish(svals[sub.outputs[0]])
                self.m.items[newsub.name] = newsub
                args: list[object] = [Ref(newsub.name),
                                      *[bb.buffer(x) for x in sbb.outer_args()]]
            else:
                if n.op == "loop.index":
                    kwargs["index"] = index_value(subst_index(parse_index(kwargs["index"]),
                                                              subst or {}))
                args = [vals.get(a, a) if isinstance(a, Value) else a for a in n.args]
            vals[res] = bb.b.op(n.op, args, kwargs, type=res.type, name=res.name, loc=n.loc)
        return vals

    def producer_at(self, producer: Node, index: list[Dim], bb: BodyBuilder) -> Value:
        """The producer's value at `index` (its loop variables substituted)."""
        pbody = _body(self.m, producer)
        sub = {ivar(k): e for k, e in enumerate(index)}
        vals = self.copy(pbody, _outer(pbody, producer), bb, None, sub)
        return vals[pbody.outputs[0]]

    def reduce_of(self, producer: Node, bb: BodyBuilder) -> Value:
        """The reduction `producer` as a `loop.reduce` of its body."""
        res = producer.results[0]
        args = [bb.buffer(a) for a in producer.args[1:] if isinstance(a, Value)]
        kw = {k: producer.kwargs[k] for k in ("ranges", "reduce_ranges", "reduction")}
        return bb.b.op("loop.reduce", [producer.args[0], *args], kw,
                       type=TensorType(_tt(res).dtype, (), None, _tt(res).device),
                       name=res.name, loc=producer.loc)


def _tt(v: Value) -> TensorType:
    assert isinstance(v.type, TensorType)
    return v.type


def _set_body(m: Module, node: Node, bb: BodyBuilder, results: Sequence[Value]) -> None:
    body = Graph(bb.name, list(bb.params.values()), [r.type for r in results], bb.b.nodes,
                 list(results))
    m.items[body.name] = body
    node.args = [Ref(body.name), *bb.outer_args()]


def fuse_into(m: Module, producer: Node, consumer: Node, taken: set[str]) -> None:
    """Rule 1 (pointwise producer) or rule 2 (reduction producer): rewrite the consumer."""
    r = producer.results[0]
    rb = _Rebuild(m, _base(m, consumer), taken)

    def replace(buf: Value, index: list[Dim], bb: BodyBuilder) -> Value | None:
        if buf is not r:
            return None
        if producer.op == "loop.reduction":
            return rb.reduce_of(producer, bb)
        return rb.producer_at(producer, index, bb)
    cbody = _body(m, consumer)
    bb = BodyBuilder(m, cbody.name)  # the consumer keeps its body's name
    vals = rb.copy(cbody, _outer(cbody, consumer), bb, replace)
    _set_body(m, consumer, bb, [vals[o] for o in cbody.outputs])


def fuse_keeping(m: Module, producer: Node, consumer: Node, taken: set[str]) -> None:
    """Rule 1 for a producer that is a graph output: the consumer (same domain) computes it
    once at its own index, writes it as one more result, and reads it from there."""
    if consumer.op == "loop.reduction":
        _as_pointwise(m, consumer, taken)
    r = producer.results[0]
    rb = _Rebuild(m, _base(m, consumer), taken)
    cbody = _body(m, consumer)
    bb = BodyBuilder(m, cbody.name)
    ident = [ivar(k) for k in range(len(producer.kwargs["ranges"]))]  # type: ignore[arg-type]
    own = rb.producer_at(producer, ident, bb)

    def replace(buf: Value, index: list[Dim], b: BodyBuilder) -> Value | None:
        if buf is not r:
            return None
        if b is bb and [index_text(e) for e in index] == [index_text(e) for e in ident]:
            return own
        return rb.producer_at(producer, index, b)
    vals = rb.copy(cbody, _outer(cbody, consumer), bb, replace)
    _set_body(m, consumer, bb, [*(vals[o] for o in cbody.outputs), own])
    consumer.results = [*consumer.results, r]
    r.node = consumer


def _as_pointwise(m: Module, node: Node, taken: set[str]) -> None:
    """A `loop.reduction` as the `loop.pointwise` whose body is its `loop.reduce`."""
    bb = BodyBuilder(m, fresh_body_name(m, _base(m, node), taken))
    v = _Rebuild(m, bb.name, taken).reduce_of(node, bb)
    ranges = node.kwargs["ranges"]
    _set_body(m, node, bb, [v])
    node.op = "loop.pointwise"
    node.kwargs = {"ranges": ranges}


def _base(m: Module, node: Node) -> str:
    name = _body(m, node).name
    return name.rsplit("_k", 1)[0]


# ---- the rules -----------------------------------------------------------------------------------

def dependency_graph(g: Graph) -> nx.DiGraph:
    """Kernel nodes (by position) with an edge producer -> reader for every buffer read."""
    dg = nx.DiGraph()
    where = {r: i for i, n in enumerate(g.nodes) for r in n.results}
    for i, n in enumerate(g.nodes):
        dg.add_node(i)
        for v in _operand_set(n):
            if v in where:
                dg.add_edge(where[v], i)
    return dg


def _vertical(m: Module, g: Graph, max_nodes: int, reductions: bool, taken: set[str],
              start: int = 0, recompute: int = 0) -> bool:
    """Rules 1, 2 and 4 (and 5 where `recompute` > 0) to a fixpoint, always fusing the first
    fusable producer in graph order.
    After a fusion the scan resumes at the first node whose fusability it may have changed
    (the consumers, and the producers of every buffer they or the fused producer read): nodes
    before it were not fusable and still are not. `start`: the first node that may be fusable
    (fuse's rescan after a horizontal merge)."""
    rd = _ReaderIndex(g)
    fused = False
    k = start
    while k < len(g.nodes):
        p = g.nodes[k]
        done: list[Node] = []
        if p.op == "loop.pointwise":
            readers = rd(p.results[0])
            if len(readers) == 1 and why_not_fused(m, g, p, readers[0], max_nodes,
                                                   rd) is None:
                if p.results[0] in g.outputs:
                    fuse_keeping(m, p, readers[0], taken)
                else:
                    fuse_into(m, p, readers[0], taken)
                done = readers
            elif len(readers) > 1 and recompute > 0 and recompute_veto(
                    m, g, p, readers, recompute, max_nodes, rd) is None:
                for c in readers:
                    fuse_into(m, p, c, taken)
                done = readers
        elif p.op == "loop.reduction" and reductions:
            readers = rd(p.results[0])
            if readers and all(why_not_fused(m, g, p, c, max_nodes, rd) is None
                               for c in readers):
                for c in readers:
                    fuse_into(m, p, c, taken)
                done = readers
        if not done:
            k += 1
            continue
        fused = True
        touched = set(rd.reads[id(p)])
        rd.drop(p)
        for c in done:
            touched |= rd.reads[id(c)]
            rd.drop(c)
            rd.add(c)
            touched |= rd.reads[id(c)]
        g.nodes.remove(p)
        first = min([rd.pos[id(c)] for c in done]
                    + [rd.pos[id(v.node)] for v in touched
                       if v.node is not None and id(v.node) in rd.reads])
        # nodes from k on (p's old place) were never looked at: resume no later than there
        k = min(k, next((j for j, n in enumerate(g.nodes) if rd.pos[id(n)] >= first),
                        len(g.nodes)))
    return fused


def _horizontal(m: Module, g: Graph, max_nodes: int, taken: set[str]) -> int | None:
    """Merge the first pair of kernels (a < b in graph order) over the same ranges that read a
    common buffer and neither depends on the other. Candidates come from an index of each
    buffer's kernel readers, dependence from ancestor bitsets: the pairwise scan with a path
    search per pair took seconds per call on a DenseNet, and fuse calls it once per merge.
    Returns None (nothing merged) or the position of the first node whose vertical fusability
    the merge may have changed: the merged kernel's and its producers' (their readers
    changed); every other node was not fusable before and still is not."""
    dg = dependency_graph(g)
    reads: dict[int, set[Value]] = {}
    readers: dict[Value, list[int]] = {}
    for i, n in enumerate(g.nodes):
        if n.op in KERNEL_OPS:
            reads[i] = _operand_set(n)
            for v in reads[i]:
                readers.setdefault(v, []).append(i)
    above = _ancestors(dg, len(g.nodes))
    target = graph_target(g)
    for a in sorted(reads):
        na = g.nodes[a]
        for b in sorted({b for v in reads[a] for b in readers[v] if b > a}):
            nb = g.nodes[b]
            if na.kwargs["ranges"] != nb.kwargs["ranges"]:
                continue
            if above[b] >> a & 1 or above[a] >> b & 1:  # a path between them
                continue
            if body_size(_body(m, na)) + body_size(_body(m, nb)) > max_nodes:
                continue
            if target_veto(m, g, na, nb, target) is not None:
                continue
            _merge(m, g, a, b, dg, taken)
            pos = {id(n): k for k, n in enumerate(g.nodes)}
            return min([pos[id(na)]] + [pos[id(v.node)] for v in na.operands()
                                        if v.node is not None and id(v.node) in pos])
    return None


def _ancestors(dg: nx.DiGraph, n: int) -> list[int]:
    """Bit j of entry i: node j has a path to node i (nodes 0..n-1)."""
    above = [0] * n
    for i in nx.topological_sort(dg):
        for p in dg.predecessors(i):
            above[i] |= above[p] | (1 << p)
    return above


def _merge(m: Module, g: Graph, a: int, b: int, dg: nx.DiGraph, taken: set[str]) -> None:
    """Kernels a and b as one multi-output kernel, placed where every producer precedes it and
    every reader follows it (a topological order of the contracted dependency graph)."""
    na, nb = g.nodes[a], g.nodes[b]
    for n in (na, nb):
        if n.op == "loop.reduction":
            _as_pointwise(m, n, taken)
    ba, bb_ = _body(m, na), _body(m, nb)
    rb = _Rebuild(m, _base(m, na), taken)
    bb = BodyBuilder(m, ba.name)
    va = rb.copy(ba, _outer(ba, na), bb, None)
    vb = rb.copy(bb_, _outer(bb_, nb), bb, None)
    _set_body(m, na, bb, [va[o] for o in ba.outputs] + [vb[o] for o in bb_.outputs])
    na.results = [*na.results, *nb.results]
    for r in na.results:
        r.node = na
    merged = nx.contracted_nodes(dg, a, b, self_loops=False)
    order = list(nx.lexicographical_topological_sort(merged))
    g.nodes = [g.nodes[i] for i in order]


def _reachable_bodies(m: Module, tops: list[Graph]) -> set[str]:
    seen: set[str] = set()
    stack = [a.name for g in tops for n in g.nodes for a in n.args if isinstance(a, Ref)]
    while stack:
        name = stack.pop()
        if name in seen or not isinstance(m.items.get(name), Graph):
            continue
        seen.add(name)
        body = m.items[name]
        assert isinstance(body, Graph)
        stack += [a.name for n in body.nodes for a in n.args if isinstance(a, Ref)]
    return seen


def _merge_duplicate_bodies(m: Module, tops: list[Graph]) -> None:
    """Point every `loop.reduce` at the first body of the same structure (fusion copies the
    body of a reduction into each reader)."""
    first: dict[tuple[object, ...], str] = {}
    alias: dict[str, str] = {}
    memo = SignMemo()  # nested bodies and shared expressions are signed once
    for name in sorted(_reachable_bodies(m, tops), key=_body_order):
        body = m.items[name]
        assert isinstance(body, Graph)
        alias[name] = first.setdefault(body_signature(m.items, body, memo), name)
    # only references from inside bodies: a top-level kernel keeps its own body (and name)
    for g in [g for g in m.graphs.values() if g.name in alias]:
        for n in g.nodes:
            n.args = [Ref(alias[a.name]) if isinstance(a, Ref) and a.name in alias else a
                      for a in n.args]


def _body_order(name: str) -> tuple[int, str]:
    tail = name.rsplit("_k", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (-1, name)


def explain_fusion(m: Module, max_nodes: int = 64) -> list[str]:
    """For every producer -> reader edge between kernels of a (fused) module: why it was not
    fused."""
    out: list[str] = []
    bodies = body_names(m)
    for g in m.graphs.values():
        if g.name in bodies:
            continue
        rd = _ReaderIndex(g)
        for p in g.nodes:
            if p.op not in KERNEL_OPS:
                continue
            for c in rd(p.results[0]):
                why = why_not_fused(m, g, p, c, max_nodes, rd)
                if why is not None:
                    names = ", ".join("%" + r.name for r in c.results)
                    out.append(f"@{g.name}: %{p.results[0].name} -> {names}: {why}")
    return out


@register_pass("fuse", "fuse loop kernels: pointwise chains, pointwise producers and reductions "
               "into their readers (softmax, layernorm as one kernel), horizontal multi-output "
               "kernels, cheap values read by several kernels recomputed in each (recompute=N "
               "nodes; default: the target's); explain=true prints why edges were not fused")
def fuse(module: Module, *, max_nodes: int = 64, reductions: bool = True,
         horizontal: bool = True, explain: bool = False, recompute: int = -1) -> Module:
    out = module.clone()
    bodies = body_names(out)
    taken: set[str] = set()
    tops = [g for g in out.graphs.values() if g.name not in bodies]
    for g in tops:
        start: int | None = 0
        target = graph_target(g)
        rc = recompute if recompute >= 0 else target.fusion.recompute if target else 0
        while start is not None:  # vertical to a fixpoint, then one horizontal merge, again
            _vertical(out, g, max_nodes, reductions, taken, start)
            # rule 5 only once rules 1, 2 and 4 are done: a max pool's padded input, read by
            # each window step, is inlined once their chain is one kernel, not into each step
            if rc and _vertical(out, g, max_nodes, reductions, taken, 0, rc):
                continue
            start = _horizontal(out, g, max_nodes, taken) if horizontal else None
    _merge_duplicate_bodies(out, tops)
    live = _reachable_bodies(out, tops)
    for name in [n for n in bodies | taken if n not in live and n in out.items]:
        del out.items[name]
    declare_domains(out)  # ir-v1.1: each body states the loops it now runs over
    if explain:
        for line in explain_fusion(out, max_nodes):
            print(f"fuse: {line}", file=sys.stderr)
    return out
