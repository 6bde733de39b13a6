"""The loop structure of one C++ kernel: OpenMP across the outer loops, `omp simd` inner loops,
reductions computed once per outer index with vectorisable accumulators.

A kernel is a `loop.pointwise` node (its body may return several values: a multi-output kernel)
or a `loop.reduction` node. Every `loop.reduce` reachable from the body (also inside the bodies of
other reductions: softmax's sum reads its max) is collected once, keyed by its body and buffers,
and computed at depth k = len(its ranges) of the outer loops, before what reads it:

    #pragma omp parallel for                 (the outer loops, when the work is large)
    for i0:                                  (depth 0 .. k-1)
      red0 = amax over r of x[i0, r]         (the reductions of depth k, in dependency order;
      red1 = sum over r of exp(x - red0)      independent ones over the same domain share a loop)
      #pragma omp simd
      for i1: out0[i0, i1] = exp(x - red0) / red1

Float sums and max/min accumulate per SIMD lane (`omp simd reduction`) in blocks of `BLOCK`
elements whose partial sums are added in double: vectorised, and as accurate as eager's cascade
sum. max/min propagate NaN through a separate flag. prod, argmax and argmin keep one scalar
accumulator (double for float prod). Three loop orders beyond that one (see docs/inductor.md):
- **outer reductions** (the reduced dims are outer in memory, `x.sum(0)`): rows in the outer
  loop, the kept innermost dim vectorised with an array of accumulators per block of columns,
  OpenMP over the blocks (`_Col`);
- **split reductions** (depth 0: a full reduction to a scalar): per-thread partials over a
  static partition of the outermost reduced loop, combined in thread order (deterministic for a
  thread count);
- **rescale** (softmax's `e / sum(e)`): the sum's pass stores each `e` in the output, and the
  output pass reads the quotient as `out * (1 / sum)` (eager's order: `e` is computed once, no
  division per element).
Outputs of HUGE_OUTPUT bytes or more are asked to be backed by 2 MB pages before they are first
written (`ember_hugepages`): fewer page faults on a fresh buffer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import sympy

from ember.inductor.body import SignMemo, body_signature
from ember.inductor.indexing import flat_offset, parse_index, rvar
from ember.inductor.sanitize import comment
from ember.inductor.targets.cpu.broadcast import COSTLY
from ember.inductor.targets.cpu.cpp import (
    ACC_INIT,
    COMBINE,
    CodegenError,
    _cname,
    _describe,
    _int,
    _round,
    _tensor,
    body_statements,
    bound,
    cexpr,
    ctypes_of,
    dclass,
)
from ember.ir import DType, Graph, Node, Ref, Symbol, Value
from ember.ir.expr import Dim, ExprEvalError, evaluate, simplify_dim
from ember.prims import PRIMS

BLOCK = 4096  # elements per vectorised partial sum (then added in double)
# rows of at most this many elements (a constant extent) reduce in 8 lanes (`simdlen(8)`): g++
# adds an `omp simd` reduction's lanes after the loop one after another, a dependent chain of 16
# adds for f32 at AVX-512's width that costs more than the short row's loop itself. LayerNorm
# kernel over 24 channels x 8192 rows, 1 thread: 153 -> 81 us; longer rows lose the wider loop
# (384: 36 -> 40 us), so they keep g++'s width, as do rows whose body calls a math function
# (broadcast.COSTLY: softmax's exp over 197: 413 -> 559 us in 8 lanes)
SHORT_ROW = 256
SHORT_ROW_LANES = 8
# a pass calling a math function (softmax's sum of exp) in 64 bytes of lanes: g++ keeps 32 where
# -march=native prefers 256-bit vectors (Intel's AVX-512 parts), and the exp is the pass's
# cost. Softmax at 1 thread, kernel alone (Xeon, AVX-512): rows of 1024 1417 -> 1127 us, 197
# 582 -> 527, 49 in row groups 724 -> 636; AVX2 code: the same (two vectors per step)
COSTLY_LANES = {"float": 16, "double": 8}
PARALLEL_WORK = 32768  # element-steps below which a kernel stays on one thread
# Reductions given SIMD lane accumulators: a CPU target fact, keyed from the prims' declared
# reduction trait: only an "associative" combine may run per lane and combine the lanes after
# (argmax/argmin are "positional"). prod is associative but left out: this target keeps a
# float product in one double scalar (docs/inductor.md), not in lanes of the element type.
SIMD_KINDS = tuple(p.name for p in PRIMS if p.reduction == "associative" and p.name != "prod")
COL_KINDS = ("sum", "amax", "amin", "prod", "argmax", "argmin")
COL_BLOCK = 1024  # columns per block of an outer reduction (its accumulators stay in L1)
COL_TASKS = 8  # blocks (times the outer loops) an outer reduction is cut into, where it can be
# and, where its blocks keep >= COL_WIDE_MIN columns, this many: a many-core CPU's threads
# (16 threads: global average pooling of batch 2, 2 x 4 blocks, left half of them idle)
COL_WIDE_TASKS = 32
COL_WIDE_MIN = 128
COL_BYTES = 64 << 10  # stack bytes of a block's column arrays (accumulators, results)
COL_ROWS = 256  # rows a column's float lane sum takes before it is added into its double
ROWS_KINDS = ("sum", "amax", "amin")  # the reductions the column plan's rows step splits
MAX_THREADS = 64  # per-thread partials of a split reduction
# output bytes from which its pages are asked to be 2 MB ones: glibc's malloc serves buffers
# above its largest mmap threshold (32 MB) from fresh mappings, faulted in again every call;
# smaller ones are mostly recycled heap memory, where the advice measured slower (khugepaged)
HUGE_OUTPUT = 32 << 20
COLLAPSE_MIN = 64  # outer iterations enough for OpenMP's static split: collapse no deeper
DEFAULT_HINT = 64  # the size a schedule decision assumes for a symbol declared without a hint

Key = tuple[object, ...]


@dataclass
class _Reduce:
    key: Key
    j: int  # the C++ names: red<j>, acc<j>, n<j>_...
    node: Node
    body: Graph
    args: dict[Value, str]
    kind: str
    k: int
    red: list[Dim]
    var: str
    deps: set[Key] = field(default_factory=set)
    stores: list[str] = field(default_factory=list)  # extra statements in its pass (rescale)

    @property
    def elem(self) -> DType:
        return _tensor(self.body.outputs[0]).dtype

    @property
    def rdt(self) -> DType:
        return _tensor(self.node.results[0]).dtype

    @property
    def simd(self) -> bool:
        return self.kind in SIMD_KINDS and dclass(self.elem) in ("f", "i")


@dataclass
class _Col:
    """An outer reduction's loop order: blocks of `block` columns of the kept dim i<d-1>
    (`block`: the column arrays' size; with symbolic sizes the blocks' width and count are
    computed at run time by `decls`, as `block_text` <= block and `nblocks_text`)."""
    d: int
    extent: Dim
    block: int
    nblocks: int
    block_text: str = ""
    nblocks_text: str = ""
    decls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.block_text = self.block_text or str(self.block)
        self.nblocks_text = self.nblocks_text or str(self.nblocks)

    @property
    def var(self) -> str:
        return f"i{self.d - 1}"


class _Writer:
    def __init__(self, bodies: Mapping[str, object], hints: Mapping[str, int] | None = None):
        self.bodies = bodies
        self.hints = dict(hints or {})
        self.reduces: dict[Key, _Reduce] = {}  # insertion order is a dependency order
        self.col: _Col | None = None
        self.split = True  # the schedule's split plan: full SIMD reductions over threads
        self.rows = False  # the column plan's rows step: each block's rows split over threads
        # the row split: few rows (serial), each row's reductions split over the threads and
        # its pointwise loops a parallel for of this many collapsed loops (0: not this plan)
        self.rowsplit = False
        self.rowsplit_par = 0
        self.threshold = PARALLEL_WORK  # the schedule's sched_threshold
        # body signatures by graph identity (key() is asked for each reduce node several
        # times per kernel; the bodies do not change while this writer lives)
        self.sigs = SignMemo()

    def hint(self, d: Dim) -> int:
        """A size for schedule decisions only (the code is correct for every size): symbols
        at their hints. The decision, never the hint, shows in the source (the cache key)."""
        if isinstance(d, int):
            return d
        env = {s.name: self.hints.get(s.name, DEFAULT_HINT) for s in d.free_symbols}
        try:
            return evaluate(d, env)
        except ExprEvalError:
            return DEFAULT_HINT

    def sub(self, n: Node) -> Graph:
        ref = n.args[0]
        g = self.bodies.get(ref.name) if isinstance(ref, Ref) else None
        if not isinstance(g, Graph):
            raise CodegenError(f"loop.reduce: body {ref} not found")
        return g

    def key(self, n: Node, args: Mapping[Value, str]) -> Key:
        """Equal for reductions that compute the same thing: the same body (compared by
        structure: fusion may have copied it) over the same buffers and domains."""
        return (body_signature(self.bodies, self.sub(n), self.sigs),
                tuple(args[a] for a in n.args[1:] if isinstance(a, Value)),
                str(n.kwargs["ranges"]), str(n.kwargs["reduce_ranges"]),
                n.kwargs["reduction"])

    def collect(self, body: Graph, args: Mapping[Value, str]) -> set[Key]:
        """Register every reduction `body` reads (nested ones first); its direct ones' keys."""
        direct: set[Key] = set()
        for n in body.nodes:
            if n.op != "loop.reduce":
                continue
            key = self.key(n, args)
            direct.add(key)
            if key in self.reduces:
                continue
            sub = self.sub(n)
            sargs = {sp: args[a] for sp, a in zip(sub.params, n.args[1:], strict=True)
                     if isinstance(a, Value)}
            deps = self.collect(sub, sargs)
            k = len(n.kwargs["ranges"])  # type: ignore[arg-type]
            if any(self.reduces[d].k > k for d in deps):
                raise CodegenError("a reduction reads one over a longer outer domain")
            red = [_int(d) for d in n.kwargs["reduce_ranges"]]  # type: ignore[union-attr]
            j = len(self.reduces)
            self.reduces[key] = _Reduce(key, j, n, sub, sargs, str(n.kwargs["reduction"]), k,
                                        red, f"red{j}", deps)
        return direct

    def ref(self, r: _Reduce) -> str:
        """How code reads a computed reduction: a scalar, or its column's array element."""
        return f"{r.var}[{self.col.var} - ib]" if self.col is not None else r.var

    def value(self, args: Mapping[Value, str]) -> Callable[[Node], str]:
        return lambda n: self.ref(self.reduces[self.key(n, args)])

    # ---- reductions ------------------------------------------------------------------------
    def groups(self, k: int) -> list[list[_Reduce]]:
        """The reductions of depth k, grouped: independent SIMD reductions over the same domain
        share one pass."""
        groups: list[list[_Reduce]] = []
        for r in (r for r in self.reduces.values() if r.k == k):
            g = groups[-1] if groups else None
            if g is not None and r.simd and g[0].simd and g[0].red == r.red \
                    and not any(x.key in r.deps for x in g):
                g.append(r)
            else:
                groups.append([r])
        return groups

    def splits(self, g: list[_Reduce]) -> bool:
        """Whether the split plan splits group g over threads: depth 0 is outside every parallel
        loop, so a large one is (a symbolic one always, its threads started only when large:
        _par_if)."""
        work = math.prod(g[0].red)
        return (g[0].k == 0 or self.rowsplit) and g[0].simd and self.col is None \
            and (not isinstance(work, int) or work >= self.threshold)

    def level(self, k: int) -> list[str]:
        """The statements computing the reductions of depth k, by group."""
        out: list[str] = []
        for g in self.groups(k):
            if self.col is not None:
                out += self.col_group(g)
            elif not g[0].simd:
                out += self.scalar(g[0])
            else:
                out += self.simd_group(g, self.split and self.splits(g))
        return out

    def statements(self, r: _Reduce, j: int) -> list[str]:
        return body_statements(r.body, r.args, f"n{j}_", self.value(r.args))

    def header(self, g: list[_Reduce]) -> list[str]:
        out = []
        for r in g:
            out.append(comment(f"{_describe(r.node)} @{r.body.name}: a reduction fused here"))
            size = f"[{self.col.block}]" if self.col is not None else ""
            out.append(f"{ctypes_of(r.rdt)[1]} {r.var}{size};")
        return out

    def simd_group(self, g: list[_Reduce], split: bool) -> list[str]:
        red = g[0].red or [1]
        inner = red[-1]
        init, lane, step, merge, final, clauses = [], [], [], [], [], []
        parts, keep, combine = [], [], []  # split: per-thread partials
        for r in g:
            j = r.j
            ct = ctypes_of(r.elem)[1]
            v = _cname(r.body.outputs[0], f"n{j}_")
            if r.kind == "sum":
                acc_t = "double" if dclass(r.elem) == "f" else "int64_t"
                lane_t = ct if dclass(r.elem) == "f" else "int64_t"
                init.append(f"{acc_t} acc{j} = 0;")
                lane.append(f"{lane_t} a{j} = 0;")
                clauses.append(f"reduction(+:a{j})")
                step += [f"a{j} += {v};", *r.stores]
                merge.append(f"acc{j} += a{j};")
                final.append(f"{r.var} = {_round(r.rdt, f'({ct})acc{j}')};")
                parts.append(f"{acc_t} pacc{j}[{MAX_THREADS}];")
                keep.append(f"pacc{j}[t] = acc{j};")
                combine.append(f"acc{j} += pacc{j}[t];")
                continue
            op, cmp = ("max", ">") if r.kind == "amax" else ("min", "<")
            start = ACC_INIT[r.kind][dclass(r.elem)].format(S=ct)
            init.append(f"{ct} acc{j} = {start};")
            lane.append(f"{ct} a{j} = {start};")
            clauses.append(f"reduction({op}:a{j})")
            step += [f"a{j} = a{j} {cmp} {v} ? a{j} : {v};", *r.stores]
            merge.append(f"acc{j} = acc{j} {cmp} a{j} ? acc{j} : a{j};")
            parts.append(f"{ct} pacc{j}[{MAX_THREADS}];")
            keep.append(f"pacc{j}[t] = acc{j};")
            combine.append(f"acc{j} = acc{j} {cmp} pacc{j}[t] ? acc{j} : pacc{j}[t];")
            if dclass(r.elem) == "f":
                init.append(f"int nan{j} = 0;")
                clauses.append(f"reduction(|:nan{j})")
                step.append(f"nan{j} |= ({v} != {v});")
                final.append(f"{r.var} = {_round(r.rdt, f'nan{j} ? ({ct})NAN : acc{j}')};")
                parts.append(f"int pnan{j}[{MAX_THREADS}];")
                keep.append(f"pnan{j}[t] = nan{j};")
                combine.append(f"nan{j} |= pnan{j}[t];")
            else:
                final.append(f"{r.var} = acc{j};")
        # the reduced loops in memory order, contiguous ones as one run (_red_loops)
        outer, run = _red_loops(g, red)
        inner = simplify_dim(math.prod(red[d] for d in run))
        last = f"r{run[-1]}"
        stmts = [s for r in g for s in self.statements(r, r.j)]
        clauses += lanes(g, isinstance(inner, int) and inner <= SHORT_ROW)
        vec = [f"#pragma omp simd {' '.join(clauses)}",
               f"for (int64_t {last} = rb; {last} < re; ++{last}) {{",
               *["  " + s for s in [*stmts, *step]], "}"]
        pass_ = [*lane, *vec, *merge]
        # a symbolic extent: its block count at run time (any size, 0 included)
        nblk = f"{-(-inner // BLOCK)}LL" if isinstance(inner, int) else \
            f"(({cexpr(inner)} + {BLOCK - 1}) / {BLOCK})"
        if split and not outer:  # the threads take runs of blocks of the one loop
            body = [f"for (int64_t rk = {nblk} * t / nt; rk < {nblk} * (t + 1) / nt; ++rk) {{",
                    f"  const int64_t rb = rk * {BLOCK}, "
                    f"re = std::min<int64_t>(rb + {BLOCK}, {bound(inner)});",
                    *["  " + s for s in pass_], "}"]
        else:
            if not isinstance(inner, int) or inner > BLOCK:
                blocked = [f"for (int64_t rb = 0; rb < {bound(inner)}; rb += {BLOCK}) {{",
                           f"  const int64_t re = std::min<int64_t>(rb + {BLOCK}, "
                           f"{bound(inner)});",
                           *["  " + s for s in pass_], "}"]
            else:
                blocked = ["{", f"  const int64_t rb = 0, re = {inner};",
                           *["  " + s for s in pass_], "}"]
            if split:  # the threads take runs of the outermost reduced loop
                d0 = outer[0]
                n0 = red[d0]
                n0t = f"{n0}LL" if isinstance(n0, int) else cexpr(n0)
                body = [f"for (int64_t r{d0} = {n0t} * t / nt; r{d0} < {n0t} * (t + 1) / nt; "
                        f"++r{d0}) {{",
                        *["  " + s for s in _perm_loops(red, outer[1:], blocked)], "}"]
            else:
                body = _perm_loops(red, outer, blocked)
        # the run's outer dims: their offsets are inside r<run[-1]>'s range
        body = [*(f"const int64_t r{d} = 0;" for d in run[:-1]), *body]
        if not split:
            return [*self.header(g), "{", *["  " + s for s in [*init, *body, *final]], "}"]
        region = ["const int t = omp_get_thread_num(), nt = omp_get_num_threads();",
                  "if (t == 0) nt_used = nt;", *init, *body, *keep]
        return [*self.header(g), "{", *["  " + s for s in [
            *parts, "int nt_used = 1;",
            f"#pragma omp parallel num_threads(std::min(omp_get_max_threads(), {MAX_THREADS}))"
            + _par_if(math.prod(red), self.threshold),
            "{", *["  " + s for s in region], "}",
            *init, "for (int t = 0; t < nt_used; ++t) {", *["  " + s for s in combine], "}",
            *final]], "}"]

    def col_group(self, g: list[_Reduce]) -> list[str]:
        """One pass over the rows of a block of columns [ib, ie) of the kept dim: the reduced
        loops outside, the columns inside (`omp simd`), one accumulator per column."""
        c = self.col
        assert c is not None
        at, iv, size = f"{c.var} - ib", c.var, f"[{c.block}]"
        decl, zero, step, flush, final = [], [], [], [], []
        for r in g:
            j = r.j
            ct = ctypes_of(r.elem)[1]
            v = _cname(r.body.outputs[0], f"n{j}_")
            if r.kind == "sum" and dclass(r.elem) == "f":
                decl += [f"double acc{j}{size};", f"{ct} a{j}{size};"]
                zero += [f"acc{j}[l] = 0;", f"a{j}[l] = 0;"]
                step.append(f"a{j}[{at}] += {v};")
                flush += [f"acc{j}[l] += a{j}[l];", f"a{j}[l] = 0;"]
                final.append(f"{r.var}[l] = {_round(r.rdt, f'({ct})(acc{j}[l] + a{j}[l])')};")
            elif r.kind in ("sum", "prod"):
                acc_t = "double" if dclass(r.elem) == "f" else "int64_t"
                decl.append(f"{acc_t} acc{j}{size};")
                zero.append(f"acc{j}[l] = {ACC_INIT[r.kind][dclass(r.elem)]};")
                step.append(f"acc{j}[{at}] {'+' if r.kind == 'sum' else '*'}= {v};")
                final.append(f"{r.var}[l] = {_round(r.rdt, f'({ctypes_of(r.rdt)[1]})acc{j}[l]')};")
            elif r.kind in ("argmax", "argmin"):
                # the scalar COMBINE as selects: the first extreme, NaN counting as one
                cmp = ">" if r.kind == "argmax" else "<"
                a = f"acc{j}[{at}]"
                decl += [f"{ct} acc{j}{size};", f"int64_t arg{j}{size};"]
                zero += [f"acc{j}[l] = {ACC_INIT[r.kind][dclass(r.elem)].format(S=ct)};",
                         f"arg{j}[l] = 0;"]
                take = f"({v} {cmp} {a} || {v} != {v}) && {a} == {a}" \
                    if dclass(r.elem) == "f" else f"{v} {cmp} {a}"
                roff = cexpr(flat_offset([rvar(k) for k in range(len(r.red))], r.red))
                step += [f"const bool t{j} = {take};", f"{a} = t{j} ? {v} : {a};",
                         f"arg{j}[{at}] = t{j} ? (int64_t){roff} : arg{j}[{at}];"]
                final.append(f"{r.var}[l] = arg{j}[l];")
            else:
                cmp = ">" if r.kind == "amax" else "<"
                decl.append(f"{ct} acc{j}{size};")
                zero.append(f"acc{j}[l] = {ACC_INIT[r.kind][dclass(r.elem)].format(S=ct)};")
                step.append(f"acc{j}[{at}] = acc{j}[{at}] {cmp} {v} ? acc{j}[{at}] : {v};")
                if dclass(r.elem) == "f":
                    decl.append(f"int nan{j}{size};")
                    zero.append(f"nan{j}[l] = 0;")
                    step.append(f"nan{j}[{at}] |= ({v} != {v});")
                    final.append(f"{r.var}[l] = "
                                 f"{_round(r.rdt, f'nan{j}[l] ? ({ct})NAN : acc{j}[l]')};")
                else:
                    final.append(f"{r.var}[l] = acc{j}[l];")
        stmts = [s for r in g for s in self.statements(r, r.j)]
        row = ["#pragma omp simd", f"for (int64_t {iv} = ib; {iv} < ie; ++{iv}) {{",
               *["  " + s for s in [*stmts, *step]], "}"]
        if flush:
            row += [f"if (++rows == {COL_ROWS}) {{", "  rows = 0;", *_lanes(flush, "  "), "}"]
        init = ["for (int64_t l = 0; l < ie - ib; ++l) {", *["  " + s for s in zero], "}"]
        if self.rows:
            return self.col_rows(g, [*decl, *init, *(["int64_t rows = 0;"] if flush else [])],
                                 row)
        body = loops("r", g[0].red, row)
        return [*self.header(g), "{", *["  " + s for s in [  # (g++ makes memsets of init)
            *decl, *init, *(["int64_t rows = 0;"] if flush else []), *body,
            *_lanes(final)]], "}"]

    def col_rows(self, g: list[_Reduce], start: list[str], row: list[str]) -> list[str]:
        """`col_group`'s pass with the rows split over threads (the rows step, for blocks too
        few to keep the threads busy: BatchNorm's 16..64 channels over N*H*W): each thread
        runs `start` (its own column arrays) and the rows of its run of the outermost reduced
        loop, then keeps its per-column partials; after the region they are combined in
        thread order (deterministic for a thread count). Sums, amax and amin only
        (`ROWS_KINDS`)."""
        c = self.col
        assert c is not None
        b, r0 = c.block, g[0].red[0]
        parts, keep, zero, comb, final = [], [], [], [], []
        for r in g:
            j, cls = r.j, dclass(r.elem)
            ct, rct = ctypes_of(r.elem)[1], ctypes_of(r.rdt)[1]
            # (C type, this thread's partial of column l, the combined value's start, combine)
            states: list[tuple[str, str, str, str]]
            if r.kind == "sum":
                acc_t = "double" if cls == "f" else "int64_t"
                mine = f"acc{j}[l] + a{j}[l]" if cls == "f" else f"acc{j}[l]"
                states = [(acc_t, mine, "0", "{s} += {p};")]
                final.append(f"{r.var}[l] = {_round(r.rdt, f'({rct})cs{j}')};")
            else:
                cmp = ">" if r.kind == "amax" else "<"
                start0 = ACC_INIT[r.kind][cls].format(S=ct)
                states = [(ct, f"acc{j}[l]", start0, f"{{s}} = {{s}} {cmp} {{p}} ? {{s}} : {{p}};")]
                if cls == "f":
                    states.append(("int", f"nan{j}[l]", "0", "{s} |= {p};"))
                    final.append(f"{r.var}[l] = {_round(r.rdt, f'cn{j} ? ({ct})NAN : cs{j}')};")
                else:
                    final.append(f"{r.var}[l] = cs{j};")
            for k, (t, mine, init, op) in enumerate(states):
                name = f"p{j}_{k}"
                parts.append(f"{t} {name}[{MAX_THREADS * b}];")
                keep.append(f"{name}[t * {b} + l] = {mine};")
                sv = f"cn{j}" if k == 1 else f"cs{j}"
                zero.append(f"{t} {sv} = {init};")
                comb.append(op.format(s=sv, p=f"{name}[t * {b} + l]"))
        n0 = f"{r0}LL" if isinstance(r0, int) else cexpr(r0)
        rows = [f"for (int64_t r0 = {n0} * t / nt; r0 < {n0} * (t + 1) / nt; ++r0) {{",
                *["  " + s for s in loops("r", g[0].red[1:], row, first=1)], "}"]
        # one block: its bounds as constants in the region (g++ then keeps the columns'
        # accumulators in vector registers; bounds it reads from the caller's frame cost 3-4x)
        one = c.nblocks == 1 and not c.decls
        region = ["const int t = omp_get_thread_num(), nt = omp_get_num_threads();",
                  "if (t == 0) nt_used = nt;",
                  *([f"const int64_t ib = 0, ie = {c.extent};"] if one else []),
                  *start, *rows, *_lanes(keep)]
        combine = ["for (int64_t l = 0; l < ie - ib; ++l) {", *["  " + s for s in zero],
                   "  for (int t = 0; t < nt_used; ++t) {", *["    " + s for s in comb], "  }",
                   *["  " + s for s in final], "}"]
        return [*self.header(g), "{", *["  " + s for s in [
            *parts, "int nt_used = 1;",
            f"#pragma omp parallel num_threads(std::min(omp_get_max_threads(), {MAX_THREADS}))"
            + ("" if one else " firstprivate(ib, ie)"),
            "{", *["  " + s for s in region], "}", *combine]], "}"]

    def scalar(self, r: _Reduce) -> list[str]:
        j = r.j
        cls = dclass(r.elem)
        if r.kind not in COMBINE or cls not in COMBINE[r.kind]:
            raise CodegenError(f"reduction {r.kind} over {r.elem.name} has no C++ form yet")
        acc_t = "double" if cls == "f" else "int64_t"
        if r.kind in ("amax", "amin", "argmax", "argmin"):
            acc_t = ctypes_of(r.elem)[1]
        init = ACC_INIT[r.kind][cls].format(S=acc_t)
        red = r.red or [1]
        roff = cexpr(flat_offset([rvar(k) for k in range(len(red))], red))
        v = _cname(r.body.outputs[0], f"n{j}_")
        body = loops("r", red, [*self.statements(r, j), f"{acc_t} v = {v};",
                                f"int64_t r = {roff}; (void)r;", COMBINE[r.kind][cls]])
        final = "arg" if r.kind in ("argmax", "argmin") else \
            _round(r.rdt, f"({ctypes_of(r.elem)[1]})acc")
        return [*self.header([r]), "{", f"  {acc_t} acc = {init};",
                "  int64_t arg = 0; (void)arg;", *["  " + s for s in body],
                f"  {r.var} = {final};", "}"]


def lanes(g: Sequence[_Reduce], short: bool) -> list[str]:
    """The simdlen clause of a reduction group's pass: 8 lanes for a short row's cheap pass,
    64 bytes of lanes for a pass calling a math function, g++'s choice otherwise."""
    if any(n.op in COSTLY for r in g for n in r.body.nodes):
        n = COSTLY_LANES.get(ctypes_of(g[0].elem)[1])
        return [f"simdlen({n})"] if n else []
    return [f"simdlen({SHORT_ROW_LANES})"] if short else []


def _lanes(stmts: list[str], pad: str = "") -> list[str]:
    """A vectorised loop over the columns of the current block."""
    return [f"{pad}#pragma omp simd", f"{pad}for (int64_t l = 0; l < ie - ib; ++l) {{",
            *[f"{pad}  {s}" for s in stmts], f"{pad}}}"]


def _hints(symbols: Mapping[str, Symbol] | None) -> dict[str, int]:
    return {n: s.hint for n, s in (symbols or {}).items() if s.hint is not None}


def _setup(node: Node, body: Graph, w: _Writer) -> tuple[dict[Value, str], list[Dim]]:
    """Collect the kernel's reductions into `w` (a loop.reduction's own last); its buffers'
    C++ names and its loop extents."""
    args = {p: f"in{k}" for k, p in enumerate(body.params)}
    ranges = [_int(d) for d in node.kwargs["ranges"]]  # type: ignore[union-attr]
    if node.op == "loop.pointwise":
        w.collect(body, args)
    else:  # loop.reduction: one reduce of depth len(ranges), stored
        red = [_int(d) for d in node.kwargs["reduce_ranges"]]  # type: ignore[union-attr]
        deps = w.collect(body, args)
        key: Key = ("@" + body.name, tuple(args.values()), "", "", "")
        w.reduces[key] = _Reduce(key, len(w.reduces), node, body, args,
                                 str(node.kwargs["reduction"]), len(ranges), red,
                                 f"red{len(w.reduces)}", deps)
    return args, ranges


def _work(w: _Writer, ranges: Sequence[Dim]) -> Dim:
    return simplify_dim(math.prod(ranges) + sum(
        math.prod(ranges[:r.k]) * _at_least_1(math.prod(r.red)) for r in w.reduces.values()))


def _depth(w: _Writer) -> int:
    return max((r.k for r in w.reduces.values()), default=0)


def _at_least_1(n: Dim) -> Dim:
    return max(1, n) if isinstance(n, int) else sympy.Max(1, n)


def _par_if(work: Dim, threshold: int = PARALLEL_WORK) -> str:
    """An OpenMP clause running a parallel region on one thread when the (symbolic) work is
    below the threshold; nothing for a static size (decided when the code is written)."""
    work = simplify_dim(work)
    if isinstance(work, int):
        return ""
    return f" if(parallel: {cexpr(work)} >= {threshold})"


def _pragma(n_par: int, simd: bool = False, cond: str = "") -> str:
    coll = f" collapse({n_par})" if n_par > 1 else ""
    return f"#pragma omp parallel for{' simd' if simd else ''} schedule(static){coll}{cond}"


def _nest(w: _Writer, ranges: Sequence[Dim], inner: list[str], n_par: int,
          order: Sequence[int], vec: bool, cond: str = "") -> list[str]:
    """Loops i0.. with each depth's reductions computed before the deeper loops, the pointwise
    part innermost (its loops in the schedule's `order`). OpenMP splits the `n_par` outer loops
    (collapsed; none of them holds a reduction between them); the innermost pointwise loop is
    SIMD where `vec`."""
    depth = _depth(w)
    levels = {d: w.level(d) for d in range(depth + 1)}

    def pragma(d: int) -> list[str]:
        if w.rowsplit and d == depth:  # the row split: the row's pointwise loops
            return [_pragma(w.rowsplit_par, d == len(ranges) - 1 and vec, cond)] \
                if w.rowsplit_par else []
        if d != 0 or n_par == 0:
            return []
        return [_pragma(n_par, d == len(ranges) - 1 and depth == 0 and vec, cond)]

    def build(d: int) -> list[str]:
        out = list(levels.get(d, [])) if d <= depth else []
        if d >= len(ranges):
            return [*out, *inner]
        if d >= depth:  # only pointwise loops below
            out += pragma(d) + _simd_loops(d, ranges, inner, pragma(d) != [], order, vec)
            return out
        out += pragma(d) + [f"for (int64_t i{d} = 0; i{d} < {bound(ranges[d])}; ++i{d}) {{",
                            *["  " + s for s in build(d + 1)], "}"]
        return out
    return build(0)


def _nest_col(w: _Writer, ranges: Sequence[Dim], inner: list[str], n_par: int,
              order: Sequence[int], vec: bool, cond: str = "") -> list[str]:
    """An outer reduction: loops i0..i<d-2> and the column blocks of i<d-1> (split by OpenMP),
    in each the reductions' column passes, then the pointwise part over the block's columns
    (and any deeper dims, the innermost SIMD)."""
    c = w.col
    assert c is not None
    d, iv = c.d, c.var
    body = [f"const int64_t ib = b * {c.block_text}, ie = std::min<int64_t>(ib + "
            f"{c.block_text}, {bound(c.extent)});", *w.level(d)]
    if d == len(ranges):
        body += [*(["#pragma omp simd"] if vec else []),
                 f"for (int64_t {iv} = ib; {iv} < ie; ++{iv}) {{",
                 *["  " + s for s in inner], "}"]
    else:
        body += [f"for (int64_t {iv} = ib; {iv} < ie; ++{iv}) {{",
                 *["  " + s for s in _simd_loops(d, ranges, inner, False, order, vec)], "}"]
    loop = [f"for (int64_t b = 0; b < {c.nblocks_text}; ++b) {{", *["  " + s for s in body],
            "}"]
    out = loops("i", ranges[:d - 1], loop)
    return c.decls + ([_pragma(n_par, cond=cond)] if n_par else []) + out


def _simd_loops(d: int, ranges: Sequence[Dim], inner: list[str], has_pragma: bool,
                order: Sequence[int] | None = None, vec: bool = True) -> list[str]:
    """Loops d.. of `order` (over dims order[d], ...) with `omp simd` on the innermost where
    `vec` (unless it already carries the parallel pragma as `parallel for simd`)."""
    n = len(ranges)
    order = range(n) if order is None else order
    out = []
    for k in range(d, n):
        i = order[k]
        if k == n - 1 and vec and not (has_pragma and k == d):
            out.append("  " * (k - d) + "#pragma omp simd")
        out.append("  " * (k - d) + f"for (int64_t i{i} = 0; i{i} < {bound(ranges[i])}; "
                   f"++i{i}) {{")
    out += ["  " * (n - d) + s for s in inner]
    out += ["  " * (k - d) + "}" for k in reversed(range(d, n))]
    return out


def _perm_loops(red: Sequence[Dim], dims: Sequence[int], inner: list[str]) -> list[str]:
    """Nested loops r<d> over red[d] for d in `dims` (outermost first), `inner` innermost."""
    head = [f"for (int64_t r{d} = 0; r{d} < {cexpr(red[d])}; ++r{d}) {{" for d in dims]
    return head + ["  " + x for x in inner] + ["}"] * len(dims)


def load_offset(node: Node) -> Dim:
    """A `loop.load`'s element offset into its buffer: its index flattened row-major over the
    buffer's shape (schedule.py's stride tests read it too)."""
    buf = node.args[0]
    assert isinstance(buf, Value)
    index = [parse_index(x) for x in node.kwargs["index"]]  # type: ignore[union-attr]
    return flat_offset(index, _tensor(buf).shape)


def _load_strides(g: Sequence[_Reduce], n: int) -> list[list[int]] | None:
    """The element stride of each load of group g along each reduced loop r0..r<n-1>; None
    where a load's offset is not a sum of integer multiples of loop variables (a size symbol,
    a division) or the body reads its indices otherwise (loop.index: the value depends on the
    loop order)."""
    loop_vars = {rvar(d) for d in range(n)}
    out: list[list[int]] = []
    for r in g:
        for node in r.body.nodes:
            if node.op in ("loop.index", "loop.index_select"):
                return None
            if node.op != "loop.load":
                continue
            st = [0] * n
            for term in sympy.Add.make_args(sympy.expand(sympy.sympify(load_offset(node)))):
                coeff, var = term.as_coeff_Mul()
                if var == 1:
                    continue
                if not coeff.is_Integer or not isinstance(var, sympy.Symbol) \
                        or not (var in loop_vars or re.fullmatch(r"i\d+", var.name)):
                    return None  # (i<k>: an outer loop's, fixed in the pass)
                if var in loop_vars:
                    st[int(var.name[1:])] += int(coeff)
            out.append(st)
    return out


def _red_loops(g: Sequence[_Reduce], red: Sequence[Dim]) -> tuple[list[int], list[int]]:
    """The reduced loops of SIMD group g: those outside the vectorised loop (outermost first),
    and the dims the vectorised loop runs over as one run (outermost first, the loop variable
    the last). The dim read with unit stride by most loads goes innermost (a GroupNorm over a
    channels-last buffer summed with stride 64: 1218 -> 559 us at 1 thread, hand kernel,
    s12h7; poolformer_s12's 2x64x56x56, 1 thread: 5241 -> 4169 us), the rest by descending
    stride; then the dims every load reads contiguously with the run join it (the same speed
    at 1 thread, but a split pass then divides the row's 4096-element blocks over the
    threads, not its H rows: 14 at poolformer's third stage, for 16 threads). Only the
    order of the sum changes. Else (the unit-stride dim already innermost, or none), and with
    stores in the pass (rescale), the loops as they are."""
    n = len(red)
    keep = (list(range(n - 1)), [n - 1])
    strides = _load_strides(g, n) if n > 1 and not any(r.stores for r in g) else None
    if not strides:
        return keep
    units = [sum(st[d] == 1 for st in strides) for d in range(n)]
    best = max(range(n), key=lambda d: (units[d], d))
    # loops already in memory order stay as they are: joined into one run, a contiguous
    # GroupNorm / LayerNorm row measured slower (NCHW 2x64x56x56, 1 thread: 838 -> 881 us,
    # LayerNorm over C, H, W 596 -> 685 us; wider lanes did not help)
    if best == n - 1 or 2 * units[best] <= len(strides):
        return keep
    order = [*sorted((d for d in range(n) if d != best),
                     key=lambda d: -max(abs(st[d]) for st in strides)), best]
    run = [order[-1]]
    ext = red[order[-1]]
    for d in reversed(order[:-1]):
        if not isinstance(ext, int) or not isinstance(red[d], int) \
                or any(st[d] != st[run[-1]] * ext for st in strides):
            break
        run.insert(0, d)
        ext *= red[d]
    outer = order[:n - len(run)]
    if (outer, run) == keep:
        return keep
    old = red[n - 1]
    # a short run (a 3-channel image's c) loses to the old innermost loop
    if isinstance(ext, int) and ext < 16 and (not isinstance(old, int) or ext < old):
        return keep
    return outer, run


def loops(var: str, ranges: Sequence[Dim], inner: list[str], first: int = 0) -> list[str]:
    """Plain nested loops var<first>.. over `ranges`, `inner` innermost."""
    if not ranges:
        return list(inner)
    head = [f"for (int64_t {var}{k + first} = 0; {var}{k + first} < {cexpr(n)}; "
            f"++{var}{k + first}) {{" for k, n in enumerate(ranges)]
    return head + ["  " + x for x in inner] + ["}"] * len(ranges)
