"""Where a model's call spends host time on the GPU, kernel by kernel (ember's CUDA graphs
bypassed) against torch.compile's: for the zoo30 models whose launched calls are host-bound.

Per model (bf16, batch 2, the zoo's FULL sizes, inference under no_grad): host microseconds per
call (n calls, one synchronize at the end: for a host-bound call that is its launch path's cost)
of eager, torch.compile and ember, ember with Python's garbage collector off, ember's call in
its parts (the guards, the compiled graph's runner, the epilogue making the caller's outputs),
and cProfile's top functions by own time over `--calls` calls of each compiler (a C function's
time, such as a Triton launcher's, a torch.empty or an extern's torch op, shows as its own row).
Run from the repository root on a GPU machine:

    python3 benchmarks/cuda_host_profile.py --models hf/gpt2,hf/whisper-encoder [--calls 200]

Rows go to $OUT/host_profile.jsonl (OUT defaults to /tmp/cuda_host_profile) and stdout.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_cuda_suite as suite  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/cuda_host_profile"))


def top(fn: Callable[[], Any], calls: int, n: int = 25) -> list[dict[str, Any]]:
    """cProfile's top `n` functions by own time over `calls` calls of fn: us per call."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [{"fn": f"{Path(f).name}:{line}({name})", "ncalls_per_call": round(nc / calls, 2),
             "own_us": round(tt / calls * 1e6, 2), "cum_us": round(ct / calls * 1e6, 2)}
            for (f, line, name), (_, nc, tt, ct, _) in rows]


def parts(cf: Any, args: tuple[Any, ...], n: int = 200) -> dict[str, float]:
    """Host us per call of ember's call in its parts: the guards, the graph's runner (the
    generated call: allocations, launches, externs), the epilogue (the caller's outputs)."""
    c = getattr(cf, "__dict__", {}).get("_ember_body", getattr(cf, "compiled", cf))
    e = c.entries[0]
    S = c.self_obj
    inputs = e.code.guard(S, args, {})
    fed = e.feed(inputs)
    outs = e.runner(list(fed))
    return {"guards_us": suite.host_us(lambda: e.code.guard(S, args, {}), n),
            "runner_us": suite.host_us(lambda: e.runner(list(fed)), n),
            "epilogue_us": suite.host_us(lambda: e.resume(outs, S, args, {}, inputs), n)}


def profile_model(name: str, build: Callable[[], tuple[Any, tuple[Any, ...]]],
                  calls: int) -> dict[str, Any]:
    import ember.runtime
    row: dict[str, Any] = {"model": name}
    torch.manual_seed(0)
    model, args = build()
    model = model.to("cuda", torch.bfloat16).eval()
    args = tuple(suite.to_device(a, torch.bfloat16) for a in args)
    with torch.no_grad():
        cf = ember.runtime.compile(model, dynamic=False)
        cf(*args)
        cf(*args)  # (the default mode records its CUDA graph here; bypassed below)
        for rec in suite.recorded_graphs(cf):
            rec.skipped = "host profile: launched kernel by kernel"
        tc = suite.fresh_torch_compile(model)
        tc(*args)
        row.update(suite.what_ran(cf))
        row.pop("history", None)
        n = max(50, calls)
        row["eager_us"] = suite.host_us(lambda: model(*args), n)
        row["tc_us"] = suite.host_us(lambda: tc(*args), n)
        row["ember_us"] = suite.host_us(lambda: cf(*args), n)
        gc.disable()
        try:
            row["ember_gc_off_us"] = suite.host_us(lambda: cf(*args), n)
        finally:
            gc.enable()
        try:
            row.update(parts(cf, args, n))
        except Exception as e:  # noqa: BLE001  (a model whose entry is not one graph)
            row["parts_error"] = f"{type(e).__name__}: {e}"[:200]
        row["ember_top"] = top(lambda: cf(*args), calls)
        row["tc_top"] = top(lambda: tc(*args), calls, 15)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="hf/gpt2,hf/bert,timm/deit_tiny_patch16_224,"
                                        "hf/whisper-encoder")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--budget", type=float, default=180.0, help="seconds; later models skipped")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for name, build in suite.model_list(a.models):
        if time.perf_counter() - t0 > a.budget:
            print(f"{name}: skipped (budget)", flush=True)
            continue
        try:
            row = profile_model(name, build, a.calls)
        except Exception as e:  # noqa: BLE001  (one model's failure is its row)
            row = {"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        with (OUT / "host_profile.jsonl").open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(f"== {name}: " + ", ".join(f"{k} {row[k]:.1f}" for k in (
            "eager_us", "tc_us", "ember_us", "ember_gc_off_us", "guards_us", "runner_us",
            "epilogue_us") if isinstance(row.get(k), float)) + (f" {row['error']}" if
                                                                 "error" in row else ""))
        for who in ("ember_top", "tc_top"):
            for r in row.get(who, []):
                print(f"  {who[:-4]:6s} {r['own_us']:8.2f} us own {r['cum_us']:8.2f} cum "
                      f"x{r['ncalls_per_call']:<6} {r['fn']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
