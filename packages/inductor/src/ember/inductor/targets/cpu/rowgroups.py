"""Short rows in groups: a kernel whose reductions are all per row over one short constant dim
(softmax over Swin's 7x7 windows, LayerNorm over a few channels) computes ROW_GROUP rows per
iteration, each pass's loop carrying every row of the group.

Per row, a short reduction is a chain of dependent steps: the lanes' accumulator through the
row's few vectors, the lanes combined one after another, the next pass waiting on that result
(softmax: max, then exp and sum, then the division). With one row per iteration the CPU waits on
those chains; with four rows in one loop body the chains run side by side. Softmax over rows of
49 ([192, 49, 49], the kernel alone, 1 thread): ~40% less time; rows of 197 about 7%.

The group's rows are the flattened outer loops (i0..i<k-1> recomputed from the row number in a
block of their own per row, shadowing the names the body's statements use, as do the row's
reduction results `red<j>`), so each row's statements are the ones `_nest` would write for it.
Rows past the last whole group run one by one after the groups. Values are those of one row at
a time: each row keeps its own accumulators, combined in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ember.inductor.sanitize import comment
from ember.inductor.targets.cpu.cpp import (
    ACC_INIT,
    _cname,
    _describe,
    _round,
    ctypes_of,
    dclass,
)
from ember.inductor.targets.cpu.cppkernel import (
    SHORT_ROW,
    _pragma,
    _Reduce,
    _simd_loops,
    _Writer,
    lanes,
)
from ember.ir.expr import Dim

ROW_GROUP = 4  # rows per iteration (2: 26% less on softmax over 49, 4: 40%, 8: as 4)


def row_group_nest(w: _Writer, ranges: Sequence[Dim], inner: list[str], n_par: int,
                   order: Sequence[int], vec: bool, cond: str = "") -> list[str] | None:
    """The kernel's loops with its rows in groups, or None where the kernel is not rows of one
    short constant reduced dim: every reduction per row (depth k = the outer loops, all of
    constant extent, at least ROW_GROUP rows), a SIMD kind over one constant dim of at most
    SHORT_ROW elements, no column plan; at most one pointwise loop inside (the row's
    elements)."""
    if w.col is not None or not w.reduces:
        return None
    k = max(r.k for r in w.reduces.values())
    if k == 0 or len(ranges) - k not in (0, 1) or list(order[k:]) != list(range(k, len(ranges))):
        return None
    outer = ranges[:k]
    if not all(isinstance(d, int) for d in outer):
        return None
    rows = math.prod(int(d) for d in outer)
    for r in w.reduces.values():
        if r.k != k or not r.simd or len(r.red) != 1 or not isinstance(r.red[0], int) \
                or not 0 < r.red[0] <= SHORT_ROW:
            return None
    if rows < ROW_GROUP:
        return None
    groups = rows // ROW_GROUP
    out = []
    if n_par:
        out.append(_pragma(1, cond=cond))
    out += [f"for (int64_t rg = 0; rg < {groups}; ++rg) {{",
            *["  " + s for s in _rows(w, ranges, k, inner, vec, f"rg * {ROW_GROUP}",
                                      ROW_GROUP)], "}"]
    if rows % ROW_GROUP:
        out += [f"for (int64_t rt = {groups * ROW_GROUP}; rt < {rows}; ++rt) {{",
                *["  " + s for s in _rows(w, ranges, k, inner, vec, "rt", 1)], "}"]
    return out


def _shadow(ranges: Sequence[Dim], k: int, row: str) -> str:
    """The outer loop variables i0..i<k-1> of flat row `row` (declared in the row's block)."""
    parts = []
    for d in range(k):
        inner = math.prod(int(x) for x in ranges[d + 1:k])
        v = f"({row}) / {inner}" if inner > 1 else f"({row})"
        parts.append(f"i{d} = {v} % {ranges[d]}" if d else f"i{d} = {v}")
    return f"const int64_t {', '.join(parts)}; (void)i0;"


def _rows(w: _Writer, ranges: Sequence[Dim], k: int, inner: list[str], vec: bool,
          base: str, n: int) -> list[str]:
    """Rows base .. base + n - 1: their reductions, pass by pass, then each row's elements."""
    rows = [f"{base} + {u}" if n > 1 else base for u in range(n)]
    done: list[_Reduce] = []  # the reductions computed so far (each row's block shadows them)

    def scope(u: int) -> list[str]:
        return [_shadow(ranges, k, rows[u]),
                *(f"const {ctypes_of(r.rdt)[1]} {r.var} = {r.var}_{u}; (void){r.var};"
                  for r in done)]
    out: list[str] = []
    for g in w.groups(k):
        out += _group(w, g, n, scope)
        done += g
    for u in range(n):
        body = _simd_loops(k, ranges, inner, False, None, vec) if k < len(ranges) else inner
        out += ["{", *["  " + s for s in [*scope(u), *body]], "}"]
    return out


def _group(w: _Writer, g: list[_Reduce], n: int,
           scope: Callable[[int], list[str]]) -> list[str]:
    """One pass of a group of independent reductions for n rows: per row and reduction the lane
    accumulators `simd_group` keeps for one row (its single block: a row <= SHORT_ROW), named
    with the row's suffix, all advanced in one `omp simd` loop."""
    inner = g[0].red[0]
    decl, init, lane, merge, final, clauses = [], [], [], [], [], []
    steps: list[list[str]] = [[] for _ in range(n)]
    for r in g:
        j = r.j
        ct = ctypes_of(r.elem)[1]
        v = _cname(r.body.outputs[0], f"n{j}_")
        decl.append(comment(f"{_describe(r.node)} @{r.body.name}: a reduction fused here"))
        for u in range(n):
            a, acc, red = f"a{j}_{u}", f"acc{j}_{u}", f"{r.var}_{u}"
            decl.append(f"{ctypes_of(r.rdt)[1]} {red};")
            if r.kind == "sum":
                acc_t = "double" if dclass(r.elem) == "f" else "int64_t"
                lane_t = ct if dclass(r.elem) == "f" else "int64_t"
                init.append(f"{acc_t} {acc} = 0;")
                lane.append(f"{lane_t} {a} = 0;")
                clauses.append(f"reduction(+:{a})")
                steps[u] += [f"{a} += {v};", *r.stores]
                merge.append(f"{acc} += {a};")
                final.append(f"{red} = {_round(r.rdt, f'({ct}){acc}')};")
                continue
            op, cmp = ("max", ">") if r.kind == "amax" else ("min", "<")
            start = ACC_INIT[r.kind][dclass(r.elem)].format(S=ct)
            init.append(f"{ct} {acc} = {start};")
            lane.append(f"{ct} {a} = {start};")
            clauses.append(f"reduction({op}:{a})")
            steps[u] += [f"{a} = {a} {cmp} {v} ? {a} : {v};", *r.stores]
            merge.append(f"{acc} = {acc} {cmp} {a} ? {acc} : {a};")
            if dclass(r.elem) == "f":
                init.append(f"int nan{j}_{u} = 0;")
                clauses.append(f"reduction(|:nan{j}_{u})")
                steps[u].append(f"nan{j}_{u} |= ({v} != {v});")
                final.append(f"{red} = {_round(r.rdt, f'nan{j}_{u} ? ({ct})NAN : {acc}')};")
            else:
                final.append(f"{red} = {acc};")
    stmts = [s for r in g for s in w.statements(r, r.j)]
    clauses += lanes(g, True)
    body = []
    for u in range(n):
        body += ["{", *["  " + s for s in [*scope(u), *stmts, *steps[u]]], "}"]
    vec = [f"#pragma omp simd {' '.join(clauses)}",
           f"for (int64_t r0 = 0; r0 < {inner}; ++r0) {{", *["  " + s for s in body], "}"]
    return [*decl, "{", *["  " + s for s in [*init, *lane, *vec, *merge, *final]], "}"]
