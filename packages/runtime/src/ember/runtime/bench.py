"""The benchmark harness (`benchmarks/run.py` holds the suites; `python3 dev.py bench` runs them).

A `Case` builds a callable and its inputs; `run_case` runs it under every `Contender` (eager, a
compiler) in one process: cold and warm compile times, then interleaved timed repetitions (round
robin over the contenders, the order rotating per repetition) with medians and quartiles, ember's
output checked against eager, and what each compiler actually did (graphs, kernels, fallbacks to
eager). `write_results` writes JSON, a markdown table and a bar chart with the machine, versions
and date. Numbers are measured, never asserted.

`interleaved` (with `calibrate` and `quartiles`) is the timed loop itself, shared with
benchmarks/zoo.py, training.py and dynamic.py (each passes its clock: wall or thread CPU time).
Also: `guard_cost` (`python -m ember.runtime.bench`), the cost of one generated guard check.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ember.runtime.compile import compile, compiled_function_of
from ember.runtime.explain import report_of

# ---- cases and contenders ----------------------------------------------------------------------


@dataclass
class Case:
    """One benchmark: `build()` returns (callable, args); the callable is what gets compiled."""

    name: str
    suite: str
    build: Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]
    what: str = ""
    rtol: float = 1e-4
    atol: float = 1e-4


@dataclass
class Contender:
    """A way to run a case. `make(fn)` returns the callable to time (eager: `fn` itself).
    `cold(dir)` points the contender's compile caches at the fresh directory `dir` and forgets
    what the process holds; `warm()` forgets the in-process state but keeps the disk caches (as
    a new process would); `describe(compiled)` says what the compiler did with it."""

    name: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    cold: Callable[[Path], None] | None = None
    warm: Callable[[], None] | None = None
    describe: Callable[[Any], dict[str, Any]] | None = None
    check: bool = False  # compare its output with eager's


def eager_contender() -> Contender:
    return Contender("eager", lambda fn: fn)


def _ember_cold(d: Path) -> None:
    from ember.inductor import cache
    os.environ["EMBER_CACHE_DIR"] = str(d)
    cache.forget_loaded()


def _ember_warm() -> None:
    from ember.inductor import cache
    cache.forget_loaded()


_COMPILED = re.compile(r"compiled it to (\d+) C\+\+ kernel\(s\), (\d+) extern call\(s\)"
                       r"(?:; run by the reference interpreter: (.*))?")


def ember_status(compiled: Any) -> dict[str, Any]:
    """What ember did: graphs, C++ kernels, extern calls, ops left to the reference
    interpreter, graphs the eager backend ran and fallbacks to eager (with reasons), and a
    one-line `status` for the table."""
    cf = compiled_function_of(compiled)
    if cf is None:
        return {"status": "not an ember-compiled callable"}
    rep = report_of(cf.history)
    kernels = externs = 0
    reference: list[str] = []
    eager_graphs: list[str] = []
    for note in rep.notes:
        m = _COMPILED.search(note)
        if m:
            kernels += int(m.group(1))
            externs += int(m.group(2))
            if m.group(3):
                reference.append(m.group(3))
        elif "the eager backend ran it" in note:
            eager_graphs.append(note)
    fallbacks = [str(f) for f in rep.fallbacks]
    breaks = [str(b) for b in getattr(cf.history, "breaks", [])]
    compiled_graphs = rep.graph_count - len(eager_graphs)
    if rep.graph_count == 0:
        status = "FALLBACK to eager: " + (rep.fallbacks[0].reason if rep.fallbacks
                                          else "nothing captured")
    else:
        status = f"{compiled_graphs}/{rep.graph_count} graph(s) compiled, {kernels} kernel(s)"
        if externs:
            status += f", {externs} extern"
        if eager_graphs:
            status += f"; {len(eager_graphs)} graph(s) run by eager"
        if reference:
            status += "; some ops on the reference interpreter"
        if breaks:
            status += f"; {len(breaks)} graph break(s)"
        if fallbacks:
            status += f"; {len(fallbacks)} fallback(s) to eager"
    return {"status": status, "graphs": rep.graph_count, "compiled_graphs": compiled_graphs,
            "breaks": breaks,
            "kernels": kernels, "externs": externs, "reference": reference,
            "eager_graphs": eager_graphs, "fallbacks": fallbacks, "notes": list(rep.notes)}


def ember_contender(backend: str = "inductor") -> Contender:
    return Contender("ember", lambda fn: compile(fn, backend=backend), _ember_cold, _ember_warm,
                     ember_status, check=True)


# ---- measuring ---------------------------------------------------------------------------------


@dataclass
class Timing:
    median_ms: float
    q1_ms: float
    q3_ms: float
    samples: int
    cold_compile_s: float | None = None  # first call with empty caches (compile + one run)
    warm_compile_s: float | None = None  # first call of a new compiled object, caches kept
    check: str | None = None  # "ok", or the mismatch against eager
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms


@dataclass
class CaseResult:
    name: str
    suite: str
    what: str
    timings: dict[str, Timing] = field(default_factory=dict)
    error: dict[str, str] = field(default_factory=dict)  # contender -> why it did not run

    def speedup(self, who: str, base: str = "eager") -> float | None:
        a, b = self.timings.get(base), self.timings.get(who)
        if a is None or b is None or b.median_ms <= 0:
            return None
        return a.median_ms / b.median_ms


class Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, else one line per
    case)."""

    def __init__(self, total: int, stream: Any = None):
        self.total, self.done, self.stream = max(total, 1), 0, stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()

    def show(self, text: str, final: bool = False) -> None:
        frac = self.done / self.total
        bar = "#" * int(frac * 24)
        line = (f"[bench] [{bar:<24}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.start:5.0f}s  {text}")
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150) + ("\n" if final else ""))
        elif final:
            self.stream.write(line + "\n")
        self.stream.flush()

    def step(self, text: str) -> None:
        self.done += 1
        self.show(text, final=not self.tty)


@contextlib.contextmanager
def caches_kept() -> Iterator[None]:
    """EMBER_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR back as they were after the block (the cold
    compiles point them at temporary directories, removed after)."""
    saved = {k: os.environ.get(k) for k in ("EMBER_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _outputs(x: Any) -> Any:
    """The tensors to compare: an HF model output's logits (or last hidden state)."""
    for attr in ("logits", "last_hidden_state"):
        if hasattr(x, attr) and isinstance(getattr(x, attr), torch.Tensor):
            return getattr(x, attr)
    return x


def _compare(got: Any, want: Any, case: Case) -> str:
    try:
        torch.testing.assert_close(_outputs(got), _outputs(want), rtol=case.rtol, atol=case.atol)
    except (AssertionError, TypeError, ValueError) as e:
        return "MISMATCH: " + " ".join(str(e).split())[:300]
    return "ok"


def _first_call(make: Callable[[], Callable[..., Any]], args: tuple[Any, ...]
                ) -> tuple[Callable[..., Any], Any, float]:
    t = time.perf_counter()
    fn = make()
    out = fn(*args)
    return fn, out, time.perf_counter() - t


def run_case(case: Case, contenders: Sequence[Contender], reps: int = 20, warmup: int = 2,
             min_sample_s: float = 0.005, progress: Progress | None = None) -> CaseResult:
    """Compile (cold, then warm) and time `case` under each contender, interleaved."""
    res = CaseResult(case.name, case.suite, case.what)
    with torch.no_grad(), caches_kept():
        fn, args = case.build()
        want = fn(*args)
        runs: dict[str, Callable[..., Any]] = {}
        extra: dict[str, dict[str, Any]] = {}
        for c in contenders:
            if progress:
                progress.show(f"{case.name}: compiling with {c.name}")
            tmp = Path(tempfile.mkdtemp(prefix=f"ember-bench-{c.name}-"))
            try:
                if c.cold:
                    c.cold(tmp)
                compiled, got, cold_s = _first_call(lambda c=c: c.make(fn), args)  # type: ignore[misc]
                info: dict[str, Any] = {"cold_compile_s": cold_s if c.cold else None}
                if c.warm:
                    c.warm()
                    _, _, info["warm_compile_s"] = _first_call(lambda c=c: c.make(fn), args)  # type: ignore[misc]
                if c.check:
                    info["check"] = _compare(got, want, case)
                if c.describe:
                    info["info"] = c.describe(compiled)
            except Exception as e:  # a contender that cannot run the case is reported, not fatal
                res.error[c.name] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                continue
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            runs[c.name], extra[c.name] = compiled, info
        for f in runs.values():
            for _ in range(warmup):
                f(*args)
        number = calibrate(runs.get("eager") or next(iter(runs.values())), args, min_sample_s)
        samples = interleaved(
            runs, args, reps, number=number,
            on_rep=(lambda r: progress.show(f"{case.name}: repetition {r + 1}/{reps}"))
            if progress else None)
    for n, s in samples.items():
        med, q1, q3 = quartiles(s)
        res.timings[n] = Timing(med, q1, q3, len(s) * number, **extra[n])
    if progress:
        progress.step(f"{case.name} done")
    return res


def calibrate(f: Callable[..., Any], args: tuple[Any, ...], min_sample_s: float,
              clock: Callable[[], float] = time.perf_counter) -> int:
    """Calls per sample, so that one sample takes at least `min_sample_s` (tiny calls), by
    `clock` (seconds: `time.perf_counter`, or `time.thread_time` on a loaded machine)."""
    t = clock()
    f(*args)
    once = max(clock() - t, 1e-7)
    return max(1, min(10_000, math.ceil(min_sample_s / once)))


def interleaved(runs: Mapping[str, Callable[..., Any]], args: tuple[Any, ...], reps: int, *,
                number: int = 1, clock: Callable[[], float] = time.perf_counter,
                sync: Callable[[], object] | None = None,
                on_rep: Callable[[int], object] | None = None) -> dict[str, list[float]]:
    """Milliseconds per call of each of `runs` (called with `args`): `reps` samples each, taken
    round robin with the order rotating by one every repetition (so no contender always runs
    right after the same other one), a sample being `number` back-to-back calls timed by
    `clock` (divided by `number`). `sync` (e.g. `torch.cuda.synchronize`) runs inside each
    sample, after its calls; `on_rep(r)` after repetition r (progress)."""
    samples: dict[str, list[float]] = {n: [] for n in runs}
    names = list(runs)
    for r in range(reps):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            f = runs[n]
            t = clock()
            for _ in range(number):
                f(*args)
            if sync is not None:
                sync()
            samples[n].append((clock() - t) / number * 1e3)
        if on_rep is not None:
            on_rep(r)
    return samples


def quartiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of `samples` (all three the sample if one)."""
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return statistics.median(samples), q[0], q[2]


# ---- the machine and the versions --------------------------------------------------------------


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (out.stdout.strip().splitlines() or ["unknown"])[0]


def machine_info() -> dict[str, Any]:
    cpu, mem_gb = platform.processor() or platform.machine(), None
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
            mem_gb = round(kb / 2**20, 1)
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": mem_gb,
            "os": f"{platform.system()} {platform.release()}", "threads": torch.get_num_threads()}


def versions(root: Path) -> dict[str, str]:
    commit = _first_line(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
    dirty = _first_line(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    return {"ember": commit + (" (with uncommitted changes)" if dirty not in ("", "unknown")
                               else ""),
            "torch": torch.__version__, "python": platform.python_version(),
            "g++": _first_line([os.environ.get("EMBER_CXX", "g++"), "--version"])}


# ---- writing results ---------------------------------------------------------------------------


def geomean(xs: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def geomeans(results: Sequence[CaseResult], who: Sequence[str]) -> dict[str, float | None]:
    """Per contender, the geomean speedup over eager on the cases every contender ran."""
    common = [r for r in results if all(r.speedup(w) is not None for w in who)]
    return {w: geomean([r.speedup(w) or 1.0 for r in common]) for w in who}


def _ms(t: Timing | None) -> str:
    if t is None:
        return "—"
    digits = 3 if t.median_ms < 1 else 2 if t.median_ms < 10 else 1
    return f"{t.median_ms:.{digits}f} ±{t.iqr_ms / 2:.{digits}f}"


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def markdown(results: Sequence[CaseResult], meta: dict[str, Any], who: Sequence[str]
             ) -> str:
    """The results table: medians (± half the interquartile range), speedups over eager, cold
    and warm compile seconds, ember's check against eager and what it compiled."""
    m, v = meta["machine"], meta["versions"]
    out = [f"# ember benchmarks, {meta['date']}", "",
           f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; "
           f"{m['threads']} torch threads; {m['os']}.  ",
           f"Versions: ember {v['ember']}, torch {v['torch']}, Python {v['python']}, "
           f"{v['g++']}.  ",
           f"Method: {meta['method']}", ""]
    g = geomeans(results, [w for w in who if w != "eager"])
    out.append("Geomean speedup over eager: " + ", ".join(
        f"{w} {x:.2f}×" if x else f"{w} —" for w, x in g.items()) + "")
    out.append("")
    comp = [w for w in who if w != "eager"]
    head = ["case", "eager ms"] + [f"{w} ms" for w in comp] + [f"{w} ×" for w in comp] \
        + [f"{w} compile s (cold / warm)" for w in comp] + ["ember check", "what ember did"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        tm = r.timings
        em = tm.get("ember")
        cells = [r.name, _ms(tm.get("eager"))] + [_ms(tm.get(w)) for w in comp]
        for w in comp:
            sp = r.speedup(w)
            cells.append("—" if sp is None else f"{sp:.2f}×")
        for w in comp:
            t = tm.get(w)
            cells.append("—" if t is None else f"{_s(t.cold_compile_s)} / {_s(t.warm_compile_s)}")
        cells.append(em.check or "—" if em else "not run")
        status = em.info.get("status", "") if em else ""
        errs = "; ".join(f"{k} FAILED: {e}" for k, e in r.error.items())
        cells.append("; ".join(x for x in (status, errs) if x) or "—")
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    out += ["", "Cases:", ""] + [f"- **{r.name}** ({r.suite}): {r.what}" for r in results]
    for r in results:
        em = r.timings.get("ember")
        why = [] if em is None else [*em.info.get("fallbacks", []), *em.info.get("breaks", []),
                                     *em.info.get("eager_graphs", []),
                                     *em.info.get("reference", [])]
        if why:
            out.append(f"\nember on {r.name}: " + "; ".join(why))
    return "\n".join(out) + "\n"


def chart(results: Sequence[CaseResult], who: Sequence[str], path: Path, title: str) -> None:
    """Bar chart of each compiler's speedup over eager per case (log scale; 1 = eager)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comp = [w for w in who if w != "eager"]
    names = [r.name for r in results]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) + 2), 4.2))
    width = 0.8 / max(len(comp), 1)
    for i, w in enumerate(comp):
        ys = [r.speedup(w) or 0.0 for r in results]
        xs = [j + (i - (len(comp) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, ys, width, label=w)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speedup over eager (×, log)")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(results: Sequence[CaseResult], meta: dict[str, Any], who: Sequence[str],
                  outdir: Path, stem: str, latest: bool = True, extra: str = "") -> list[Path]:
    """`<stem>.json`, `<stem>.md` and `<stem>.png` in `outdir` (and copies as latest.*);
    `extra` (markdown) is appended to the table."""
    outdir.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "geomean_speedup": geomeans(results, [w for w in who if w != "eager"]),
            "cases": [asdict(r) for r in results]}
    paths = [outdir / f"{stem}.json", outdir / f"{stem}.md", outdir / f"{stem}.png"]
    paths[0].write_text(json.dumps(data, indent=1) + "\n")
    paths[1].write_text(markdown(results, meta, who) + extra
                        + f"\n![speedup over eager]({paths[2].name})\n")
    chart(results, who, paths[2], f"{meta['machine']['cpu']}, {meta['machine']['threads']} "
          f"threads, {meta['date']}")
    if latest:
        for p in paths:
            dst = outdir / f"latest{p.suffix}"
            text = p.read_bytes()
            if p.suffix == ".md":
                text = text.replace(f"({paths[2].name})".encode(), b"(latest.png)")
            dst.write_bytes(text)
    return paths


def run_meta(root: Path, method: str) -> dict[str, Any]:
    return {"date": f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC", "machine": machine_info(),
            "versions": versions(root), "method": method}


# ---- guard checks ------------------------------------------------------------------------------


@dataclass
class GuardCost:
    layers: int
    inputs: int
    guards: int
    guard_us: float  # one call of the generated guard function
    per_guard_us: float


def guard_cost(layers: int = 5, width: int = 8, number: int = 2000, repeat: int = 9
               ) -> GuardCost:
    """The time of one call of the generated guard function of an MLP of `layers` layers."""
    m = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    c = compile(m, backend="eager")
    x = torch.randn(2, width)
    c(x)
    entry = c.compiled.entries[0]
    guard = entry.code.guard
    args: tuple[torch.Tensor, ...] = (x,)
    kwargs: dict[str, object] = {}
    assert isinstance(guard(m, args, kwargs), list)
    best = min(timeit.repeat(lambda: guard(m, args, kwargs), number=number, repeat=repeat))
    us = best / number * 1e6
    n = len(entry.code.guards)
    return GuardCost(layers, 2 * layers + 1, n, us, us / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="*", default=[1, 5, 20])
    a = ap.parse_args()
    for n in a.layers:
        r = guard_cost(n)
        print(f"mlp x{r.layers}: {r.inputs} graph inputs, {r.guards} guards, "
              f"{r.guard_us:.2f} us per check ({r.per_guard_us:.3f} us per guard)")


if __name__ == "__main__":
    main()
