"""Loops split where a kernel's indices divide them (how `codegen-cpp` renders a pointwise
kernel whose loads read through a reshape of a permuted buffer).

A kernel over [256, 768] that reads a [4, 4, 64, 64] buffer (a training backward's head merge:
the gradients of q, k, v, one head at a time, written as rows of the qkv projection's
gradient) loads at `[i0 // 64, mod(i1 // 64, 4), mod(i0, 64), mod(i1, 64)]`: integer divisions
in every load, and no `omp simd` loop g++ vectorises. Rendered over [4, 64, 3, 4, 64] instead
(i0 = 64*a + b, i1 = 256*c + 64*d + e), every index is affine (`[a, d, b, e]`), and the
concatenation's `i1 // 256 >= 2` is a test of an outer loop's variable. The elements are the
same and visited in the same order (row-major over the split dims is row-major over the
original ones), so the stores' flat offsets, and the results, are unchanged; the schedule's
decisions, made per original dim, apply to each dim's loops as a group (OpenMP collapses the
sub-loops of its dims, the innermost sub-loop of the vector dim is the `omp simd` one).

Only pointwise kernels without fused reductions and with static extents are split, and only
where it removes divisions: a dim is cut at the step `d / gcd(c, d)` of a `(c*i + ...) // d`
or `mod(c*i + ..., d)` that divides its extent (the innermost dim keeps at least MIN_INNER
iterations, a vector's worth), smallest step first, until no such step is left.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from ember.inductor.indexing import ivar, parse_index, simplify_index, substitute
from ember.inductor.schedule import Schedule
from ember.ir import Graph, Node, Value
from ember.ir.expr import Dim, FloorDiv, PyMod, as_sympy, symbol, value_range
from ember.ir.graph import map_args

MIN_INNER = 16  # iterations the innermost loop keeps (whole vectors of f32 on AVX-512)
MAX_LOOPS = 8  # loops a split kernel may have
# consecutive loop nests a kernel is cut into at its outer loops' break points: 9, a padded
# window's top, middle and bottom rows by its left, middle and right columns (a 3x3 max pool
# cut in 3 by its columns only kept the rows' edge tests in its middle loop, which g++ did
# not vectorise: a select on a loop-invariant bool)
MAX_NESTS = 9
MAX_INNER = 12  # consecutive innermost loops a nest is cut into at that loop's break points
MAX_DEPTH = 4  # clamps inside clamps followed


def _divisions(e: Dim) -> list[sympy.Expr]:
    if isinstance(e, int):
        return []
    return [s for s in sympy.preorder_traversal(e) if isinstance(s, (FloorDiv, PyMod))
            and s.args[1].is_Integer and int(s.args[1]) > 1]


def _indices(body: Graph) -> list[Dim] | None:
    """Every index expression of the body's loads and loop.index nodes, in order; None if
    the body computes something else over its loops (a fused reduction)."""
    out: list[Dim] = []
    for n in body.nodes:
        if n.op == "loop.load":
            out += [parse_index(s) for s in n.kwargs["index"]]  # type: ignore[union-attr]
        elif n.op == "loop.index":
            out.append(parse_index(n.kwargs["index"]))
        elif n.op.startswith("loop."):
            return None
    return out


def _step(div: sympy.Expr, v: sympy.Symbol, extent: int, inner: bool) -> int | None:
    """The step at which `v` must be cut for `div` (a // or mod by a constant) to become a
    division-free expression of the cut's two variables, where it divides `extent`."""
    a, d = div.args[0], int(div.args[1])
    c = sympy.expand(a).coeff(v)
    if not c.is_Integer or int(c) == 0:
        return None
    step = d // math.gcd(int(c), d)
    if not 1 < step < extent or extent % step or (inner and step < MIN_INNER):
        return None
    return step


def split_plan(body: Graph, ranges: Sequence[Dim]) -> tuple[list[list[int]], list[Dim]] | None:
    """Per original dim the extents of its loops, outermost first, and the body's indices over
    the new loop variables (in `_indices`' order); None where splitting removes no division."""
    exprs = _indices(body)
    if exprs is None or len(ranges) < 2 or not all(isinstance(r, int) for r in ranges):
        return None
    before = sum(len(_divisions(e)) for e in exprs)
    if before == 0:
        return None
    # the loops so far: (variable, extent, original dim); fresh names, renamed at the end
    loops: list[tuple[sympy.Symbol, int, int]] = []
    subst: dict[sympy.Symbol, Dim] = {}
    for k, r in enumerate(ranges):
        t = symbol(f"split_t{k}")
        loops.append((t, int(r), k))
        subst[ivar(k)] = t
    exprs = [substitute(e, subst) for e in exprs]
    fresh = len(ranges)
    while len(loops) < MAX_LOOPS:
        best: tuple[int, int] | None = None  # (step, loop position)
        for e in exprs:
            for div in _divisions(e):
                for pos, (v, n, _) in enumerate(loops):
                    if v not in div.args[0].free_symbols:
                        continue
                    s = _step(div, v, n, pos == len(loops) - 1)
                    if s is not None and (best is None or (s, pos) < best):
                        best = (s, pos)
        if best is None:
            break
        step, pos = best
        v, n, k = loops[pos]
        q, r = symbol(f"split_t{fresh}"), symbol(f"split_t{fresh + 1}")
        fresh += 2
        loops[pos:pos + 1] = [(q, n // step, k), (r, step, k)]
        rng = {x: m for x, m, _ in loops}
        exprs = [simplify_index(substitute(e, {v: step * q + r}), rng) for e in exprs]
    if sum(len(_divisions(e)) for e in exprs) >= before:
        return None
    names = {v: ivar(j) for j, (v, _, _) in enumerate(loops)}
    exprs = [substitute(e, names) for e in exprs]
    extents: list[list[int]] = [[] for _ in ranges]
    for _, n, k in loops:
        extents[k].append(n)
    return extents, exprs


@dataclass
class Piece:
    """One loop nest of a split kernel: the extents of its loops and the offset at which each
    outer one starts in the kernel's loops; its innermost loop is `inner`'s consecutive loops,
    each (start, extent, body) with the body's indices over loop variables counting from 0."""
    ranges: list[int]
    start: list[int]
    inner: list[tuple[int, int, Graph]]


def _linear(e: Dim, v: sympy.Symbol) -> tuple[int, int] | None:
    """(a, k) where e is `a*v + k` (integers, a > 0: a strided window's `2*i + 1`), else
    None."""
    if isinstance(e, int):
        return None
    x = sympy.expand(e)
    a = x.coeff(v, 1)
    k = sympy.expand(x - a * v)
    if not (a.is_Integer and k.is_Integer and int(a) > 0):
        return None
    return int(a), int(k)


def _first(a: int, k: int, c: int) -> int:
    """The least v with `a*v + k >= c`."""
    return -((k - c) // a)


def _clamps(e: Dim, v: sympy.Symbol, out: set[int]) -> None:
    """The points where a max/min of a constant and `v + k` in `e` changes sides (max:
    `v + k` wins from v = c - k; min: it wins up to there)."""
    if isinstance(e, int):
        return
    for mm in sympy.preorder_traversal(e):
        if not isinstance(mm, (sympy.Max, sympy.Min)) or len(mm.args) != 2:
            continue
        c, e = sorted(mm.args, key=lambda x: not x.is_Integer)
        ak = _linear(e, v) if c.is_Integer else None
        if ak is not None:  # max: `a*v + k` wins from a*v + k >= c; min: while it is <= c
            out.add(_first(*ak, int(c) + isinstance(mm, sympy.Min)))


# a comparison `a*v + k <op> c` changes where a*v + k reaches c + d, for each d listed
# (eq/ne: only for a = 1, where it holds at one point)
_CMP = {"prims.ge": (0,), "prims.lt": (0,), "prims.gt": (1,), "prims.le": (1,),
        "prims.eq": (0, 1), "prims.ne": (0, 1)}


def _breaks(body: Graph, v: sympy.Symbol) -> set[int]:
    """The points where a comparison of loop variable `v` with a constant, or a max/min clamp
    of an index by one, changes its outcome: concatenation and padding read through `where`s
    on `i >= c` and loads at `max(0, i - c)`, a strided window's on `2*i + 2 < c` and
    `min(c - 1, 2*i + 2)`; on each side of such a point both are known."""
    out: set[int] = set()
    made = {r: n for n in body.nodes for r in n.results}
    for n in body.nodes:
        if n.op == "loop.load":
            for x in n.kwargs["index"]:  # type: ignore[union-attr]
                _clamps(parse_index(x), v, out)
        elif n.op == "loop.index":
            _clamps(parse_index(n.kwargs["index"]), v, out)
        elif n.op in _CMP and len(n.args) == 2:
            x, c = n.args
            src = made.get(x) if isinstance(x, Value) else None
            if src is None or src.op != "loop.index" or isinstance(c, bool) \
                    or not isinstance(c, int):
                continue
            ak = _linear(parse_index(src.kwargs["index"]), v)
            if ak is not None and (ak[0] == 1 or n.op not in ("prims.eq", "prims.ne")):
                out.update(_first(*ak, c + d) for d in _CMP[n.op])
    return out


def _shifted(body: Graph, start: Sequence[int], ext: Sequence[int]) -> Graph:
    """The body over loops starting at `start` (each variable counting from 0 again), its
    indices simplified over the extents `ext`: a clamp or a comparison that is decided there
    folds away."""
    shift = {ivar(j): ivar(j) + a for j, a in enumerate(start) if a}
    rng = {ivar(j): n for j, n in enumerate(ext)}
    out = body.clone()
    for n in out.nodes:
        if n.op == "loop.load":
            n.kwargs = {**n.kwargs, "index": [
                simplify_index(substitute(parse_index(x), shift), rng)
                for x in n.kwargs["index"]]}  # type: ignore[union-attr]
        elif n.op == "loop.index":
            n.kwargs = {**n.kwargs, "index": simplify_index(substitute(
                parse_index(n.kwargs["index"]), shift), rng)}
    out.domain = {f"i{j}": n for j, n in enumerate(ext)}
    _fold_decided(out, ext)
    return out


_DECIDE = {"prims.lt": operator.lt, "prims.le": operator.le, "prims.gt": operator.gt,
           "prims.ge": operator.ge}


def _fold_decided(body: Graph, ext: Sequence[int]) -> None:
    """Drop what the loops' extents decide: a comparison of a loop index with a constant that
    holds (or fails) over the whole range, each `where` selecting by one (its result is the
    operand it picks), then the nodes no longer read. A piece of a concatenation then reads
    its own input only; otherwise every piece carries every input's load and select (a
    DenseNet concatenation of k inputs, cut into k pieces: k * k loads for g++ to drop)."""
    env = {f"i{j}": (0, n - 1) for j, n in enumerate(ext) if n > 0}
    made = {r: n for n in body.nodes for r in n.results}
    decided: dict[Value, bool] = {}
    alias: dict[Value, Value] = {}
    for n in body.nodes:
        n.args = [map_args(a, lambda v: alias.get(v, v)) for a in n.args]
        if n.op in _DECIDE and len(n.args) == 2 and len(n.results) == 1:
            x, c = n.args
            src = made.get(x) if isinstance(x, Value) else None
            if src is None or src.op != "loop.index" or isinstance(c, bool) \
                    or not isinstance(c, int):
                continue
            r = value_range(as_sympy(parse_index(src.kwargs["index"])), env)
            if r is None or math.isinf(r[0]) or math.isinf(r[1]):
                continue
            lo, hi = _DECIDE[n.op](r[0], c), _DECIDE[n.op](r[1], c)
            if lo == hi:  # (the four are monotonic: both ends agree, so does every point)
                decided[n.results[0]] = lo
        elif n.op == "prims.where" and len(n.args) == 3 and n.args[0] in decided:
            pick = n.args[1] if decided[n.args[0]] else n.args[2]
            if isinstance(pick, Value) and pick.type == n.results[0].type:
                alias[n.results[0]] = pick
    if not alias:
        return
    body.outputs = [alias.get(v, v) for v in body.outputs]
    live = set(body.outputs)
    kept: list[Node] = []
    for n in reversed(body.nodes):  # (pure nodes only: split_kernel takes no other body)
        if any(r in live for r in n.results):
            kept.append(n)
            live.update(n.operands())
    body.nodes = kept[::-1]


def _cut(body: Graph, j: int, start: list[int], ext: list[int], depth: int = 0,
         room: int = MAX_INNER) -> list[tuple[int, int, Graph]] | None:
    """Loop j's range [start[j], start[j] + ext[j]) as consecutive pieces, cut at its break
    points, and again inside each piece (a clamp inside a clamp: a concatenation inside one);
    each with its shifted body. None where that is more than `room` pieces: found before the
    pieces' bodies are made (a DenseNet concatenation of 25 inputs would shift and simplify
    the whole body once per input, only for the caller to drop them all)."""
    here = _shifted(body, start, ext)
    pts = sorted(p for p in _breaks(here, ivar(j)) if 0 < p < ext[j])
    if not pts or depth >= MAX_DEPTH:
        return [(start[j], ext[j], here)]
    if len(pts) + 1 > room:
        return None  # (each piece is one loop at least)
    out: list[tuple[int, int, Graph]] = []
    bounds = list(zip([0, *pts], [*pts, ext[j]], strict=True))
    for k, (a, b) in enumerate(bounds):
        sub_start, sub_ext = list(start), list(ext)
        sub_start[j], sub_ext[j] = start[j] + a, b - a
        # what this piece may take: the room less the pieces made and one for each to come
        sub = _cut(body, j, sub_start, sub_ext, depth + 1, room - len(out) - (len(bounds) - k - 1))
        if sub is None:
            return None
        out += sub
    return out


def _pieces(body: Graph, ranges: Sequence[int]) -> list[Piece] | None:
    """The kernel as consecutive loop nests, cut where its outer loops have break points (at
    most MAX_NESTS nests), the innermost loop of each as consecutive loops cut at its own (at
    most MAX_INNER); None where no loop has one."""
    last = len(ranges) - 1
    whole = [int(n) for n in ranges]
    cuts: list[list[int]] = [[0, n] for n in whole]
    count = 1
    brk = {j: _breaks(body, ivar(j)) for j in range(last)}
    for j in reversed(range(last)):
        pts = sorted(p for p in brk[j] if 0 < p < whole[j])
        if pts and count * (len(pts) + 1) <= MAX_NESTS:
            cuts[j] = [0, *pts, whole[j]]
            count *= len(pts) + 1
    out: list[Piece] = []
    for combo in itertools.product(*[list(zip(c[:-1], c[1:], strict=True))
                                     for c in cuts[:last]]):
        start = [a for a, _ in combo] + [0]
        ext = [b - a for a, b in combo] + [whole[last]]
        cut = _cut(body, last, start, ext)
        inner = cut if cut is not None else [(0, whole[last], _shifted(body, start, ext))]
        out.append(Piece(ext, start, inner))
    if count == 1 and len(out[0].inner) == 1:
        return None
    return out


def split_kernel(body: Graph, ranges: Sequence[Dim], s: Schedule
                 ) -> tuple[list[Piece], list[Dim], Schedule] | None:
    """The loop nests, loop extents and schedule of the kernel rendered over split loops (see
    the module docstring); None where it is rendered as it is."""
    if _indices(body) is None or len(ranges) < 2 or not all(isinstance(r, int) for r in ranges) \
            or list(s.order) != sorted(s.order):
        return None
    plan = split_plan(body, ranges)
    if plan is None:
        extents: list[list[int]] = [[int(r)] for r in ranges]
        out, order, parallel, vector = body, list(s.order), list(s.parallel), list(s.vector)
    else:
        extents, exprs = plan
        # the first new loop of each original dim
        first = [sum(len(x) for x in extents[:d]) for d in range(len(extents))]

        def loops_of(d: int) -> list[int]:
            return list(range(first[d], first[d] + len(extents[d])))
        order = [j for d in s.order for j in loops_of(d)]
        parallel = order[:sum(len(extents[d]) for d in s.parallel)]
        vector = order[-1:] if s.vector else []
        out = body.clone()
        it = iter(exprs)
        for n in out.nodes:
            if n.op == "loop.load":
                n.kwargs = {**n.kwargs, "index": [
                    next(it) for _ in n.kwargs["index"]]}  # type: ignore[union-attr]
            elif n.op == "loop.index":
                n.kwargs = {**n.kwargs, "index": next(it)}
    flat = [n for ext in extents for n in ext]
    out.domain = {f"i{j}": n for j, n in enumerate(flat)}
    pieces = _pieces(out, flat)
    if pieces is None:
        if plan is None:
            return None
        pieces = [Piece(list(flat), [0] * len(flat), [(0, int(flat[-1]), out)])]
    return pieces, list(flat), Schedule(tuple(order), tuple(parallel), tuple(vector), s.plan,
                                        s.blocks, s.threshold)


__all__ = ["MAX_INNER", "MAX_NESTS", "MIN_INNER", "Piece", "split_kernel", "split_plan"]
