"""The CPU target's schedule stage: the `schedule-cpu` pass (docs/inductor.md, "The schedule
stage").

It writes, on each `loop.pointwise` / `loop.reduction` node of a fused loop module, the decisions
`codegen-cpp` renders: loop order, the loops OpenMP splits (the collapse depth), the vectorised
loop, the reduction plan (plain, column, split, rescale), the column blocks where the sizes are
static and the work threshold of per-call decisions, as `sched_*` attributes
(ember.inductor.schedule). The decisions are `kernel_schedule`'s (`_decide`, below), which
codegen-cpp also calls for a node without them, so a module compiles to the same C++ with or
without this stage; attributes already on a node (a hand-edited schedule) are kept. `_apply`
checks a schedule against its kernel and sets up cppkernel's writer to render it.

Another schedule is a pass of its own: register it under a name (`register_pass`) and use a
pipeline that runs it in place of this one (codegen-cpp renders whatever it wrote, refusing a
schedule that does not fit a kernel with a one-line ScheduleError).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import sympy
import torch

from ember.inductor.body import body_names
from ember.inductor.indexing import ivar, parse_index, rvar, substitute
from ember.inductor.sanitize import comment
from ember.inductor.schedule import Schedule, ScheduleError, check_schedule_attrs, read_schedule
from ember.inductor.targets import device_kind, graph_devices
from ember.inductor.targets.cpu.cpp import CodegenError, _tensor, cexpr, dclass, size_symbols
from ember.inductor.targets.cpu.cppkernel import (
    COL_BLOCK,
    COL_BYTES,
    COL_KINDS,
    COL_TASKS,
    COL_WIDE_MIN,
    COL_WIDE_TASKS,
    COLLAPSE_MIN,
    MAX_THREADS,
    PARALLEL_WORK,
    ROWS_KINDS,
    _Col,
    _depth,
    _hints,
    _Reduce,
    _setup,
    _work,
    _Writer,
    load_offset,
)
from ember.ir import DType, Graph, Module, Node, OpTypeError, Ref, Symbol, Value
from ember.ir.expr import Dim, simplify_dim
from ember.ir.passes import register_pass

KERNEL_OPS = ("loop.pointwise", "loop.reduction")
ROWS_BYTES = 128 << 10  # stack bytes of a rows step's per-thread column partials
TRANSPOSE_STRIDE = 16  # elements a load strides along the innermost loop of a transpose


@register_pass("schedule-cpu", "write the CPU schedule (loop order, OpenMP, SIMD, reduction "
               "plan, blocks) on each loop kernel as sched_* attributes")
def schedule_cpu(module: Module) -> Module:
    m = module.clone()
    bodies = body_names(m)
    # graphs on another device get no CPU schedule (codegen-cpp refuses them, naming them)
    graphs = [g for g in m.graphs.values() if g.name not in bodies
              and all(device_kind(d) == "cpu" for d in graph_devices(g))]
    for g in graphs:
        for n in g.nodes:
            ref = n.args[0] if n.args else None
            body = m.items.get(ref.name) if isinstance(ref, Ref) else None
            if n.op not in KERNEL_OPS or not isinstance(body, Graph):
                continue
            try:
                s = kernel_schedule(n, body, m.items, m.symbols)
            except CodegenError:  # a kernel C++ cannot express: it runs on the reference
                continue
            n.kwargs = {**n.kwargs, **{k: v for k, v in s.attrs().items()
                                       if k not in n.kwargs}}
    return m


# ---- the default decisions, and the checks of a schedule against its kernel --------------

def kernel_schedule(node: Node, body: Graph, bodies: Mapping[str, object] | None = None,
                    symbols: Mapping[str, Symbol] | None = None) -> Schedule:
    """The schedule `kernel_source` renders for a loop node: its `sched_*` attributes, the
    default decisions for those it lacks (CodegenError: a kernel C++ cannot express)."""
    w = _Writer(bodies or {}, _hints(symbols))
    with size_symbols():
        args, ranges = _setup(node, body, w)
        return read_schedule(node.kwargs, _decide(w, node, body, args, ranges))


def _decide(w: _Writer, node: Node, body: Graph, args: Mapping[Value, str],
            ranges: Sequence[Dim]) -> Schedule:
    """The default schedule of a kernel whose reductions `w` holds (the decisions, made where
    the sizes are static or at the symbols' hints; per-call ones stay per call)."""
    n = len(ranges)
    w.col = col = _column_plan(w, ranges)
    steps = ["column"] if col is not None else []
    if any(w.splits(g) for g in w.groups(0)):
        steps.append("split")
    if col is None and node.op == "loop.pointwise" \
            and _rescale_plan(w, body, args, ranges) is not None:
        steps.append("rescale")
    work = _work(w, ranges)
    # decisions by the thread count compiled for: they show in the source (the cache key)
    threads = torch.get_num_threads()
    least = static_threshold(threads)
    if col is None and not steps and _row_split_pays(w, ranges, threads, least):
        return Schedule(tuple(range(n)), (), (n - 1,) if _depth(w) < n else (), "split", None,
                        least)
    # symbolic work: the threads are started per call where it is large enough (_par_if)
    parallel = bool(ranges) and (not isinstance(work, int) or work >= least)
    if col is not None and parallel and (rows := _rows_plan(w, ranges, col)) is not None:
        w.col = None
        return Schedule(tuple(range(n)), (), (n - 1,), "column+rows",
                        (rows.block, rows.nblocks), PARALLEL_WORK)
    order = tuple(range(n))
    if not steps and node.op == "loop.pointwise" and not w.reduces:
        order = _transpose_order(body, ranges) or order
    n_par = col.d if col is not None else \
        _collapse(w, [ranges[i] for i in order], _par_limit(w, ranges))
    vector = (order[-1],) if n and (col is not None or _depth(w) < n) else ()
    blocks = (col.block, col.nblocks) if col is not None and not col.decls else None
    w.col = None
    return Schedule(order, order[:n_par] if parallel else (), vector,
                    "+".join(steps) or "plain", blocks, PARALLEL_WORK)


def _strides(off: Dim, n: int) -> list[int] | None:
    """The element stride of flat offset `off` along each loop i0..i<n-1>, read at the origin
    (a split dim's step inside its innermost run); None where it is not a constant."""
    if isinstance(off, int):
        return [0] * n
    zero = {ivar(k): sympy.Integer(0) for k in range(n)}
    base = off.xreplace(zero)
    out = []
    for d in range(n):
        step = sympy.sympify(off.xreplace({**zero, ivar(d): sympy.Integer(1)}) - base)
        if not step.is_Integer:
            return None
        out.append(abs(int(step)))
    return out


def _transpose_order(body: Graph, ranges: Sequence[Dim]) -> tuple[int, ...] | None:
    """The loop order of a transposing pointwise kernel: where the output's innermost dim has
    TRANSPOSE_STRIDE iterations or more and every load that moves along it strides by as many
    elements there, the dim whose loop reads some load contiguously and has the smallest
    largest stride (loads and the store) goes innermost, if that stride is smaller than the
    innermost dim's. A copy of [2, 4, 12, 1024] as [2, 1024, 48] read 48 floats 4 KB apart per
    row (one L1 set): 124 -> 56 us at 1 thread. A short innermost dim keeps the order: an NCHW
    image copied channels-last (3 channels, three read streams) took 0.24 -> 0.40 ms with its
    stores 3 floats apart instead."""
    n = len(ranges)
    if n < 2 or not all(isinstance(r, int) for r in ranges):
        return None
    loads = []
    for node in body.nodes:
        if node.op == "loop.load":
            st = _strides(load_offset(node), n)
            if st is None:
                return None
            loads.append(st)
    moving = [st[-1] for st in loads if st[-1]]
    if not moving or min(moving) < TRANSPOSE_STRIDE or int(ranges[-1]) < TRANSPOSE_STRIDE:
        return None
    best, best_worst = None, max(moving)
    for d in range(n - 1):
        if int(ranges[d]) < TRANSPOSE_STRIDE or not any(st[d] == 1 for st in loads):
            continue
        worst = max([st[d] for st in loads] + [math.prod(int(r) for r in ranges[d + 1:])])
        if worst < best_worst:
            best, best_worst = d, worst
    if best is None:
        return None
    return (*[k for k in range(n) if k != best], best)


def _apply(w: _Writer, node: Node, body: Graph, args: Mapping[Value, str],
           ranges: Sequence[Dim], s: Schedule) -> tuple[_Reduce, Value] | None:
    """Set `w` up to render schedule `s` (ScheduleError where it does not fit the kernel); the
    rescale plan's sum and quotient, if it is one."""
    def refuse(why: str) -> ScheduleError:
        return ScheduleError(f"{node.op} of @{body.name}: {why}")
    try:  # a schedule merged from the attributes and the defaults: checked as a whole
        check_schedule_attrs("schedule", s.attrs(), len(ranges))
    except OpTypeError as e:
        raise refuse(str(e).removeprefix("schedule: ")) from None
    depth, n = _depth(w), len(ranges)
    if s.order[:depth] != tuple(range(depth)):
        raise refuse(f"sched_order={list(s.order)}: the loops over dims 0..{depth - 1} hold "
                     f"its reductions and stay outermost, in order")
    w.split, w.threshold = "split" in s.steps, s.threshold
    w.col = None
    if "column" in s.steps:
        d = _column_dim(w)
        if d is None:
            raise refuse("sched_plan=\"column\" needs every reduction to be a sum, prod, "
                         "amax, amin, argmax or argmin over ints or floats, per element of "
                         "the same outer dims")
        w.col = _col_blocks(w, d, ranges, s.blocks, refuse)
    w.rows = "rows" in s.steps
    if w.rows:
        if w.col is None:
            raise refuse("sched_plan rows is a step of the column plan (column+rows)")
        why = _rows_veto(w, w.col)
        if why is not None:
            raise refuse(f"sched_plan column+rows: {why}")
        if s.parallel:
            raise refuse(f"sched_parallel={list(s.parallel)}: under column+rows the threads "
                         f"split each block's rows; the outer loops stay on one thread ([])")
    w.rowsplit, w.rowsplit_par = False, 0
    if w.split and not any(r.k == 0 and r.simd for r in w.reduces.values()):
        if s.parallel or not _row_split_fits(w):
            raise refuse("sched_plan split needs a full reduction (a sum, amax or amin over "
                         "ints or floats to one value), or, with sched_parallel=[], SIMD "
                         "reductions all at one depth (the row split)")
        k = _depth(w)
        w.rowsplit = True  # (k == n: no pointwise loop below the reductions)
        w.rowsplit_par = _collapse(w, [ranges[i] for i in s.order[k:]], max(1, n - k - 1)) \
            if k < n else 0
    plan = None
    if "rescale" in s.steps:
        plan = _rescale_plan(w, body, args, ranges) if node.op == "loop.pointwise" else None
        if plan is None:
            raise refuse("sched_plan rescale needs a quotient e / sum(e) over the innermost "
                         "dim (softmax's)")
    if len(s.parallel) > _par_limit(w, ranges):
        raise refuse(f"sched_parallel={list(s.parallel)}: OpenMP can split at most "
                     f"{_par_limit(w, ranges)} outer loop(s) of this kernel")
    if s.vector and w.col is None and depth >= n:
        raise refuse(f"sched_vector={list(s.vector)}: the kernel has no pointwise loop to "
                     f"vectorise")
    return plan


def _par_limit(w: _Writer, ranges: Sequence[Dim]) -> int:
    """The most outer loops OpenMP may split: the column plan's loops and blocks; otherwise up
    to the first depth that computes a reduction (all but the innermost loop of a pointwise
    kernel, whose loop is `parallel for simd` when it is the only one)."""
    if w.col is not None:
        return w.col.d
    depth = _depth(w)
    first = min((r.k for r in w.reduces.values()), default=0)
    n_par = first if first > 0 else max(1, len(ranges) - 1) if depth == 0 else 0
    return min(n_par, len(ranges))


def _column_dim(w: _Writer) -> int | None:
    """The depth d of the kernel's reductions where the column loop order can compute them:
    all per output element of the same outer dims, of a kind with a column form."""
    rs = list(w.reduces.values())
    if not rs:
        return None
    d = rs[0].k
    if d == 0 or any(r.k != d or r.kind not in COL_KINDS or dclass(r.elem) not in ("f", "i")
                     or not r.red for r in rs):
        return None
    return d


def _column_plan(w: _Writer, ranges: Sequence[Dim]) -> _Col | None:
    """The outer-reduction loop order, where it can compute the reductions (_column_dim) and
    their loads are contiguous along the kept dim i<d-1> more often than along the innermost
    reduced dim."""
    d = _column_dim(w)
    if d is None or w.hint(ranges[d - 1]) < 2:
        return None
    rs = list(w.reduces.values())
    along_i = along_r = 0
    for r in rs:
        for n in r.body.nodes:
            if n.op != "loop.load":
                continue
            off = load_offset(n)
            along_i += _unit_stride(off, ivar(d - 1))
            along_r += _unit_stride(off, rvar(len(r.red) - 1))
    if along_i <= along_r:
        return None
    return _col_blocks(w, d, ranges, None, ScheduleError)


def _col_blocks(w: _Writer, d: int, ranges: Sequence[Dim], blocks: tuple[int, int] | None,
                refuse: Callable[[str], ScheduleError]) -> _Col:
    """The column blocks of the kept dim i<d-1>: `blocks` (a schedule's [block, count]) or,
    for None, the default rule's (per call for symbolic sizes)."""
    extent, outer = ranges[d - 1], simplify_dim(math.prod(ranges[:d - 1]))
    # <= 32 bytes of stack arrays per reduction and column: many reductions, fewer columns
    widest = max(16, min(COL_BLOCK, COL_BYTES // (32 * len(w.reduces))) // 16 * 16)
    if not isinstance(extent, int) or not isinstance(outer, int):
        if blocks is not None:
            raise refuse(f"sched_blocks={list(blocks)}: the column blocks of symbolic sizes "
                         f"are computed per call (write \"auto\")")
        return _symbolic_col(d, extent, outer, widest)
    if blocks is not None:
        block, count = blocks
        if block > widest or count != _cdiv(extent, block):
            raise refuse(f"sched_blocks={list(blocks)}: a block holds 1..{widest} columns "
                         f"(its arrays live on the stack) and the count covers the "
                         f"{extent} columns: ceil({extent} / block)")
        return _Col(d, extent, block, count)
    nblocks = max(_cdiv(extent, widest), min(_cdiv(extent, 16), _cdiv(COL_TASKS, outer)),
                  min(_cdiv(extent, COL_WIDE_MIN), _cdiv(COL_WIDE_TASKS, outer)))
    block = min(extent, _cdiv(_cdiv(extent, nblocks), 16) * 16)  # whole vectors
    return _Col(d, extent, block, _cdiv(extent, block))


def _rows_states(w: _Writer) -> int:
    """The per-thread partial arrays a rows step keeps per column: one per reduction, and a
    NaN flag per float amax/amin."""
    return sum(1 + (r.kind != "sum" and dclass(r.elem) == "f") for r in w.reduces.values())


def _rows_veto(w: _Writer, col: _Col) -> str | None:
    """Why the rows step cannot render the column plan `col` (None: it can)."""
    if any(r.kind not in ROWS_KINDS or dclass(r.elem) not in ("f", "i")
           for r in w.reduces.values()):
        return f"every reduction must be a {', '.join(ROWS_KINDS)} over ints or floats"
    if col.decls:
        return "the column blocks of symbolic sizes are computed per call"
    if MAX_THREADS * col.block * _rows_states(w) * 8 > ROWS_BYTES:
        return (f"a block of {col.block} columns needs more than {ROWS_BYTES} bytes of "
                f"per-thread partials ({MAX_THREADS} threads)")
    return None


def _rows_plan(w: _Writer, ranges: Sequence[Dim], col: _Col) -> _Col | None:
    """The column plan with each block's rows split over threads, where the default plan has
    fewer tasks (outer iterations times column blocks) than COL_TASKS and the rows can be
    split (the outermost reduced loop has 2+ iterations): BatchNorm over 16..64 channels of
    N*H*W rows ran on one or two threads. Its blocks are as wide as the partial arrays allow
    (the threads share the rows, not the columns); None: keep the default plan."""
    outer = w.hint(simplify_dim(math.prod(ranges[:col.d - 1])))
    red0 = [w.hint(r.red[0]) if r.red else 1 for r in w.reduces.values()]
    # (a kernel with loops inside the columns' (d < rank) keeps its parallel pointwise part)
    if col.decls or col.d != len(ranges) or outer * col.nblocks >= COL_TASKS or min(red0) < 2:
        return None
    per = MAX_THREADS * _rows_states(w) * 8
    widest = min(COL_BLOCK, ROWS_BYTES // per) // 16 * 16
    extent = col.extent
    assert isinstance(extent, int)
    if widest < 16:
        return None
    nblocks = _cdiv(extent, widest)
    block = min(extent, _cdiv(_cdiv(extent, nblocks), 16) * 16)
    rows = _Col(col.d, extent, block, _cdiv(extent, block))
    return rows if _rows_veto(w, rows) is None else None


def _symbolic_col(d: int, extent: Dim, outer: Dim, widest: int) -> _Col:
    """The column blocks of a symbolic extent: the static plan's arithmetic at run time
    (`cb` columns per block, `nb` blocks), the arrays sized for the widest block."""
    e, o = cexpr(extent), cexpr(outer)
    mx, mn = "std::max<int64_t>", "std::min<int64_t>"
    decls = [comment("the column blocks of this call's sizes (as for static sizes)"),
             f"const int64_t cn = {mx}({mx}({mx}(({e} + {widest - 1}) / {widest}, {mn}(({e} + "
             f"15) / 16, ({COL_TASKS} + {o} - 1) / {mx}({o}, 1))), {mn}(({e} + "
             f"{COL_WIDE_MIN - 1}) / {COL_WIDE_MIN}, ({COL_WIDE_TASKS} + {o} - 1) / "
             f"{mx}({o}, 1))), 1);",
             f"const int64_t cb = {mx}({mn}({e}, (({e} + cn - 1) / cn + 15) / 16 * 16), 1);",
             f"const int64_t nb = ({e} + cb - 1) / cb;"]
    return _Col(d, extent, widest, 0, "cb", "nb", decls)


def _cdiv(a: int, b: int) -> int:
    return -(-a // max(b, 1))


def _unit_stride(off: sympy.Expr | int, var: sympy.Symbol) -> bool:
    if isinstance(off, int):
        return False
    return bool(sympy.expand(off.xreplace({var: var + 1}) - off) == 1)


def _expr(w: _Writer, g: Graph, v: Value, args: Mapping[Value, str],
          subst: Mapping[sympy.Symbol, sympy.Expr]) -> object:
    """A value's expression tree as a comparable key: loads by buffer and index (after `subst`),
    fused reductions by their key."""
    made = {res: n for n in g.nodes for res in n.results}
    memo: dict[Value, object] = {}

    def go(x: Value) -> object:
        if x in memo:
            return memo[x]
        n = made.get(x)
        if n is None:
            out: object = ("param", args.get(x))
        elif n.op == "loop.load":
            buf = n.args[0]
            assert isinstance(buf, Value)
            out = ("load", args[buf], tuple(
                str(substitute(parse_index(s), subst))
                for s in n.kwargs["index"]))  # type: ignore[union-attr]
        elif n.op == "loop.reduce":
            out = ("reduce", w.key(n, args))
        else:
            out = (n.op, tuple(go(a) if isinstance(a, Value) else repr(a) for a in n.args),
                   repr(sorted(n.kwargs.items())), str(n.results[0].type))
        memo[x] = out
        return out
    return go(v)


def _rescale_plan(w: _Writer, body: Graph, args: Mapping[Value, str], ranges: Sequence[Dim]
                  ) -> tuple[_Reduce, Value] | None:
    """The sum whose pass can store the kernel's numerators, and the quotient: the body holds
    `q = e / s` where s sums e over the innermost output dim (softmax; HF's masked softmax
    wraps q in a where), and its one output is f32/f64 like e (so e is stored exactly)."""
    if len(body.outputs) != 1 or not ranges:
        return None
    dt = _tensor(body.outputs[0]).dtype
    if dt not in (DType.f32, DType.f64):
        return None
    made = {res: n for n in body.nodes for res in n.results}
    for n in body.nodes:
        if n.op != "prims.div" or len(n.args) != 2 \
                or not all(isinstance(a, Value) for a in n.args):
            continue
        num, den = n.args
        assert isinstance(num, Value) and isinstance(den, Value)
        dn = made.get(den)
        if dn is None or dn.op != "loop.reduce":
            continue
        r = w.reduces[w.key(dn, args)]
        if r.kind != "sum" or r.k != len(ranges) - 1 or r.red != [ranges[-1]] \
                or r.elem != dt or r.rdt != dt or _tensor(num).dtype != dt:
            continue
        if _expr(w, r.body, r.body.outputs[0], r.args, {rvar(0): ivar(r.k)}) \
                == _expr(w, body, num, args, {}):
            return r, n.results[0]
    return None


PARALLEL_WORK_MANY = 8192  # torch's rule at 16 threads: 512 element-steps a thread
MANY_THREADS = 8


def static_threshold(threads: int) -> int:
    """The static work (element-steps) from which a kernel compiled for `threads` threads gets
    them. 32768 was measured at 1-2 threads (a fork/join costs more than smaller kernels); at
    MANY_THREADS or more it is PARALLEL_WORK_MANY: levit_128s's BatchNorm-after-linear kernels
    (8192..25088 element-steps, 61 calls a forward) ran on one thread of 16."""
    return PARALLEL_WORK_MANY if threads >= MANY_THREADS else PARALLEL_WORK


def _row_split_fits(w: _Writer) -> bool:
    """Whether the row split can render the kernel: its reductions all SIMD, all at one depth
    k >= 1 (the rows: the k outer loops, on one thread), no column plan."""
    rs = list(w.reduces.values())
    return bool(rs) and w.col is None and rs[0].k > 0 \
        and all(r.k == rs[0].k and r.simd for r in rs)


def _row_split_pays(w: _Writer, ranges: Sequence[Dim], threads: int, least: int) -> bool:
    """Whether the default schedule splits each row over the threads: it fits, the rows are
    static and at most half the threads (GroupNorm(1, C) at batch 2 gave 2 of 16 threads work:
    25 calls, ~39% of poolformer_s12's 16-thread time), and every reduction of a row is
    `least` element-steps or more. Where rows >= threads / 2, their own parallel for keeps
    most threads busy and a row's 3 split passes (6 fork/joins) cost more than they give (2
    threads, 2 rows: poolformer_s12 79.5 -> 86.0 ms wall, s12h7)."""
    if not _row_split_fits(w):
        return False
    rows = simplify_dim(math.prod(ranges[:_depth(w)]))
    if not isinstance(rows, int) or 2 * rows > threads:
        return False
    return all(isinstance(m := simplify_dim(math.prod(r.red)), int) and m >= least
               for r in w.reduces.values())


def _collapse(w: _Writer, ranges: Sequence[Dim], n_par: int) -> int:
    """The fewest outer loops (at most n_par) giving OpenMP enough iterations to split well:
    collapsing more only adds index arithmetic (symbolic sizes: at their hints)."""
    for p in range(1, n_par):
        if w.hint(simplify_dim(math.prod(ranges[:p]))) >= COLLAPSE_MIN:
            return p
    return n_par


__all__ = ["KERNEL_OPS", "kernel_schedule", "schedule_cpu"]
