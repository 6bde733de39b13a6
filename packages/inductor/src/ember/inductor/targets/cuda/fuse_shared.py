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
    _body,
    _merge_duplicate_bodies,
    _reachable_bodies,
    _ReaderIndex,
    _reduce_depth,
    fuse_keeping,
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


@register_pass("fuse-shared", "CUDA, after fuse: a pointwise kernel read by several kernels "
               "(a residual add) is computed by its first reader over the same domain (the "
               "next layernorm), which writes it as one more result; explain=true says why "
               "the others are left")
def fuse_shared(module: Module, *, max_nodes: int = 64, explain: bool = False) -> Module:
    out = module.clone()
    bodies = body_names(out)
    taken: set[str] = set()
    tops = [g for g in out.graphs.values() if g.name not in bodies]
    for g in tops:
        _share(out, g, max_nodes, taken, explain)
    _merge_duplicate_bodies(out, tops)
    live = _reachable_bodies(out, tops)
    for name in [n for n in bodies | taken if n not in live and n in out.items]:
        del out.items[name]
    declare_domains(out)
    return out


__all__ = ["fuse_shared", "why_not_shared"]
