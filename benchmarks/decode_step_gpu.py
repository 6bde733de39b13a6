"""Where a decode step's time goes under ember (issue 20): host work against the device's.

Run from the repository root (a GPU, or the CPU for a smoke run):

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :).devlibs python3 benchmarks/decode_step_gpu.py

The dolly-v2-3b-shaped GPT-NeoX of generate_gpu.py (`--layers`, random weights, bf16 on CUDA),
a greedy generate() with a static cache through `ember.runtime.compile(model.forward, mode=...)`;
the forward's arguments at one decode step are kept, and that step is then timed alone, the
cache's write position reset before each call (the step writes the same slot again). Printed, in
ms per step (median of `--reps` rounds of `--calls` calls, the device synchronized per round):
the generate() time per token (and whether its tokens are eager's: greedy in bf16 may take the
other of two near-tied tokens); the compiled forward; its guard check alone (the entry's
generated check over the forward's ~15 guards per module); and eager's forward. Host work
that the device does not hide is the compiled forward's time minus the device time (the CUDA
graph's replay, timed with CUDA events where recorded). The kept step's logits, compiled and
eager, are compared (largest difference, and whether the argmax agrees).

`--profile N` (CUDA only) then records N calls of the compiled forward and N of eager's under
torch.profiler and writes OUT/decode_profile.txt: per variant the device kernels grouped by name
(calls and microseconds per step), and the kernels of one compiled step in launch order with
their durations (where the time of a layer goes: GEMMs, attention, small kernels, copies).
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

from generate_gpu import build_model, generate  # noqa: E402
from gpu_rows import append_rows, host_ms, provenance  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--mode", default="reduce-overhead")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, help="calls to profile (CUDA only)")
    ap.add_argument("--pipeline", default="", help="compile(options={'pipeline': ...}); "
                    "'decode-attention', 'no-decode-attention', optionally +'decode-gemv', "
                    "+'decode-gemv-ungrouped' or +'decode-gemv-rope': the CUDA target's with "
                    "cache-inplace{attention=true|false} (and decode-gemv, group=true|false, "
                    "rope=true)")
    a = ap.parse_args()
    import ember.runtime as er
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(a.layers, device)
    ids = torch.randint(2, 50000, (1, 32), generator=torch.Generator().manual_seed(1)).to(device)
    opts: dict[str, Any] = {}
    if a.pipeline and set(a.pipeline.split("+")) <= {"no-decode-attention", "decode-attention",
                                                     "decode-gemv", "decode-gemv-ungrouped",
                                                     "decode-gemv-rope"}:
        import re

        from ember.inductor.targets.cuda import FRONT, INDUCTOR_CUDA
        passes = ["cache-inplace{attention=false}" if "no-decode-attention" in a.pipeline
                  else "cache-inplace{attention=true}"]
        passes += ["decode-gemv{group=false}"] if "decode-gemv-ungrouped" in a.pipeline else \
            ["decode-gemv{group=true,rope=true}"] if "decode-gemv-rope" in a.pipeline else \
            ["decode-gemv{group=true}"] if "decode-gemv" in a.pipeline else []
        stages = [",".join(passes) if p.startswith("cache-inplace") else p
                  for p in re.split(r",(?![^{]*})", f"{FRONT},{INDUCTOR_CUDA}")]
        opts["pipeline"] = ",".join(stages)
    elif a.pipeline:
        opts["pipeline"] = a.pipeline
    cf = er.compile(model.forward, mode=None if a.mode == "default" else a.mode,
                    options=opts or None)
    steps: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        steps.append((args, kwargs))
        return cf(*args, **kwargs)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    want = generate(model, ids, a.new, "static")  # eager's tokens
    model.forward = spy
    generate(model, ids, a.new, "static")  # compile, record
    t0 = time.perf_counter()
    got = generate(model, ids, a.new, "static")
    per_token = (time.perf_counter() - t0) / a.new
    same = [i for i, (x, y) in enumerate(zip(got[0].tolist(), want[0].tolist(), strict=True))
            if x != y]
    model.forward = cf
    args, kwargs = steps[-3]  # a decode step of the last generate()
    cache = kwargs.get("past_key_values", kwargs.get("cache"))  # (the name by version)
    layers = cache.layers
    # each decode step writes one slot: the kept step (the 3rd from the end) started 3 back
    at = [layer.cumulative_length.clone() - 3 for layer in layers]

    def reset() -> None:
        for layer, c in zip(layers, at, strict=True):
            layer.cumulative_length.copy_(c)

    entry = cf._hot
    S = cf.self_obj

    def timed(fn: Any) -> float:
        return host_ms(fn, reps=a.reps, calls=a.calls, before=reset)

    with torch.no_grad():
        row = {**provenance(device),
               "layers": a.layers, "mode": a.mode, "pipeline": a.pipeline or "default",
               "generate_ms_per_token": round(per_token * 1e3, 3),
               "forward_ms": timed(lambda: cf(*args, **kwargs)),
               "guard_ms": timed(lambda: entry.code.guard(S, args, kwargs)),
               "matches_ms": timed(lambda: entry.matches(entry.code.guard(S, args, kwargs))),
               "eager_forward_ms": timed(lambda: type(model).forward(model, *args, **kwargs)),
               "guards": len(entry.code.guards),
               "same_tokens": not same, "first_divergence": same[0] if same else None}
        reset()
        lc = cf(*args, **kwargs).logits.float()
        reset()
        le = type(model).forward(model, *args, **kwargs).logits.float()
        row["step_logits_max_diff"] = round(float((lc - le).abs().max()), 4)
        row["step_logits_scale"] = round(float(le.abs().max()), 4)
        row["step_same_argmax"] = bool((lc.argmax(-1) == le.argmax(-1)).all())
        rep = er.explain(cf)
        row["cuda_graphs"] = [g.text()[:300] for g in rep.cuda_graphs]
        row["graphs"] = rep.graph_count
        row["fallbacks"] = [f"{f.kind}: {f.reason}"[:300] for f in rep.fallbacks]
    print(json.dumps(row), flush=True)
    append_rows("decode_step.jsonl", [row])
    out = os.environ.get("OUT")
    if a.profile and device == "cuda":
        with torch.no_grad():
            text = "\n".join([
                profile(lambda: cf(*args, **kwargs), reset, a.profile, "ember compiled forward"),
                profile(lambda: type(model).forward(model, *args, **kwargs), reset, a.profile,
                        "eager forward")])
        print(text[:3000], flush=True)
        if out:
            (Path(out) / "decode_profile.txt").write_text(text)
    return 0


def profile(fn: Any, reset: Any, calls: int, label: str) -> str:
    """The device kernels of `calls` calls of fn: grouped by name (per step), and one step's in
    launch order (CUDA graph replays included: CUPTI records the kernels of a graph's nodes)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            reset()
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by: dict[str, list[float]] = {}
    for e in kernels:
        by.setdefault(e.name, []).append(e.device_time_total)
    total = sum(sum(v) for v in by.values()) / calls
    lines = [f"== {label}: {len(kernels) / calls:.0f} device kernels per step, "
             f"{total:.1f} us of kernel time per step"]
    for name, ts in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{sum(ts) / calls:9.1f} us {len(ts) / calls:6.1f}x "
                     f"{sum(ts) / len(ts):8.2f} us each  {name[:150]}")
    per = len(kernels) // calls
    lines.append(f"-- one step in launch order ({per} kernels)")
    for e in sorted(kernels, key=lambda e: e.time_range.start)[-per:][:400]:
        lines.append(f"{e.device_time_total:8.2f} us  {e.name[:150]}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
