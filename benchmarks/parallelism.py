"""A parallelism census of ember's compiled zoo models (issue 18): how far each would scale at
`--target` threads if every piece scaled as well as its parallel chunks allow. An ESTIMATE from
1-thread measurements and the generated code, not a measurement at that thread count.

    PYTHONPATH=/tmp/zoolibs python benchmarks/parallelism.py \\
        --models tv/resnet50,hf/bert --target 16 --reps 15 --out benchmarks/results

Per model, ember compiles the zoo model for `--target` threads (schedule decisions depend on the
thread count compiled for), then at one thread (`torch.set_num_threads(1)`) its
generated wrapper (wrapper.py's straight-line `call`) is re-executed with every line timed by the
calling thread's CPU time (`time.thread_time_ns`; at one thread every kernel runs on it), `--reps`
calls, per-line medians. Each line is one of:
- a C++ kernel call: its source is read for the OpenMP split: `parallel for ... collapse(c)` over
  the next c loops (chunks = their trip counts' product), a `parallel` region whose threads take
  runs of a loop by `t / nt` (split reductions, the column plan's rows step: chunks = that loop's
  trip count), or no pragma at all (the kernel's static work was below the threshold:
  one chunk). With schedule(static) and equal chunks, at T threads the slowest thread runs
  ceil(c / T) chunks: the estimate is t1 * ceil(c / T) / c (t1 at one thread). Where a kernel
  has several nests (splitloops), the nest with the fewest chunks is taken;
- an extern call (oneDNN convolution, packed linear, matmul, ember's attention, index_select,
  other torch ops): assumed to scale perfectly, t1 / T (a library's own threading; the
  assumption is named in the report);
- wrapper work (input checks, allocations, views, `del`s): serial, t1.

`--measure` also times every line at `--target` threads by wall time (`--realtime`: under
SCHED_FIFO), for a machine with that many cores: the estimate next to the measurement, line by
line. Before that timing, oneDNN's packed weights are dropped and made again at `--target`
threads by two untimed calls (`repack_at`): oneDNN picks a convolution's weight layout by the
thread count too, and a weight packed at 1 thread was reordered on every 16-thread call where
the layouts differ (3 of resnet50's 23 convolution shapes on an AVX-512 Xeon). The estimate at
T threads is the sum; the "cappers" are the lines that lose the most against perfect scaling
(estimate - t1 / T). torch.compile's C++ backend decides differently
(torch/_inductor/codegen/cpp.py `decide_parallel_depth`): it collapses outer loops until it has
>= 2T (or exactly T) chunks and stays serial where the work per thread would be below
`cpp.min_chunk_size` (512 elements): thread-count aware, where ember's threshold is 32768
element-steps (8192 where compiled for 8+ threads: schedule.static_threshold) and COLLAPSE_MIN
(64 chunks) is fixed. A nest inside serial loops (the row split's, inside a GroupNorm's rows)
counts once per their iterations. Each kernel's row says whether torch's
rule would give it threads at T.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_MODELS = ("tv/resnet50,tv/mobilenet_v2,hf/bert,hf/gpt2,timm/levit_128s,tv/swin_t,"
                  "tv/densenet121")
TORCH_MIN_CHUNK = 512  # torch.compile's cpp.min_chunk_size (elements per thread)

_FOR = re.compile(r"for \(int64_t (\w+) = (\w+); \1 < ([^;]+); ([^)]+)\)")
_RUN = re.compile(r"for \(int64_t (\w+) = \(?(\w+)\)? \* t / nt;")


@dataclass
class Nest:
    kind: str  # "for" (parallel for, collapsed loops), "region" (t / nt runs), "flash"
    chunks: int | None  # None: a trip count the source does not state (symbolic)
    trips: list[int | None] = field(default_factory=list)
    work: int = 0  # element-steps inside it


@dataclass
class Line:
    kind: str  # "kernel", "extern", "wrapper"
    name: str
    t1_ms: float
    chunks: int | None = None  # kernels: effective chunks (1 / the estimate's fraction)
    frac: float = 1.0  # kernels: the fraction of t1 left at --target threads
    nests: list[Nest] = field(default_factory=list)
    work: int = 0  # kernels: element-steps of its loops (as the source states them)
    torch_par: bool | None = None  # kernels: whether torch's rule would split it at --target
    est_ms: float = 0.0
    loss_ms: float = 0.0
    after: str = ""  # the kind of the line before (a line after an extern pays for its cold
    # caches: 20-100 us for a 64-float kernel after a convolution, on the 2-core EPYC)
    text: str = ""
    measured_ms: float | None = None  # --measure: the line at --target threads (wall)


def _int(s: str) -> int | None:
    s = s.strip().removesuffix("LL")
    return int(s) if s.isdigit() else None


def _trip(m: re.Match[str]) -> int | None:
    lo, hi = _int(m.group(2)), _int(m.group(3))
    return None if lo is None or hi is None else hi - lo


def _span(lines: list[str], k: int) -> list[str]:
    """The lines of the statement starting at line k (a loop or a block), braces matched."""
    depth, out = 0, []
    for line in lines[k:]:
        out.append(line)
        depth += line.count("{") - line.count("}")
        if depth <= 0 and "{" in "".join(out):
            break
    return out


def kernel_nests(src: str) -> list[Nest]:
    """The parallel nests of a C++ kernel's source (empty: it runs on one thread), each with
    its element-steps."""
    lines = src.splitlines()
    out: list[Nest] = []
    for k, line in enumerate(lines):
        s = line.strip()
        if not s.startswith("#pragma omp parallel"):
            continue
        body = _span(lines, k + 1)
        # a nest inside serial loops (the row split: a GroupNorm's rows) runs once per their
        # iterations: counted once, its share of the kernel's work was too small
        work = kernel_work("\n".join(body)) * _enclosing_trips(lines, k)
        if s.startswith("#pragma omp parallel for"):
            m = re.search(r"collapse\((\d+)\)", s)
            c = int(m.group(1)) if m else 1
            trips: list[int | None] = []
            for nxt in body:
                f = _FOR.search(nxt)
                if f is not None:
                    trips.append(_trip(f))
                    if len(trips) == c:
                        break
            known = [t for t in trips if t is not None]
            out.append(Nest("for", math.prod(known) if len(known) == len(trips) else None,
                            trips, work))
            continue
        # a region: its threads take runs of a loop (`x = N * t / nt`) or an `omp for` inside
        for nxt in body:
            r = _RUN.search(nxt)
            if r is not None:
                n = _int(r.group(2))
                out.append(Nest("region", n, [n], work))
                break
            if "#pragma omp for" in nxt:
                out.append(Nest("omp for", None, [], work))
                break
        else:
            out.append(Nest("region", None, [], work))
    return out


def _enclosing_trips(lines: list[str], k: int) -> int:
    """The product of the trip counts of the loops open at line k (a loop whose bounds the
    source does not state counts 1)."""
    stack: list[tuple[int, int]] = []  # (brace depth at the loop, trip)
    depth = 0
    for line in lines[:k]:
        f = _FOR.search(line)
        if f is not None:
            t = _trip(f)
            stack.append((depth, t if t is not None and t > 0 else 1))
        depth += line.count("{")
        for _ in range(line.count("}")):
            depth -= 1
            if stack and stack[-1][0] == depth:
                stack.pop()
    return math.prod(t for _, t in stack)


def kernel_work(src: str) -> int:
    """Element-steps of a kernel: the sum over its innermost loops of the product of the
    enclosing trip counts (a loop whose bounds the source does not state counts 1)."""
    stack: list[tuple[int, int]] = []  # (brace depth at the loop, trip)
    depth, work, leaf = 0, 0, False
    for line in src.splitlines():
        f = _FOR.search(line)
        if f is not None:
            t = _trip(f)
            stack.append((depth, t if t is not None and t > 0 else 1))
            leaf = True
        depth += line.count("{")
        for _ in range(line.count("}")):
            depth -= 1
            if stack and stack[-1][0] == depth:
                if leaf:
                    work += math.prod(t for _, t in stack)
                    leaf = False
                stack.pop()
    return work


def scale(nests: list[Nest], work: int, target: int) -> tuple[float, int]:
    """(the fraction of a kernel's 1-thread time left at `target` threads, its effective
    chunk count): each nest's share of the work (element-steps) at ceil(c / T) / c, the work
    outside every parallel nest serial. A nest whose chunk count the source does not state
    counts as scaling perfectly."""
    if not nests or work <= 0:
        return 1.0, 1
    par = sum(n.work for n in nests)
    frac = max(0, work - par) / work
    for n in nests:
        c = n.chunks
        frac += n.work / work * (1 / target if c is None else math.ceil(c / target) / c)
    return frac, round(1 / frac) if frac > 0 else target


def torch_parallel(work: int, target: int) -> bool:
    """Whether torch.compile's rule would run a kernel of `work` elements on threads."""
    return work // target >= TORCH_MIN_CHUNK


def estimate(line: Line, target: int) -> None:
    if line.kind == "kernel":
        line.est_ms = line.t1_ms * line.frac
    elif line.kind == "extern":
        line.est_ms = line.t1_ms / target
    else:
        line.est_ms = line.t1_ms
    line.loss_ms = line.est_ms - line.t1_ms / target


# ---- timing the wrapper's lines ---------------------------------------------------------------

_CALL = re.compile(r"^    (?:[\w, ]+ = )?(_c\d+)\(")
_REF = re.compile(r"(_c\d+)\(_interp\b")


def classify(stmt: str, ns: dict[str, Any], kernels: dict[str, str]) -> tuple[str, str]:
    """(kind, name) of one wrapper line."""
    m = _CALL.match(stmt)
    fn = ns.get(m.group(1)) if m else None
    sym = getattr(fn, "__name__", "") if fn is not None else ""
    if isinstance(sym, str) and sym.startswith("ember_k_") and sym[8:] in kernels:
        return "kernel", sym[8:]
    if fn is not None and callable(fn):
        return "extern", _callable_name(fn)
    ref = _REF.search(stmt)
    if ref is not None:  # an op's reference (ember's attention: its fused C++ kernel)
        return "extern", "reference " + _callable_name(ns.get(ref.group(1)))
    t = stmt.strip()
    sub = "check" if t.startswith(("if ", "_bad")) else "alloc" if ("_empty(" in t or "_out(" in t) \
        else "del" if t.startswith("del ") else "view" if ".reshape(" in t or "_strided(" in t \
        else "other"
    return "wrapper", sub


def _callable_name(fn: Any) -> str:
    mod = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", "") or ""
    if "<locals>" in qual and mod.startswith("ember."):  # a bound extern (packed conv, linear)
        return f"{mod.rsplit('.', 1)[-1]}.{qual.split('.')[0]}"
    if qual == "<lambda>":
        return f"{mod}.<lambda>"
    for attr in ("__qualname__", "__name__"):
        v = getattr(fn, attr, None)
        if isinstance(v, str) and v:
            return v
    return type(fn).__name__


_CONTINUED = ("else:", "elif ", "except", "finally:")  # a compound statement's later clauses


def instrument(source: str, ns: dict[str, Any]) -> tuple[Any, list[str]]:
    """The wrapper's `call` with each body statement timed into `_acc[k]`; the statements (a
    compound one, such as an `if` over the input checks, with its indented lines: one)."""
    body = source.splitlines()
    assert body[0].startswith("def call(")
    blocks: list[list[str]] = []
    ret: list[str] = []
    for s in body[1:]:
        if not s.strip():
            continue
        if s.startswith("    return "):
            ret.append(s)
        elif blocks and (s.startswith("     ") or s.lstrip().startswith(_CONTINUED)):
            blocks[-1].append(s)  # the body or the else of the statement before
        else:
            blocks.append([s])
    stmts = ["\n".join(b) for b in blocks]
    out = [body[0]]
    for k, b in enumerate(blocks):
        out += ["    _t0 = _tt()", *b, f"    _acc[{k}] += _tt() - _t0"]
    out += ret  # (the wrapper's one return, last)
    g = dict(ns)
    g["_tt"] = time.thread_time_ns
    g["_acc"] = [0] * len(stmts)
    code = compile("\n".join(out) + "\n", "<ember wrapper, per-line timed>", "exec")
    exec(code, g)  # the wrapper's own generated source plus timing lines (no outside text)
    return g, stmts


def instrument_whole(source: str, ns: dict[str, Any]) -> dict[str, Any]:
    """The wrapper's `call` timed as a whole into `_accw[0]` (two clock reads per call)."""
    body = source.splitlines()
    out = [body[0], "    _t0 = _tt()"]
    for s in body[1:]:
        if s.startswith("    return "):
            out += [f"    _r = {s[len('    return '):]}", "    _accw[0] += _tt() - _t0",
                    "    return _r"]
        elif s.strip():
            out.append(s)
    g = dict(ns)
    g["_tt"] = time.thread_time_ns
    g["_accw"] = [0]
    exec(compile("\n".join(out) + "\n", "<ember wrapper, timed>", "exec"), g)  # as above
    return g


def clock_overhead(clock: Any = time.thread_time_ns, n: int = 400, reps: int = 25) -> float:
    """Nanoseconds an instrumented line adds (its two clock reads): the median of `pass`."""
    g, _ = instrument("def call(inputs):\n" + "    pass\n" * n, {})
    g["_tt"] = clock
    per = []
    for _ in range(reps):
        g["_acc"][:] = [0] * n
        g["call"](None)
        per.append(statistics.median(g["_acc"]))
    return float(statistics.median(per))


# ---- one model --------------------------------------------------------------------------------


def _time_lines(compiled: Any, args: Any, seen: list[tuple[Any, Any]],
                timed: list[tuple[dict[str, Any], list[str]]], wholes: list[dict[str, Any]],
                reps: int, clock: Any, overhead_ns: float
                ) -> tuple[list[list[list[int]]], list[float], list[float]]:
    """Per graph and line the samples (ns, `clock`); the calls (ms); the runtime outside
    the wrappers (ms). Each repetition: one call with the wrappers timed as a whole, one
    with every line timed."""
    import torch
    for g in [*wholes, *(g for g, _ in timed)]:
        g["_tt"] = clock
    lines_t: list[list[list[int]]] = [[[] for _ in s] for _, s in timed]
    calls: list[float] = []
    outside: list[float] = []  # the call less its wrappers: the runtime's own per-call work
    acc = [0]
    for g in wholes:
        g["_accw"] = acc
    with torch.no_grad():
        for r in range(reps + 2):
            for g, _ in timed:
                g["_acc"][:] = [0] * len(g["_acc"])
            acc[0] = 0
            hooks = _swap(seen, [(g, []) for g in wholes])
            try:
                t = clock()
                compiled(*args)  # the real call, its wrappers timed as a whole
                whole = clock() - t
            finally:
                _unswap(hooks)
            hooks = _swap(seen, timed)
            try:
                compiled(*args)
            finally:
                _unswap(hooks)
            if r >= 2:
                calls.append(whole / 1e6)
                outside.append((whole - acc[0] - 2 * overhead_ns) / 1e6)
                for gi, (g, _) in enumerate(timed):
                    for k, v in enumerate(g["_acc"]):
                        lines_t[gi][k].append(v)
    return lines_t, calls, outside


def repack_at(compiled: Any, args: Any, threads: int) -> dict[int, int]:
    """Set `threads` (the caller restores the count) and make every packed weight at that count
    with two untimed calls, the packs of other counts dropped (targets/cpu/packed.py caches a
    pack per thread count: oneDNN's layout depends on it). Returns the cached packs per thread
    count after: all at `threads` unless a call packs outside the cache."""
    import torch

    from ember.inductor.targets.cpu import packed
    torch.set_num_threads(threads)
    packed._PACKS.clear()
    with torch.no_grad():
        for _ in range(2):
            compiled(*args)
    return packed.pack_threads()


def census(name: str, reps: int, target: int, overhead_ns: float,
           measure: bool = False, rt: bool = False) -> dict[str, Any]:
    import torch
    from zoo_models import BY_NAME, FULL

    import ember.inductor.backend as backend
    from ember.runtime.compile import compile as ember_compile
    seen: list[tuple[Any, Any]] = []
    orig = backend.generate

    def gen(module: Any, graph: Any = None, interp: Any = None) -> Any:
        w = orig(module, graph, interp)
        seen.append((module, w))
        return w
    backend.generate = gen
    # compiled for `target` threads (the schedule's row split and parallel threshold are
    # decided by the thread count when compiled), timed at one
    torch.set_num_threads(target)
    try:
        torch.manual_seed(0)
        fn, args = BY_NAME[name].build(FULL)
        with torch.no_grad():
            compiled = ember_compile(fn)
            for _ in range(3):  # a model may change on its first call (LeViT's bias cache):
                compiled(*args)  # every graph compiled is timed, the ones not called add 0
    finally:
        backend.generate = orig
        torch.set_num_threads(1)
    graphs = []
    timed: list[tuple[dict[str, Any], list[str]]] = []
    for module, w in seen:
        kernels = {k.name: k.source for k in module.kernels.values()}
        g, stmts = instrument(w.source, w.call.__globals__)
        timed.append((g, stmts))
        graphs.append((kernels, stmts, w.call.__globals__))
    wholes = [instrument_whole(w.source, w.call.__globals__) for _, w in seen]
    lines_t, calls, outside = _time_lines(compiled, args, seen, timed, wholes, reps,
                                          time.thread_time_ns, overhead_ns)
    measured = None
    packs: dict[int, int] | None = None
    if measure:  # the same lines at --target threads, by wall time
        from realtime import realtime
        try:
            packs = repack_at(compiled, args, target)  # (sets target threads)
            wall = clock_overhead(time.perf_counter_ns)
            with realtime(rt):  # (benchmarks/realtime.py: a shared machine's cores)
                measured = _time_lines(compiled, args, seen, timed, wholes, reps,
                                       time.perf_counter_ns, wall)
        finally:
            torch.set_num_threads(1)
    out: list[Line] = []
    for gi, (kernels, stmts, ns) in enumerate(graphs):
        for k, s in enumerate(stmts):
            kind, nm = classify(s, ns, kernels)
            t1 = max(0.0, statistics.median(lines_t[gi][k]) - overhead_ns) / 1e6
            line = Line(kind, nm, t1, after=out[-1].kind if k else "", text=s.strip()[:120])
            if measured is not None:
                line.measured_ms = max(0.0, statistics.median(measured[0][gi][k]) - wall) / 1e6
            if kind == "kernel":
                line.nests = kernel_nests(kernels[nm])
                line.work = kernel_work(kernels[nm])
                line.frac, line.chunks = scale(line.nests, line.work, target)
                line.torch_par = torch_parallel(line.work, target)
            estimate(line, target)
            out.append(line)
    # the runtime's work outside the wrappers (guards, flattening, outputs): serial
    out.append(Line("wrapper", "outside", statistics.median(outside), text="the call less its "
                    "generated wrappers (the runtime: guards, arguments, outputs)"))
    if measured is not None:
        out[-1].measured_ms = statistics.median(measured[2])
    estimate(out[-1], target)
    t1 = sum(x.t1_ms for x in out)
    est = sum(x.est_ms for x in out)
    by = {k: sum(x.t1_ms for x in out if x.kind == k) for k in ("kernel", "extern", "wrapper")}
    est_by = {k: sum(x.est_ms for x in out if x.kind == k) for k in by}
    return compact({"model": name, "call_ms": statistics.median(calls), "lines_t1_ms": t1,
            "measured_call_ms": statistics.median(measured[1]) if measured else None,
            # --measure: the packed weights cached when timing, per thread count made at
            "measured_packs": None if packs is None else {str(k): v for k, v in packs.items()},
            "clock_overhead_ns": overhead_ns,
            "est_ms": est, "speedup": t1 / est if est else None,
            "t1_by_kind_ms": by, "est_by_kind_ms": est_by,
            "lines": [asdict(x) for x in out]})


def compact(r: dict[str, Any], keep: int = 25) -> dict[str, Any]:
    """A model's result with its wrapper lines summed (`wrapper_summary`) and only the `keep`
    slowest listed: thousands of ~1 us lines a model would make the JSON megabytes."""
    wrap = [x for x in r["lines"] if x["kind"] == "wrapper" and x["name"] != "outside"]
    if "wrapper_summary" in r or not wrap:
        return r
    meas = [x.get("measured_ms") for x in wrap]
    top = {id(x) for x in sorted(wrap, key=lambda x: -x["t1_ms"])[:keep]}
    return {**r, "wrapper_summary": {
        "lines": len(wrap), "t1_ms": sum(x["t1_ms"] for x in wrap),
        "measured_ms": None if None in meas else sum(v for v in meas if v is not None)},
        "lines": [x for x in r["lines"] if x["kind"] != "wrapper" or x["name"] == "outside"
                  or id(x) in top]}


def _swap(seen: list[tuple[Any, Any]], timed: list[tuple[dict[str, Any], list[str]]]
          ) -> list[tuple[Any, Any]]:
    """Point each compiled graph's runner at the timed wrapper: the runner holds `w.call`;
    its globals' `call` is not what runs, so the function's code is swapped in place."""
    hooks = []
    for (_, w), (g, _) in zip(seen, timed, strict=True):
        hooks.append((w.call, w.call.__code__))
        w.call.__code__ = g["call"].__code__
        w.call.__globals__.update({k: g[k] for k in ("_tt", "_acc", "_accw") if k in g})
    return hooks


def _unswap(hooks: list[tuple[Any, Any]]) -> None:
    for f, code in hooks:
        f.__code__ = code


# ---- the report -------------------------------------------------------------------------------


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, text=True, capture_output=True,
                              check=True).stdout.strip()
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", str(HERE.parent /
                                                                            "packages"))
        return git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if dirty
                                                      else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def _packs_note(r: dict[str, Any], t: int) -> str:
    """--measure: how many packed weights the timed calls used, and at which thread count made."""
    packs = r.get("measured_packs")
    if packs is None:
        return ""
    n = sum(packs.values())
    if set(packs) <= {str(t)}:
        return f" Measured at {t}t on {n} packed weights, all made at {t} threads."
    return (f" WARNING: measured at {t}t on packed weights made at other thread counts "
            f"({packs}): oneDNN may reorder them on every call.")


def report(results: list[dict[str, Any]], meta: dict[str, Any], top: int) -> str:
    t = meta["target"]
    out = [f"# ember parallelism census at {t} threads: an ESTIMATE, not a measurement",
           "", f"Date: {meta['date']}. ember {meta['commit']}, torch {meta['torch']}, "
           f"{meta['machine']}."
           + (f" Compiled with PARALLEL_WORK = {meta['parallel_work']} (--parallel-work)."
              if meta.get("parallel_work") else ""), "",
           "Method (benchmarks/parallelism.py): each model compiled by ember and its generated "
           "wrapper timed line by line at 1 thread (thread CPU time, per-line medians of "
           f"{meta['reps']} calls). Estimate at {t} threads: a C++ kernel t1 * ceil(c/{t}) / c "
           f"for c static chunks (serial: c = 1), an extern (oneDNN/MKL/torch op/ember "
           f"attention) t1/{t} (ASSUMED to scale perfectly), wrapper lines serial "
           "(each line's time less its clock reads' cost). Loss = estimate - t1/threads. A "
           "line right after an extern pays for the caches the extern left (20-100 us for a "
           "64-float kernel after a convolution, measured on this 2-core machine): that shows "
           "up as serial time of small kernels and wrapper lines.", "",
           "| model | call ms (1t) | lines ms (1t) | kernels / externs / wrapper+outside ms (1t) | "
           f"est. ms at {t}t | est. speedup | kernels' share of est. | wrapper's share | "
           f"measured ms at {t}t (--measure, wall) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b, e = r["t1_by_kind_ms"], r["est_by_kind_ms"]
        out.append(f"| {r['model']} | {r['call_ms']:.2f} | {r['lines_t1_ms']:.2f} | "
                   f"{b['kernel']:.2f} / {b['extern']:.2f} / {b['wrapper']:.2f} | "
                   f"{r['est_ms']:.3f} | {r['speedup'] or 0:.1f}x | "
                   f"{e['kernel'] / max(r['est_ms'], 1e-9):.0%} | "
                   f"{e['wrapper'] / max(r['est_ms'], 1e-9):.0%} | "
                   f"{_ms(r.get('measured_call_ms'))} |")
    for r in results:
        ks = [x for x in r["lines"] if x["kind"] == "kernel"]
        serial = [x for x in ks if x["chunks"] == 1]
        few = [x for x in ks if 1 < x["chunks"] < 0.75 * t]
        ws = compact(r).get("wrapper_summary", {"lines": 0, "t1_ms": 0.0, "measured_ms": None})
        rest = [x for x in r["lines"] if x["name"] == "outside"]
        rows = [x for x in r["lines"] if x["kind"] != "wrapper"] + rest
        w1 = ws["t1_ms"]
        rows.append({"kind": "wrapper", "name": f"wrapper ({ws['lines']} lines)", "t1_ms": w1,
                     "chunks": 1, "nests": [], "work": 0, "torch_par": None,
                     "est_ms": w1, "loss_ms": w1 - w1 / t, "measured_ms": ws["measured_ms"]})
        out += ["", f"## {r['model']}", "",
                f"{len(ks)} C++ kernel calls ({sum(x['t1_ms'] for x in ks):.2f} ms at 1t): "
                f"{len(serial)} serial ({sum(x['t1_ms'] for x in serial):.3f} ms; torch's rule "
                f"would split {sum(1 for x in serial if x['torch_par'])} of them), "
                f"{len(few)} scaling < {0.75 * t:g}x ({sum(x['t1_ms'] for x in few):.3f} ms). "
                f"Wrapper lines {w1:.3f} ms serial ({ws['lines']} "
                f"lines, each less the {r['clock_overhead_ns']:.0f} ns its clock reads take); "
                f"the runtime outside the wrapper (`outside`: guards, arguments, outputs) "
                f"{sum(x['t1_ms'] for x in rest):.3f} ms serial." + _packs_note(r, t), "",
                f"Top {top} by loss at {t} threads (eff. x: the kernel's estimated speedup; "
                "nests: each parallel nest's chunk trip counts):", "",
                "| line | kind | t1 ms | share of 1t | eff. x | nests | work | torch splits | "
                f"est. ms | loss ms | measured ms at {t}t |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in sorted(rows, key=lambda x: -x["loss_ms"])[:top]:
            nests = "; ".join(f"{n['kind']} {n['trips']}" for n in x["nests"]) or "—"
            tp = x["torch_par"]
            out.append(f"| {x['name']} | {x['kind']} | {x['t1_ms']:.3f} | "
                       f"{x['t1_ms'] / r['lines_t1_ms']:.1%} | "
                       f"{x['chunks'] if x['kind'] == 'kernel' else '—'} | {nests} | "
                       f"{x['work'] or '—'} | {'—' if tp is None else tp} | "
                       f"{x['est_ms']:.3f} | {x['loss_ms']:.3f} | "
                       f"{_ms(x.get('measured_ms'))} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--target", type=int, default=16, help="the thread count estimated")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--tag", default="")
    ap.add_argument("--measure", action="store_true",
                    help="also time every line at --target threads (wall time): on a machine "
                         "with that many cores, the estimate against the measurement")
    ap.add_argument("--parallel-work", type=int, default=0,
                    help="an experiment: compile with this PARALLEL_WORK (element-steps from "
                         "which a kernel gets threads; torch.compile's rule at 16 threads is "
                         "8192) in place of cppkernel's")
    ap.add_argument("--realtime", action="store_true",
                    help="--measure's calls under SCHED_FIFO (benchmarks/realtime.py)")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    if a.parallel_work:  # both modules read it at schedule time
        import ember.inductor.targets.cpu.cppkernel as cppkernel
        import ember.inductor.targets.cpu.schedule as schedule
        cppkernel.PARALLEL_WORK = schedule.PARALLEL_WORK = a.parallel_work
    results = []
    overhead = clock_overhead()
    for name in a.models.split(","):
        r = census(name, a.reps, a.target, overhead, a.measure, a.realtime)
        print(f"[parallelism] {name}: 1t {r['lines_t1_ms']:.2f} ms -> est {r['est_ms']:.3f} "
              f"ms at {a.target}t", flush=True)
        results.append(r)
        write(a, results, torch.__version__)
    return 0


def write(a: argparse.Namespace, results: list[dict[str, Any]], torch_version: str) -> None:
    meta = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": _commit(), "torch": torch_version, "reps": a.reps,
            "target": a.target, "estimate": True, "parallel_work": a.parallel_work or None,
            "machine": f"{platform.processor() or platform.machine()}, "
                       f"{os.cpu_count()} cores (timed at 1 thread)"}
    stem = f"parallelism-{dt.date.today()}-{a.target}t" + (f"-{a.tag}" if a.tag else "")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "models": results}))
    (a.out / f"{stem}.md").write_text(report(results, meta, a.top))
    print(f"[parallelism] wrote {a.out / stem}.md/.json", flush=True)


if __name__ == "__main__":
    sys.exit(main())
