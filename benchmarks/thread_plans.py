"""The CPU schedule's thread-count rules and memory-order reductions: A/B in one process.

Run from the repository root (zoo libraries on PYTHONPATH, as for zoo.py):

    PYTHONPATH=/tmp/h5/libs HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/thread_plans.py \
        --models timm/poolformer_s12,timm/levit_128s --reps 30

Per model (zoo FULL sizes, eval, no_grad), one compilation per variant while the process runs
at --threads threads (the count kernels are compiled for):
- "old": the rules before them, by replacing the private decisions while it compiles: no row
  split (`schedule._row_split_pays`), the static threshold 32768 at every thread count
  (`schedule.static_threshold`), reduced loops in their own order (`cppkernel._red_loops`);
- "mem": only the memory-order reductions (the thread-count rules as "old");
- "new": as shipped.
Each repetition calls the variants once, the order rotated every repetition, each call timed
alone: thread CPU time (one thread, a shared machine) or wall (--clock wall: many threads on a
dedicated machine). Printed: medians, median paired difference to "old", minima, and the
kernels each variant compiled with a row split / a parallel pragma. Outputs are checked equal
(to 1e-4) first. At one or two threads "mem" is "new" (the thread rules need 4+ / 8+ threads).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parent / "device_queue")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextmanager
def rules(variant: str) -> Iterator[None]:
    """The decisions of `variant` in force while compiling (private functions replaced, then
    restored)."""
    import ember.inductor.targets.cpu.cppkernel as ck
    import ember.inductor.targets.cpu.schedule as sch

    saved = (sch._row_split_pays, sch.static_threshold, ck._red_loops)

    def own_order(g: Any, red: Any) -> tuple[list[int], list[int]]:
        return list(range(len(red) - 1)), [len(red) - 1]
    if variant in ("old", "mem"):
        sch._row_split_pays = lambda *a: False  # type: ignore[assignment]
        sch.static_threshold = lambda threads: sch.PARALLEL_WORK  # type: ignore[assignment]
    if variant == "old":
        ck._red_loops = own_order  # type: ignore[assignment]
    try:
        yield
    finally:
        sch._row_split_pays, sch.static_threshold, ck._red_loops = saved  # type: ignore[assignment]


def census(seen: list[tuple[Any, ...]]) -> tuple[int, int]:
    """(kernels with a row split or split reduction, kernels with an OpenMP pragma)."""
    srcs = [k.source for m, *_ in seen for k in m.kernels.values()]
    return (sum("* t / nt" in s for s in srcs),
            sum("#pragma omp parallel" in s for s in srcs))


def main() -> None:
    import dq

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="timm/poolformer_s12,timm/levit_128s")
    ap.add_argument("--variants", default="old,mem,new")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time_ns if a.clock == "thread" else time.perf_counter_ns
    names = a.variants.split(",")
    for model in a.models.split(","):
        built: dict[str, tuple[Any, Any, list[tuple[Any, ...]]]] = {}
        for v in names:
            with rules(v):
                built[v] = dq.compile_capturing(model)
        fns: dict[str, Callable[[], Any]] = {}
        with torch.no_grad():
            outs = {v: f(*args) for v, (f, args, _) in built.items()}
            for v in names[1:]:
                torch.testing.assert_close(outs[v], outs[names[0]], rtol=1e-4, atol=1e-4)
            for v, (f, args, _) in built.items():
                fns[v] = lambda f=f, args=args: f(*args)
            times = dq.interleaved(fns, a.reps, warm=2, clock=clock)
        ms = {v: [t / 1e6 for t in ts] for v, ts in times.items()}
        base = names[0]
        parts = []
        for v in names:
            med = statistics.median(ms[v])
            diff = statistics.median(x - y for x, y in zip(ms[base], ms[v], strict=True))
            split, par = census(built[v][2])
            parts.append(f"{v} {med:.3f} ms (min {min(ms[v]):.3f}, paired {base} - {v} "
                         f"{diff * 1e3:+.0f} us; kernels split {split}, parallel {par})")
        print(f"{model}: " + "; ".join(parts) + f" [reps {a.reps}, {a.threads} threads, "
              f"{a.clock} time]", flush=True)


if __name__ == "__main__":
    main()
