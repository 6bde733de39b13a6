"""Linears sharing one input as one product (`group-linears`, targets/cpu/group_linear.py): A/B.

Run from the repository root (zoo libraries on PYTHONPATH, as for zoo.py):

    PYTHONPATH=/tmp/h5/libs HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/group_linears.py \
        --models hf/bert,hf/t5-encoder,hf/llama,hf/mistral --reps 40

Per model (zoo FULL sizes, eval, no_grad), up to three compilations in one process, each of
its own copy of the model (same seed): "off" with the `inductor` pipeline less `group-linears`
(the `pipeline` option), "on" as shipped (at the thread count of --threads), "all" grouping
the linears an extern reads at any thread count (`extern_threads=1`), "kernels" at none (as
at 1-2 threads); checks they agree (and
each against eager). Each repetition calls them round robin, the order rotated each time,
each call timed alone, in thread CPU time at one thread (or --threads N --clock wall: a
dedicated many-core machine). Printed per variant: the median, the minimum, the linear calls
a forward makes, and against off the ratio of medians and the median of the repetitions'
differences (off - variant).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pipelines() -> dict[str, str]:
    """off: without group-linears; on: as shipped; all: linears an extern reads grouped at
    any thread count (as shipped above 2 threads); kernels: at none (as shipped at 1-2)."""
    import ember.inductor  # noqa: F401  (registers the pipelines)
    from ember.ir.passes import expand_pipeline
    on = expand_pipeline("inductor")
    stages = [s for s in on.split(",") if s.strip() != "group-linears"]
    assert len(stages) < len(on.split(",")), on
    return {"off": ",".join(stages), "on": on,
            "all": on.replace("group-linears", "group-linears{extern_threads=1}"),
            "kernels": on.replace("group-linears", "group-linears{extern_threads=100000}")}


def build(name: str, pipeline: str) -> tuple[Any, tuple[Any, ...], list[str]]:
    from zoo_models import BY_NAME, FULL

    import ember.inductor.backend as backend
    from ember.runtime.compile import compile as ember_compile
    seen: list[str] = []
    orig = backend.generate

    def gen(module: Any, *rest: Any, **kw: Any) -> Any:
        w = orig(module, *rest, **kw)
        graph = rest[0] if rest else kw.get("graph")
        g = module.graph(graph) if graph is not None else None
        nodes = g.nodes if g is not None else [n for h in module.graphs.values() for n in h.nodes]
        seen.extend(str(n.kwargs.get("op")) for n in nodes)
        return w
    backend.generate = gen
    try:
        torch.manual_seed(0)
        fn, args = BY_NAME[name].build(FULL)
        compiled = ember_compile(fn, options={"pipeline": pipeline})
        with torch.no_grad():
            want = fn(*args)
            for _ in range(3):
                got = compiled(*args)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    finally:
        backend.generate = orig
    return compiled, args, seen


def linear_calls(ops: list[str]) -> int:
    """The linear extern calls of the compiled graphs (packed or grouped)."""
    return sum(op in ("loop.linear_packed", "loop.linear_grouped") for op in ops)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="hf/bert,hf/t5-encoder,hf/llama,hf/mistral")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="off,on,all",
                    help="of off, on, all, kernels (pipelines())")
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread",
                    help="thread CPU time (1 thread, a shared machine) or wall (many threads)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)  # (before compiling: the pass reads it)
    clock = time.thread_time_ns if a.clock == "thread" else time.perf_counter_ns
    pipes = pipelines()
    keys = [k for k in a.variants.split(",") if k in pipes]
    for name in a.models.split(","):
        try:
            fns = {k: build(name, pipes[k]) for k in keys}
        except Exception as e:  # (one model's failure must not lose the others' lines)
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        times: dict[str, list[float]] = {k: [] for k in fns}
        with torch.no_grad():
            outs = {k: f(*args) for k, (f, args, _) in fns.items()}
            for k in keys[1:]:
                torch.testing.assert_close(outs[k], outs[keys[0]], rtol=1e-4, atol=1e-4)
            for r in range(a.reps):  # round robin, the order rotated each repetition
                for j in range(len(keys)):
                    k = keys[(r + j) % len(keys)]
                    f, args, _ = fns[k]
                    t = clock()
                    f(*args)
                    times[k].append((clock() - t) / 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        lc = {k: linear_calls(w) for k, (_, _, w) in fns.items()}
        parts = []
        for k in keys:
            s = f"{k} {med[k]:.3f} ms (min {low[k]:.3f}, {lc[k]} linear calls"
            if k != "off" and "off" in times:
                diff = statistics.median(x - y for x, y in zip(times["off"], times[k],
                                                                strict=True))
                s += f"; {med['off'] / med[k]:.3f}x, paired off - {k} {diff * 1e3:+.0f} us"
            parts.append(s + ")")
        print(f"{name}: {'; '.join(parts)} (reps {a.reps}, {a.threads} threads, "
              f"{a.clock} time)", flush=True)


if __name__ == "__main__":
    main()
