"""`fuse-shared` (CUDA, after `fuse`): a pointwise kernel read by several kernels is computed by
the first of them, which writes it as one more output.

`fuse` inlines a pointwise kernel only into its one reader (rule 1) or, for a graph output,
into its one reader over the same domain (rule 4): a kernel read by several stays a kernel of
its own. The residual add of a transformer block is such a kernel: the next layernorm and the
next residual add read it. TorchInductor computes it in the layernorm's kernel, which writes it
for the later reader; so does this pass: a single-output `loop.pointwise` kernel with no
reductions, read by two or more kernels, the first of which (in graph order) runs over the
same `ranges`, is inlined into that first reader (fusion.py's `fuse_keeping`, rule 4's rewrite:
the reader computes the value once at its own index, reads it elsewhere, e.g. in its row
reductions, by recomputing it, and returns it as one more result); the later readers read that
result. One launch and one read-back of the value fewer per such kernel (two per transformer
block: each residual add into the layernorm after it).

Then (`independent=true`, the default) pointwise kernels without reductions over the same
`ranges`, neither reading the other's results (directly or not), become one multi-output
kernel even without a common input (fuse's horizontal rule 3 needs one): the bias adds of
separate q, k and v projections are one launch, not three.

The first reader must be a loop kernel over the same domain and the fused body must stay
within `max_nodes`; the target's veto applies as in `fuse`. `fuse-shared{explain=true}` prints,
for each multi-reader pointwise kernel left, why (stderr). With the pass in the CUDA pipeline
(`inductor-cuda`), a dump after it shows the layernorm kernel with the residual as its second
result.
"""

from __future__ import annotations

import sys

from ember.inductor.body import body_names, body_size, declare_domains
from ember.inductor.fusion import (
    KERNEL_OPS,
    _ancestors,
    _body,
    _merge,
    _merge_duplicate_bodies,
    _reachable_bodies,
    _ReaderIndex,
    _reduce_depth,
    dependency_graph,
    fuse_keeping,
    graph_target,
    target_veto,
)
from ember.ir import Graph, Module, Node
from ember.ir.passes import register_pass


def why_not_shared(m: Module, g: Graph, p: Node, readers: list[Node], max_nodes: int,
                   rd: _ReaderIndex) -> str | None:
    """None if the pointwise kernel p may be computed by its first reader for all of
    `readers` (graph order), else why not."""
    if p.op != "loop.pointwise" or len(p.results) != 1:
        return "only single-output pointwise kernels are shared"
    if len(readers) < 2:
        return "it has fewer than two readers (fuse's rules 1 and 4 decide)"
    pbody = _body(m, p)
    if _reduce_depth(m, pbody):
        return "its body holds reductions (recomputing them in the reader's rows costs more)"
    first = readers[0]
    if first.op not in KERNEL_OPS:
        return f"its first reader is {first.op}, not a loop kernel"
    if first.kwargs.get("ranges") != p.kwargs.get("ranges"):
        return (f"its first reader runs over {first.kwargs.get('ranges')}, not its own "
                f"{p.kwargs.get('ranges')}")
    size = body_size(pbody) + body_size(_body(m, first))
    if size > max_nodes:
        return f"the fused body would have {size} nodes > max_nodes={max_nodes}"
    return target_veto(m, g, p, first, rd.target)


def _share(m: Module, g: Graph, max_nodes: int, taken: set[str], explain: bool) -> int:
    done = 0
    rd = _ReaderIndex(g)
    for p in list(g.nodes):
        if p.op != "loop.pointwise" or len(p.results) != 1:
            continue
        readers = rd(p.results[0])
        if len(readers) < 2:
            continue
        why = why_not_shared(m, g, p, readers, max_nodes, rd)
        if why is not None:
            if explain:
                print(f"fuse-shared: @{g.name} %{p.results[0].name}: {why}", file=sys.stderr)
            continue
        first = readers[0]
        rd.drop(p)
        rd.drop(first)
        fuse_keeping(m, p, first, taken)
        g.nodes.remove(p)
        rd.add(first)  # keeps its place: every later reader still follows it
        done += 1
    return done


def _merge_independent(m: Module, g: Graph, max_nodes: int, taken: set[str]) -> bool:
    """Merge the first pair of pointwise kernels without reductions over the same ranges,
    neither depending on the other (with or without a common input: fuse's rule 3 needs one),
    into one multi-output kernel (fusion.py's `_merge`). True if one was merged."""
    dg = dependency_graph(g)
    above = _ancestors(dg, len(g.nodes))
    target = graph_target(g)
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(g.nodes):
        if n.op == "loop.pointwise" and not _reduce_depth(m, _body(m, n)):
            groups.setdefault(str(n.kwargs.get("ranges")), []).append(i)
    for idx in groups.values():
        for j, a in enumerate(idx):
            for b in idx[j + 1:]:
                if above[b] >> a & 1 or above[a] >> b & 1:  # a path between them
                    continue
                na, nb = g.nodes[a], g.nodes[b]
                if body_size(_body(m, na)) + body_size(_body(m, nb)) > max_nodes:
                    continue
                if target_veto(m, g, na, nb, target) is not None:
                    continue
                _merge(m, g, a, b, dg, taken)
                return True
    return False


@register_pass("fuse-shared", "CUDA, after fuse: a pointwise kernel read by several kernels "
               "(a residual add) is computed by its first reader over the same domain (the "
               "next layernorm), which writes it as one more result; independent=true (the "
               "default) merges independent pointwise kernels over the same domain (q, k, v "
               "bias adds); explain=true says why the others are left")
def fuse_shared(module: Module, *, max_nodes: int = 64, explain: bool = False,
                independent: bool = True) -> Module:
    out = module.clone()
    bodies = body_names(out)
    taken: set[str] = set()
    tops = [g for g in out.graphs.values() if g.name not in bodies]
    for g in tops:
        _share(out, g, max_nodes, taken, explain)
        while independent and _merge_independent(out, g, max_nodes, taken):
            pass
    _merge_duplicate_bodies(out, tops)
    live = _reachable_bodies(out, tops)
    for name in [n for n in bodies | taken if n not in live and n in out.items]:
        del out.items[name]
    declare_domains(out)
    return out


__all__ = ["fuse_shared", "why_not_shared"]
