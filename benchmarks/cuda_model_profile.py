"""Where a zoo model's time goes on the GPU, eager vs torch.compile vs ember (issue 16).

Run from the repository root on a CUDA machine:

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :).devlibs \\
        python3 benchmarks/cuda_model_profile.py --models hf/mistral,hf/llama

Each model as benchmarks/gpu_cuda_suite.py runs it (bf16, batch 2, random weights,
inference): eager, torch.compile (default mode) and ember (default mode) compiled, then
`--calls` calls of each recorded under torch.profiler. Per variant: device kernels per call,
the kernels' summed device time per call, the host wall time per call (calls back to back,
one synchronize at the end) and, grouped by kernel name, where the device time goes. When the
host wall time is well above the summed kernel time the model is launch-bound: fewer kernels
or a cheaper launch path is what speeds it up, not faster kernels. Writes OUT/profile.txt and
OUT/profile.jsonl (one summary row per model and variant).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path(os.environ.get("OUT", "/tmp/cuda_model_profile"))
# a CPU machine runs it too (a smoke run of the script: no device kernels to list)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def host_ms(fn: Any, n: int = 50) -> float:
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def profile(fn: Any, calls: int, label: str, top: int) -> tuple[dict[str, Any], str]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    fn()
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with prof(activities=acts) as p:
        for _ in range(calls):
            fn()
        sync()
    kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by: dict[str, list[float]] = {}
    for e in kernels:
        by.setdefault(e.name, []).append(e.device_time_total)
    dev_us = sum(sum(v) for v in by.values()) / calls
    row = {"variant": label, "kernels_per_call": round(len(kernels) / calls, 1),
           "device_us_per_call": round(dev_us, 1), "host_ms_per_call": round(host_ms(fn), 4)}
    lines = [f"== {label}: {row['kernels_per_call']} kernels/call, {dev_us:.1f} us device/call, "
             f"{row['host_ms_per_call'] * 1e3:.1f} us host wall/call"]
    for name, ts in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"{sum(ts) / calls:9.1f} us {len(ts) / calls:6.1f}x "
                     f"{sum(ts) / len(ts):8.2f} us each  {name[:140]}")
    return row, "\n".join(lines) + "\n"


def host_breakdown(cf: Any, args: tuple[Any, ...], n: int = 50) -> dict[str, float]:
    """us per call of ember's compiled call spent in its guard check, its graph's runner (the
    wrapper: allocations, launches, externs; asynchronous, so host time only) and the
    epilogue that rebuilds the caller's return value, calls back to back."""
    inner = getattr(cf, "compiled", cf)
    body = getattr(cf, "__dict__", {}).get("_ember_body")
    owner = next((x for x in (inner, body) if x is not None and getattr(x, "entries", None)),
                 None)
    if owner is None:
        return {}
    e = owner.entries[0]
    acc: dict[str, float] = {}
    saved = {"guard": e.code.guard, "runner": e.runner, "resume": e.resume}

    def timed(key: str, f: Any) -> Any:
        def w(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            r = f(*a, **k)
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
            return r
        return w
    e.code.guard, e.runner, e.resume = (timed(k, f) for k, f in saved.items())
    try:
        cf(*args)
        sync()
        acc.clear()
        t0 = time.perf_counter()
        for _ in range(n):
            cf(*args)
        total = time.perf_counter() - t0
        sync()
    finally:
        e.code.guard, e.runner, e.resume = saved.values()
    return {**{f"{k}_us": round(v / n * 1e6, 1) for k, v in acc.items()},
            "call_us_unsynced": round(total / n * 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="hf/mistral")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--top", type=int, default=25, help="kernel names listed per variant")
    ap.add_argument("--reduce-overhead", action="store_true",
                    help="also ember under mode='reduce-overhead' (its CUDA graphs)")
    ap.add_argument("--launched", action="store_true",
                    help="also ember with options={'cudagraphs': False} (kernel by kernel)")
    a = ap.parse_args()
    import zoo_models
    from gpu_cuda_suite import rel_err

    import ember.runtime
    OUT.mkdir(parents=True, exist_ok=True)
    for name in a.models.split(","):
        torch.manual_seed(0)
        model, args = zoo_models.BY_NAME[name].build(zoo_models.FULL)
        model = model.to(DEVICE, torch.bfloat16).eval()
        args = tuple(x.to(DEVICE, torch.bfloat16) if x.is_floating_point() else x.to(DEVICE)
                     for x in args)
        text = f"#### {name}\n"
        with torch.no_grad():
            cf = ember.runtime.compile(model, dynamic=False)
            tc = torch.compile(model)
            variants = [("eager", model), ("torch.compile", tc), ("ember", cf)]
            if a.reduce_overhead:  # ember's CUDA graphs: what launch overhead costs the default
                variants.append(("ember reduce-overhead",
                                 ember.runtime.compile(model, dynamic=False,
                                                       mode="reduce-overhead")))
            if a.launched:  # the default mode's kernels launched one by one (no CUDA graph)
                variants.append(("ember, no CUDA graphs",
                                 ember.runtime.compile(model, dynamic=False,
                                                       options={"cudagraphs": False})))
            want = model(*args)
            for label, f in variants:
                def fn(f: Any = f, args: tuple[Any, ...] = args) -> Any:
                    return f(*args)
                try:
                    row, t = profile(fn, a.calls, label, a.top)
                    row["rel_err_vs_eager"] = rel_err(fn(), want)
                except Exception as e:  # noqa: BLE001  (a failing variant is a result)
                    row, t = {"variant": label, "error": f"{type(e).__name__}: {e}"[:300]}, ""
                row["model"] = name
                with (OUT / "profile.jsonl").open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
                text += t
            try:
                row = {"model": name, "variant": "ember host breakdown",
                       **host_breakdown(cf, args)}
            except Exception as e:  # noqa: BLE001
                row = {"model": name, "variant": "ember host breakdown", "error": repr(e)[:300]}
            print(json.dumps(row), flush=True)
            text += json.dumps(row) + "\n"
            with (OUT / "profile.jsonl").open("a") as fh:
                fh.write(json.dumps(row) + "\n")
        with (OUT / "profile.txt").open("a") as fh:
            fh.write(text)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
