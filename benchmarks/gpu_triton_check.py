"""The CUDA target on a real GPU (issue 16): correctness against eager and time per case.

Run on a machine with CUDA and triton, from the repository root, without installing ember:

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' :) python3 benchmarks/gpu_triton_check.py

Each case (softmax, layernorm+gelu, an MLP, a pointwise chain; 4096 x 4096, f32 and bf16) is
compiled with `ember.runtime.compile(fn)` on cuda tensors (the inductor's CUDA target: Triton
kernels, torch's CUDA kernels for matmul), checked against eager, and timed against eager and
torch.compile: the median of RUNS calls, each between torch.cuda.synchronize()s, after warmup.
Softmax's bandwidth (one read, one write) is compared with the copy bandwidth COPY_TBS. With OUT
set, writes OUT/gpu_triton_check.json and .md, and the Triton source of each case's kernels
under OUT/kernels/.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

RUNS = 50
WARMUP = 5
COPY_TBS = 4.18  # H200 device-to-device copy bandwidth, TB/s
N = 4096


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def layernorm_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.relu(x @ w1.t() + b1) @ w2.t()


def pointwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2.0 + y).sin() * x - y.abs()


def inputs(case: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
    if case == "softmax":
        return (r(N, N),)
    if case == "layernorm_gelu":
        return r(N, N), r(N), r(N)
    if case == "mlp":
        return r(N, N), r(N, N) / 64, r(N), r(N, N) / 64
    return r(N, N), r(1, N)


CASES: dict[str, Callable[..., torch.Tensor]] = {
    "softmax": softmax, "layernorm_gelu": layernorm_gelu, "mlp": mlp, "pointwise": pointwise}
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def timed(fn: Callable[[], Any]) -> float:
    """Median milliseconds of RUNS calls after WARMUP, each between synchronizes, timed by
    CUDA events around the call (the host's launch cost counts where the GPU waits for it;
    the synchronize itself does not)."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(float(start.elapsed_time(end)))
    return float(statistics.median(times))


def kernel_sources(cf: Any) -> dict[str, str]:
    m = getattr(cf, "_last_compiled", None)
    kernels = getattr(m, "kernels", {}) if m is not None else {}
    return {name: k.source for name, k in kernels.items()}


def run_case(name: str, dtype: torch.dtype, out: Path | None) -> dict[str, Any]:
    import ember.runtime
    fn = CASES[name]
    args = inputs(name, dtype)
    row: dict[str, Any] = {"case": name, "dtype": str(dtype).replace("torch.", ""),
                           "shape": [N, N]}
    with torch.no_grad():
        want = fn(*args)
        cf = ember.runtime.compile(fn, dynamic=False)
        t0 = time.perf_counter()
        try:
            got = cf(*args)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (one case's failure is reported, not fatal)
            row.update(ok=False, error=f"{type(e).__name__}: {e}",
                       trace=traceback.format_exc(limit=8))
            return row
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        hist = cf.history
        row["notes"] = list(hist.notes)
        row["fallbacks"] = [f"{f.kind}: {f.reason}" for f in hist.fallbacks]
        srcs = kernel_sources(cf)
        row["triton_kernels"] = sum(1 for s in srcs.values() if "@triton.jit" in s)
        if out is not None:
            d = out / "kernels" / f"{name}_{row['dtype']}"
            d.mkdir(parents=True, exist_ok=True)
            for k, s in srcs.items():
                (d / f"{k}.py").write_text(s)
        tol = TOL[dtype] * (10 if name == "mlp" else 1)
        try:
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            row["ok"] = True
        except AssertionError as e:
            row["ok"] = False
            row["error"] = str(e).splitlines()[0:4]
        row["eager_ms"] = round(timed(lambda: fn(*args)), 4)
        row["ember_ms"] = round(timed(lambda: cf(*args)), 4)
        try:
            tc = torch.compile(fn)
            tc(*args)
            row["torch_compile_ms"] = round(timed(lambda: tc(*args)), 4)
        except Exception as e:  # noqa: BLE001
            row["torch_compile_ms"] = None
            row["torch_compile_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if name == "softmax":
        moved = 2 * args[0].numel() * args[0].element_size()  # read once, write once
        x = args[0]
        row["copy_ms"] = round(timed(lambda: x.clone()), 4)  # the same bytes, measured here
        for who in ("copy", "eager", "ember", "torch_compile"):
            ms = row.get(f"{who}_ms")
            if ms:
                tbs = moved / (ms * 1e-3) / 1e12
                row[f"{who}_TBps"] = round(tbs, 3)
                row[f"{who}_of_copy"] = round(tbs / COPY_TBS, 3)
    return row


def markdown(rows: list[dict[str, Any]], env: dict[str, str]) -> str:
    lines = ["# ember CUDA target (Triton) on GPU", "",
             ", ".join(f"{k} {v}" for k, v in env.items()), "",
             f"median of {RUNS} runs after {WARMUP} warmup, each between synchronizes "
             f"(CUDA events); "
             f"{N}x{N}; softmax bandwidth vs {COPY_TBS} TB/s copy", "",
             "| case | dtype | ok | triton kernels | eager ms | torch.compile ms | ember ms | "
             "ember/eager | softmax TB/s (copy / eager / tc / ember) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, t, m = r.get("eager_ms"), r.get("torch_compile_ms"), r.get("ember_ms")
        ratio = f"{m / e:.2f}x" if e and m else ""
        bw = " / ".join(str(r.get(f"{w}_TBps", "")) for w in ("copy", "eager", "torch_compile",
                                                               "ember")) \
            if r["case"] == "softmax" else ""
        lines.append(f"| {r['case']} | {r['dtype']} | {r.get('ok')} | "
                     f"{r.get('triton_kernels', '')} | {e} | {t} | {m} | {ratio} | {bw} |")
    bad = [r for r in rows if not r.get("ok") or r.get("fallbacks")]
    if bad:
        lines += ["", "## Failures and fallbacks", ""]
        for r in bad:
            lines.append(f"- {r['case']} {r['dtype']}: {r.get('error', '')} "
                         f"{'; '.join(r.get('fallbacks', []))}")
    return "\n".join(lines) + "\n"


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_triton_check: no CUDA device", file=sys.stderr)
        return 2
    import triton
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "python": platform.python_version()}
    print(env)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    rows = []
    for name in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            row = run_case(name, dtype, out)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("notes", "trace")}),
                  flush=True)
            if "trace" in row:
                print(row["trace"], flush=True)
    md = markdown(rows, env)
    print(md)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_triton_check.json").write_text(json.dumps({"env": env, "rows": rows},
                                                              indent=1))
        (out / "gpu_triton_check.md").write_text(md)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
