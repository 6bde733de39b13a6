"""What the device scripts' Python (benchmarks/device_queue/*.sh) shares: a zoo model compiled
by ember with the wrappers it generated captured, and the interleaved A/B timing loop.

Imported as `dq` with benchmarks/ and benchmarks/device_queue/ on sys.path (the scripts run from
the repository root: `sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def compile_capturing(name: str, warm: int = 3) -> tuple[Any, Any, list[tuple[Any, ...]]]:
    """The zoo model `name` (zoo_models' FULL size, seed 0) compiled by ember and called `warm`
    times under no_grad: (the compiled callable, its arguments, (module, graph, interp,
    wrapper) for each wrapper generated meanwhile). backend.generate is hooked only then."""
    import torch
    from zoo_models import BY_NAME, FULL

    import ember.inductor.backend as backend
    from ember.runtime.compile import compile as ember_compile

    seen: list[tuple[Any, ...]] = []
    orig = backend.generate

    def gen(module: Any, graph: Any = None, interp: Any = None) -> Any:
        w = orig(module, graph, interp)
        seen.append((module, graph, interp, w))
        return w
    backend.generate = gen
    try:
        torch.manual_seed(0)
        fn, args = BY_NAME[name].build(FULL)
        with torch.no_grad():
            compiled = ember_compile(fn)
            for _ in range(warm):
                compiled(*args)
    finally:
        backend.generate = orig
    return compiled, args, seen


def interleaved(fns: dict[str, Callable[[], Any]], reps: int, warm: int = 0,
                clock: Callable[[], int] = time.thread_time_ns) -> dict[str, list[int]]:
    """Each of `fns` called once a round, the order rotated every round (none always first,
    or always after the same one), `warm` untimed rounds then `reps` timed: per name, its
    `reps` durations by `clock` (ns)."""
    names = list(fns)
    out: dict[str, list[int]] = {k: [] for k in names}
    for r in range(warm + reps):
        for j in range(len(names)):
            k = names[(j + r) % len(names)]
            f = fns[k]
            t = clock()
            f()
            dt = clock() - t
            if r >= warm:
                out[k].append(dt)
    return out
