"""The per-call floor of a compiled call on CPU (issue 18 item 5): where its microseconds go.

Run from the repository root:

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :).devlibs python3 benchmarks/per_call.py

Tiny models (zoo_models.TINY: one layer of width 64, 16 tokens) and a 2-layer decode step
(generate_gpu.py's GPT-NeoX, tiny, float32, a static cache: the forward's arguments of one
decode step are kept and the step is timed alone, the cache's write position reset before each
call), at one thread. Per call, in microseconds of thread time (the minimum and the median over
`--rounds` rounds of `--calls` calls, eager / ember / torch.compile interleaved in one process):
the whole call; then ember's call in parts, each timed alone on the same arguments: the entry's
guard check, the aliasing check (`matches`), the backend's runner (the generated wrapper),
the Epilogue (write-back, eager's output layout and views) and the caller's output built.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

Case = tuple[dict[str, Callable[[], Any]], Any, tuple[Any, ...], dict[str, Any]]


def per_call(fn: Callable[[], Any], n: int) -> float:
    t = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - t) / n / 1e3


def tiny(name: str, with_tc: bool) -> Case:
    from zoo_models import BY_NAME, TINY

    import ember.runtime as er
    mod, inp = BY_NAME[name].build(TINY)
    c = er.compile(mod)
    fns: dict[str, Callable[[], Any]] = {"eager": lambda: mod(*inp), "ember": lambda: c(*inp)}
    if with_tc:
        tc = torch.compile(mod)
        fns["torch.compile"] = lambda: tc(*inp)
    with torch.no_grad():
        for f in fns.values():
            f()
            f()
    return fns, c.compiled, tuple(inp), {}


def decode(layers: int) -> Case:
    from generate_gpu import build_model, generate

    import ember.runtime as er
    model = build_model(layers, "cpu", tiny=True).float()
    ids = torch.randint(2, 900, (1, 8), generator=torch.Generator().manual_seed(1))
    cf = er.compile(model.forward)
    steps: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        steps.append((args, kwargs))
        return cf(*args, **kwargs)

    model.forward = spy
    generate(model, ids, 8, "static")
    generate(model, ids, 8, "static")
    model.forward = cf
    args, kwargs = steps[-3]  # a decode step of the last generate(): it started 3 slots back
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    at = [layer.cumulative_length.clone() - 3 for layer in cache.layers]

    def reset() -> None:
        for layer, c in zip(cache.layers, at, strict=True):
            layer.cumulative_length.copy_(c)

    def eager() -> Any:
        reset()
        return type(model).forward(model, *args, **kwargs)

    def ember() -> Any:
        reset()
        return cf(*args, **kwargs)

    return {"eager": eager, "ember": ember, "reset": reset}, cf, args, kwargs


def parts(case: Case, calls: int) -> dict[str, float]:
    fns, cf, args, kwargs = case
    e, S = cf._hot, cf.self_obj
    if "reset" in fns:
        fns["reset"]()
    inputs = e.code.guard(S, args, kwargs)
    assert isinstance(inputs, list), "the hot entry's guards fail on its own arguments"
    outs = e.runner(inputs)
    results = e.epilogue(outs, inputs)
    pieces: dict[str, Callable[[], Any]] = {
        "guards": lambda: e.code.guard(S, args, kwargs),
        "matches": lambda: e.matches(inputs),
        "runner": lambda: e.runner(inputs),
        "epilogue": lambda: e.epilogue(outs, inputs),
        "output": lambda: e.code.output(results, S, args, kwargs)}
    return {k: min(per_call(f, calls) for _ in range(3)) for k, f in pieces.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="hf/bert,hf/gpt-neox,decode")
    ap.add_argument("--layers", type=int, default=2, help="the decode step's layers")
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-torch-compile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cases = {n: decode(a.layers) if n == "decode" else tiny(n, not a.no_torch_compile)
             for n in a.models.split(",")}
    times: dict[str, dict[str, list[float]]] = {n: {} for n in cases}
    with torch.no_grad():
        for _ in range(a.rounds):
            for n, (fns, _, _, _) in cases.items():
                for k, f in fns.items():
                    if k != "reset":
                        times[n].setdefault(k, []).append(per_call(f, a.calls))
        print(f"us per call, thread time at 1 thread (min/median of {a.rounds} x {a.calls})")
        for n, case in cases.items():
            row = "  ".join(f"{k} {min(v):.0f}/{statistics.median(v):.0f}"
                            for k, v in times[n].items())
            print(f"{n}: {row}")
            e = case[1]._hot
            p = "  ".join(f"{k} {v:.1f}" for k, v in parts(case, a.calls).items())
            print(f"  ember's parts: {p}  ({len(e.code.guards)} guards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
