"""Kernel calls on parameters alone kept between calls (inductor/paramcache.py): A/B at 1 thread.

Run from the repository root (zoo libraries on PYTHONPATH, as for zoo.py):

    PYTHONPATH=/tmp/h5/libs HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/param_cache.py \
        --models timm/levit_128s,tv/mobilenet_v2,tv/resnet50 --reps 30

Per model (zoo FULL sizes, eval, no_grad), two compilations in one process: one with
EMBER_PARAM_CACHE=0 when its wrappers are generated ("off"), one with the cache ("on"). Each
repetition calls them in alternating order (off, on / on, off), each call timed alone, in
thread CPU time at one thread (or --threads N --clock wall: a dedicated many-core machine).
Printed: the medians, the median of the repetitions' differences (off - on), the minima, and
the C++ kernel calls a forward makes in each (the kernel lines of the wrappers, less those
whose cache entry holds results after the warm-up calls).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_LAUNCH = re.compile(r"^\s+(_c\d+)\(.*data_ptr\(\)")


def kernel_calls(wrappers: list[Any]) -> tuple[int, int]:
    """(kernel calls a forward makes, of those skipped on a cache hit)."""
    calls = skipped = 0
    for source, ns in wrappers:
        for line in source.splitlines():
            m = _LAUNCH.match(line)
            if m and getattr(ns.get(m.group(1)), "__name__", "").startswith("ember_k_"):
                calls += 1
            s = re.search(r"(_c\d+)\[0\] = _store", line)
            if s and ns[s.group(1)][0][0] is not None:  # an entry holding results
                skipped += 1
    return calls, skipped


def build(name: str, cache: bool) -> tuple[Any, tuple[Any, ...], list[Any]]:
    from zoo_models import BY_NAME, FULL

    import ember.inductor.backend as backend
    from ember.runtime.compile import compile as ember_compile
    seen: list[Any] = []
    orig = backend.generate

    def gen(module: Any, graph: Any = None, interp: Any = None) -> Any:
        w = orig(module, graph, interp)
        seen.append(w)
        return w
    os.environ["EMBER_PARAM_CACHE"] = "1" if cache else "0"
    backend.generate = gen
    try:
        torch.manual_seed(0)
        fn, args = BY_NAME[name].build(FULL)
        compiled = ember_compile(fn)
        with torch.no_grad():
            for _ in range(3):
                compiled(*args)
    finally:
        backend.generate = orig
        os.environ.pop("EMBER_PARAM_CACHE", None)
    return compiled, args, [(w.source, w.call.__globals__) for w in seen]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="timm/levit_128s,tv/mobilenet_v2,tv/resnet50")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread",
                    help="thread CPU time (1 thread, a shared machine) or wall (many threads)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time_ns if a.clock == "thread" else time.perf_counter_ns
    for name in a.models.split(","):
        fns = {k: build(name, k == "on") for k in ("off", "on")}
        times: dict[str, list[float]] = {k: [] for k in fns}
        with torch.no_grad():
            outs = {k: f(*args) for k, (f, args, _) in fns.items()}
            torch.testing.assert_close(outs["on"], outs["off"])
            for r in range(a.reps):
                for k in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    f, args, _ = fns[k]
                    t = clock()
                    f(*args)
                    times[k].append((clock() - t) / 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        diff = statistics.median(a - b for a, b in zip(times["off"], times["on"], strict=True))
        kc = {k: kernel_calls(w) for k, (_, _, w) in fns.items()}
        print(f"{name}: off {med['off']:.3f} ms, on {med['on']:.3f} ms "
              f"({med['off'] / med['on']:.3f}x; paired off - on {diff * 1e3:+.0f} us; "
              f"min off {low['off']:.3f}, on {low['on']:.3f}); "
              f"kernel calls a forward off {kc['off'][0] - kc['off'][1]}, "
              f"on {kc['on'][0] - kc['on'][1]} (reps {a.reps}, {a.threads} threads, {a.clock} "
              f"time)",
              flush=True)


if __name__ == "__main__":
    main()
