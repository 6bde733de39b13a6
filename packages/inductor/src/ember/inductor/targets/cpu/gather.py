"""The CPU target's fusion veto: a value gathered through index arithmetic is written once when
its reader would evaluate each of its elements several times.

A pointwise producer whose loads index through `//` and `mod` by constants (a window
partition's view of an image: Swin's shifted-window attention mask, built from a [56, 56]
region map read at `[i0 // 8 * 7 + i2 // 7, mod(i0, 8) * 7 + mod(i2, 7)]`), or that
concatenates pieces (two or more loads clamped into their pieces' ranges: Swin's patch
merging of four strided slices), is cheap to compute once but costly to inline where each of
its elements is evaluated again and again: integer divisions by constants in an `omp simd`
loop do not vectorise (AVX-512 has no 64-bit multiply-high), a concatenation evaluates every
piece's loads and selects between them, and a fused reduction recomputes its operand in each
pass. Swin's mask, inlined into the softmax that reads it, was evaluated 18 times per element
(3 heads x 3 passes x 2 windows of the batch): those kernels ran 3-8x slower than the same
softmax without the mask; the patch merging's concatenation inlined into its LayerNorm was
evaluated in all three passes (9 ns per element, against ~1 for the kernels around it).

The veto keeps such a producer a kernel of its own (its own loops are split where its indices
divide them, splitloops.py) when the reader evaluates it at least `REPEATS` times per element
(the loads of it in the reader's bodies, its top body and its fused reductions' bodies, each
a pass, each weighted by the iterations of its body's domain, over the producer's element
count), and either some of those loads sit in a reduction (a reduction reader, a fused
reduction's pass) or the reader broadcasts it (loop variables of the reader that its loads'
indices do not depend on cover `REPEATS` or more iterations: Swin's mask added to every head's
scores, before the softmax fuses that sum). A pointwise reader that reads each element once
still fuses it, however many loads its concatenations evaluate (a rotary embedding's rotated
half stacked with k and v): `codegen-cpp` splits a pointwise kernel's loops where its indices
divide them and cuts them at a concatenation's break points, which it does not do for a
reduction's passes.
"""

from __future__ import annotations

import math

import sympy

from ember.inductor.indexing import ivar, parse_index
from ember.inductor.targets.cpu.veto import bound, loop_body, numel, pointwise_pair
from ember.ir import Graph, Module, Node, Value
from ember.ir.expr import FloorDiv, PyMod

# the reader evaluates each of the producer's elements at least this many times
REPEATS = 2


def _gathers(body: Graph, inner: sympy.Symbol) -> str | None:
    """What makes the body's loads costly to repeat along its innermost loop variable
    `inner`: integer division of it in an index, or a concatenation along it (two or more
    loads clamped into their pieces' ranges); None if neither. Divisions of outer variables
    (a batch index `mod(i0, 64)`) are hoisted out of the inner loop by the C++ compiler."""
    clamped = 0
    for n in body.nodes:
        if n.op != "loop.load":
            continue
        raw = n.kwargs.get("index")
        for e in raw if isinstance(raw, list) else []:
            x = parse_index(e)
            if not isinstance(x, sympy.Expr):
                continue
            if any(inner in d.free_symbols for d in x.atoms(FloorDiv, PyMod)):
                return "integer division in its index"
            if any(inner in c.free_symbols for c in x.atoms(sympy.Min, sympy.Max)):
                clamped += 1
                break
    return "a concatenation" if clamped >= 2 else None


def _evaluations(m: Module, body: Graph, domain: int, mine: set[Value], reducing: bool
                 ) -> tuple[int, bool] | None:
    """Iterations, over `body` (whose domain has `domain` iterations; `reducing`: it is a
    reduction's) and the bodies of the reductions it holds, of the loads of `mine`, and
    whether any of them sits in a reduction; None where a domain is symbolic."""
    total, in_reduction = 0, False
    for n in body.nodes:
        if n.op == "loop.load" and n.args and n.args[0] in mine:
            total += domain
            in_reduction |= reducing
        elif n.op == "loop.reduce":
            sub = loop_body(m, n)
            smine = set() if sub is None else bound(sub, n.args[1:], mine)
            if sub is None or not smine:
                continue
            ranges, reduce = n.kwargs.get("ranges"), n.kwargs.get("reduce_ranges")
            sub_domain = numel([*ranges, *reduce]) if isinstance(ranges, list) \
                and isinstance(reduce, list) else None
            got = None if sub_domain is None else _evaluations(m, sub, sub_domain, smine, True)
            if got is None:
                return None
            total += got[0]
            in_reduction |= got[1]
    return total, in_reduction


def _spread(body: Graph, ranges: list[object], mine: set[Value]) -> int:
    """How many of the reader's elements read each element of `mine` through its top-level
    loads: the extents of the loop variables neither those loads' indices nor a `loop.index`
    (a concatenation's choice of piece, a mask's comparison) depend on."""
    used: set[sympy.Symbol] = set()
    for n in body.nodes:
        if (n.op == "loop.load" and n.args and n.args[0] in mine) or n.op == "loop.index":
            raw = n.kwargs.get("index")
            for e in raw if isinstance(raw, list) else [raw]:
                x = parse_index(e)
                if isinstance(x, sympy.Expr):
                    used |= x.free_symbols
    return math.prod(d for k, d in enumerate(ranges)
                     if isinstance(d, int) and ivar(k) not in used)


def gather_veto(m: Module, g: Graph, producer: Node, consumer: Node) -> str | None:
    """Why `producer` stays a kernel of its own rather than fusing into `consumer`, or None."""
    pair = pointwise_pair(m, producer, consumer)
    if pair is None:
        return None
    pbody, cbody = pair
    pranges = producer.kwargs.get("ranges")
    pn = numel(pranges)
    if not pn or not isinstance(pranges, list):
        return None
    what = _gathers(pbody, ivar(len(pranges) - 1))
    ranges = consumer.kwargs.get("ranges")
    reduce = consumer.kwargs.get("reduce_ranges", [])
    if what is None or not isinstance(ranges, list) or not isinstance(reduce, list):
        return None
    cn = numel([*ranges, *reduce])
    if cn is None:
        return None
    r = producer.results[0]
    mine = bound(cbody, consumer.args[1:], {r})
    got = _evaluations(m, cbody, cn, mine, consumer.op == "loop.reduction")
    # a pointwise reader's loops are split where the indices divide them and cut at a
    # concatenation's break points (splitloops.py), a reduction's passes are not: a reader
    # without reductions vetoes only as a broadcast
    if got is None or got[0] < REPEATS * pn \
            or not (got[1] or _spread(cbody, ranges, mine) >= REPEATS):
        return None
    evaluations = got[0]
    return (f"%{r.name} ({what}) would be evaluated {evaluations / pn:.3g} times per element "
            f"by the reader")


__all__ = ["REPEATS", "gather_veto"]
