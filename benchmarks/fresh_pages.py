"""Fresh pages per call (issue 18, session 13): do ember's warm calls fault in new memory?

A buffer that glibc serves with new mmap'd pages is faulted in page by page on first write and
unmapped when freed (at 16 threads, a TLB shootdown on every core that touched it). glibc mmaps
a request at or above its mmap threshold, which it raises to the largest mmap'd chunk freed so
far (up to 32 MB), and it gives the heap's free top back to the system above twice that
(trimming): which calls pay depends on the process's allocation history. This script measures
it the way the zoo runs: per model, eager and the compiled functions called round robin (the
order rotating), each call's minor page faults (`getrusage(RUSAGE_SELF).ru_minflt`: every
thread's, OpenMP workers' too) and its time (thread CPU time at 1 thread, wall with
--clock wall); and, once per compiled function, its new storages of >= 1 MB per call by the
aten op that made them (oneDNN's convolution outputs, ember's own kernel outputs).

`--lines N` then calls ember's wrappers N more times with each line's page faults counted
(the census's per-line timing, parallelism.instrument, with ru_minflt as its clock; eager
called before each call, as in the rotation). A page faults where it is first written: on a
convolution line, oneDNN's fresh output; on a kernel call line (`_cNNN(v.data_ptr(), ...)`),
a buffer of ember's own that `_empty` allocated (all a cross-call buffer pool could serve).
`--malloc keep` first sets glibc's mmap threshold to its maximum and its trim threshold to
1 GB (mallopt through ctypes; process-global, so it changes eager and torch.compile too): no
buffer under 32 MB is then mmap'd or given back, so a run with it against one without bounds
what any allocation change can gain; `--malloc both` times every model as glibc is, then
sets it and times them all again (the same compiled functions; the phases are sequential,
not interleaved: the setting cannot be undone, eager is the control). Run with the zoo
libraries importable:

    PYTHONPATH=/tmp/h5/libs HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python \\
        benchmarks/fresh_pages.py --models tv/resnet50,tv/mobilenet_v2 --threads 1
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import resource
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from parallelism import _swap, _unswap, instrument  # noqa: E402
from zoo_models import FULL  # noqa: E402
from zoo_worker import model_named  # noqa: E402  (sets HF offline, .devlibs)

import ember.inductor  # noqa: E402, F401  (registers the CPU target)
from ember.runtime.compile import compile as ember_compile  # noqa: E402

BIG = 1 << 20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory() -> bool:
    """glibc: never mmap a request under 32 MB, never trim the heap below 1 GB free."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)) and \
        bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))


def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class _Storages(TorchDispatchMode):
    """New storages of >= 1 MB (results stored in none of their operands), by op."""

    def __init__(self) -> None:
        super().__init__()
        self.made: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        ins = {_ptr(a) for a in [*args, *(kwargs or {}).values()]}
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (list, tuple)) else [out]:
            p = _ptr(o)
            if p is not None and p not in ins and o.untyped_storage().nbytes() >= BIG:
                self.made[str(func)] += 1
        return out


def _ptr(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.is_mkldnn or t.layout != torch.strided:
        return None
    return int(t.untyped_storage().data_ptr())


@dataclass
class Contenders:
    """One model's eager function, its compiled ones, its inputs, and ember's wrappers."""
    name: str
    fs: dict[str, Any]
    args: Any
    wrappers: list[Any] = field(default_factory=list)  # ember's generated wrappers


def build(name: str, compilers: list[str]) -> Contenders:
    """The model and its compiled functions, each called 3 times (compiled, warm)."""
    import ember.inductor.backend as backend
    m = model_named(name)
    assert m is not None, name
    fn, args = m.build(FULL)
    if isinstance(fn, torch.nn.Module):
        fn.eval()
    c = Contenders(name, {"eager": fn}, args)
    orig = backend.generate

    def gen(module: Any, graph: Any = None, interp: Any = None) -> Any:
        w = orig(module, graph, interp)
        c.wrappers.append(w)
        return w
    backend.generate = gen  # (the census's hook: parallelism.py)
    try:
        for k in compilers:
            c.fs[k] = ember_compile(fn) if k == "ember" else torch.compile(fn)
        with torch.no_grad():
            for f in c.fs.values():
                for _ in range(3):
                    f(*args)
    finally:
        backend.generate = orig
    return c


def storages(c: Contenders) -> dict[str, int]:
    """ember's new storages of >= 1 MB in one call, by the aten op that made them."""
    with torch.no_grad(), _Storages() as s:
        c.fs["ember"](*c.args)
    return dict(s.made)


def line_faults(c: Contenders, reps: int, top: int = 8) -> list[tuple[float, str]]:
    """ember's wrapper lines by their page faults per call (the census's per-line timing
    with ru_minflt as its clock), eager called before each call as in the rotation."""
    timed = [instrument(w.source, w.call.__globals__) for w in c.wrappers]
    for g, _ in timed:
        g["_tt"] = minflt
    seen = [(None, w) for w in c.wrappers]
    total: dict[str, float] = {}
    with torch.no_grad():
        for _ in range(reps):
            c.fs["eager"](*c.args)
            for g, _ in timed:
                g["_acc"][:] = [0] * len(g["_acc"])
            hooks = _swap(seen, timed)
            try:
                c.fs["ember"](*c.args)
            finally:
                _unswap(hooks)
            for g, stmts in timed:
                for k, v in enumerate(g["_acc"]):
                    if v:
                        total[stmts[k].strip()] = total.get(stmts[k].strip(), 0) + v / reps
    return sorted(((v, s[:120]) for s, v in total.items()), reverse=True)[:top]


def rotation(c: Contenders, reps: int, wall: bool) -> dict[str, Any]:
    """Each contender called `reps` times round robin (the order rotating every rep): its
    page faults and ms per call."""
    clock = time.perf_counter_ns if wall else time.thread_time_ns
    keys = list(c.fs)
    faults: dict[str, list[int]] = {k: [] for k in keys}
    ms: dict[str, list[float]] = {k: [] for k in keys}
    with torch.no_grad():
        for rep in range(reps):
            for k in keys[rep % len(keys):] + keys[:rep % len(keys)]:
                a, t = minflt(), clock()
                c.fs[k](*c.args)
                ms[k].append((clock() - t) / 1e6)
                faults[k].append(minflt() - a)
    return {"faults": faults, "ms": ms}


def _summary(c: Contenders, r: dict[str, Any], phase: str, a: argparse.Namespace) -> str:
    parts = [f"{k} {statistics.median(r['ms'][k]):.2f} ms "
             f"{statistics.median(r['faults'][k]):.0f} faults (mean "
             f"{statistics.mean(r['faults'][k]):.0f})" for k in r["ms"]]
    return (f"{c.name} ({a.threads} threads, malloc {phase}, {a.clock} time, median of "
            f"{a.reps}, round robin): " + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tv/resnet50,tv/mobilenet_v2")
    ap.add_argument("--compilers", default="ember", help="ember and/or torch.compile")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread")
    ap.add_argument("--malloc", choices=["default", "keep", "both"], default="default",
                    help="both: every model in the default phase, then mallopt, then again")
    ap.add_argument("--lines", type=int, default=0,
                    help="this many calls of ember's wrappers with per-line page faults")
    ap.add_argument("--json", default="", help="write the samples here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    phases = ["default", "keep"] if a.malloc == "both" else [a.malloc]
    if phases == ["keep"]:
        assert keep_freed_memory()
    models = [build(name, a.compilers.split(",")) for name in a.models.split(",")]
    rows: list[dict[str, Any]] = []
    for phase in phases:
        if phase == "keep" and phases[0] == "default":
            assert keep_freed_memory()
            for c in models:  # (warm again under the new setting)
                rotation(c, 2, a.clock == "wall")
        for c in models:
            r = rotation(c, a.reps, a.clock == "wall")
            r.update(model=c.name, threads=a.threads, malloc=phase, clock=a.clock)
            rows.append(r)
            print(_summary(c, r, phase, a), flush=True)
            if phase == phases[0] and "ember" in c.fs:
                made = storages(c)
                r["storages"] = made
                print(f"  ember: new storages >= 1 MB a call: {sum(made.values())}: "
                      + ", ".join(f"{n} {op}" for op, n in
                                  sorted(made.items(), key=lambda x: -x[1])), flush=True)
                if a.lines:
                    r["lines"] = line_faults(c, a.lines)
                    for v, s in r["lines"]:
                        print(f"    {v:8.0f} faults/call  {s}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
