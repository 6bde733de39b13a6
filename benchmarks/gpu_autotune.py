"""mode="max-autotune" on the GPU (issue 16): tuned Triton schedules and the matmul template
against ember's defaults, eager and torch.compile, in one process.

Run from the repository root on a machine with CUDA and triton, without installing ember:

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :) python3 benchmarks/gpu_autotune.py

`--interpret` runs the same on CPU in Triton's interpreter with tiny shapes (a smoke test of
this script: its timings mean nothing). Each row goes to OUT/autotune.jsonl as it finishes;
a markdown table is printed at the end. Per case:

- **kernels** (softmax, layernorm+gelu, a row sum, a long-row softmax, a pointwise chain; f32
  and bf16): per-call median ms (triton.testing.do_bench) of eager, torch.compile, ember's
  default schedule and ember under max-autotune-no-cudagraphs; the cold tuning seconds, the
  compile seconds of a second compile (the tuning cache answers: no timing), and the chosen
  schedule.
- **matmul** (x @ w.t() + b, then gelu, or relu + residual; bf16 and f16 at a few shapes):
  the same columns, plus the two timings the choice compared (extern + epilogue vs the best
  template configuration) and which was kept.
Every result is checked against eager (relative error printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

INTERPRET = "--interpret" in sys.argv
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/gpu_autotune"))


def kernel_cases(interp: bool) -> list[tuple[str, Callable[..., Any], list[list[int]]]]:
    r, c = (4, 96) if interp else (16384, 4096)
    lr, lc = (2, 4500) if interp else (1024, 65536)
    return [
        ("softmax", lambda x: torch.softmax(x, -1), [[r, c]]),
        ("layernorm+gelu", lambda x, w, b: F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)),
         [[r, c], [c], [c]]),
        ("row sum", lambda x: x.sum(-1), [[r, c]]),
        ("long-row softmax", lambda x: torch.softmax(x, -1), [[lr, lc]]),
        ("pointwise chain", lambda x, y: torch.sigmoid(x * 2 + y) * x, [[r, c], [r, c]]),
    ]


def matmul_cases(interp: bool) -> list[tuple[str, Callable[..., Any], list[list[int]]]]:
    shapes = [(24, 40, 17)] if interp else [(128, 4096, 4096), (2048, 4096, 4096),
                                            (8192, 1024, 1024), (4096, 11008, 4096)]
    out: list[tuple[str, Callable[..., Any], list[list[int]]]] = []
    for m, n, k in shapes:
        out.append((f"linear+gelu {m}x{n}x{k}",
                    lambda x, w, b: F.gelu(F.linear(x, w, b)), [[m, k], [n, k], [n]]))
        out.append((f"linear+relu+residual {m}x{n}x{k}",
                    lambda x, w, b, y: torch.relu(F.linear(x, w, b)) + y,
                    [[m, k], [n, k], [n], [m, n]]))
    return out


def bench(fn: Callable[[], Any], interp: bool) -> float:
    if interp:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=25, rep=100))


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.float(), want.float()
    return float((g - w).norm() / max(w.norm().item(), 1e-30))


def run_case(group: str, name: str, fn: Callable[..., Any], shapes: list[list[int]],
             dtype: torch.dtype, dev: str, interp: bool) -> dict[str, Any]:
    import ember.runtime as er
    from ember.inductor.targets.cuda import autotune as at
    torch.manual_seed(0)
    args = [torch.randn(s, device=dev).to(dtype) for s in shapes]
    row: dict[str, Any] = {"group": group, "case": name, "dtype": str(dtype).removeprefix(
        "torch."), "shapes": shapes}
    want = fn(*args)
    row["eager_ms"] = bench(lambda: fn(*args), interp)
    if not interp:
        tc = torch.compile(fn)
        got = tc(*args)
        row["torch_compile_err"] = rel_err(got, want)
        row["torch_compile_ms"] = bench(lambda: tc(*args), interp)
    cf = er.compile(fn)
    row["ember_err"] = rel_err(cf(*args), want)
    row["ember_ms"] = bench(lambda: cf(*args), interp)
    with at.collecting() as reps:
        t0 = time.perf_counter()
        tuned = er.compile(fn, mode="max-autotune-no-cudagraphs")
        got = tuned(*args)
        row["tuned_compile_s"] = time.perf_counter() - t0
    row["tuned_err"] = rel_err(got, want)
    row["tuned_ms"] = bench(lambda: tuned(*args), interp)
    row["tuning_s"] = sum(r.seconds for r in reps)
    row["choices"] = [{"kernel": c.kernel, "winner": c.winner, "cached": c.cached,
                       "timings_ms": [[t[0], round(t[1], 5)] for t in c.timings]}
                      for r in reps for c in r.choices]
    row["not_tuned"] = {k: v for r in reps for k, v in r.skipped.items()}
    with at.collecting() as reps2:  # a second compile: the tuning cache answers
        t0 = time.perf_counter()
        again = er.compile(fn, mode="max-autotune-no-cudagraphs")
        again(*args)
        row["warm_compile_s"] = time.perf_counter() - t0
    row["warm_all_cached"] = all(c.cached for r in reps2 for c in r.choices)
    for c in row["choices"]:  # the matmul choice's two sides
        if c["kernel"].endswith("(matmul)") and c["timings_ms"]:
            ext = [t for cand, t in c["timings_ms"] if cand.get("kind") == "extern"]
            tpl = [t for cand, t in c["timings_ms"] if "cuda_matmul" in cand]
            row["extern_plus_epilogue_ms"] = ext[0] if ext else None
            row["best_template_ms"] = min(tpl) if tpl else None
            row["template_kept"] = "cuda_matmul" in c["winner"]
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--interpret", action="store_true")
    p.add_argument("--only", default="", help="substring of the case names to run")
    p.add_argument("--budget", type=float, default=480.0,
                   help="start no new case after this many seconds")
    a = p.parse_args()
    interp = a.interpret
    if interp:  # the Triton target in place of the CPU's (the only device here)
        import dataclasses

        from ember.inductor.targets import add_target, targets, unregister_target
        cpu = targets()["cpu"]
        unregister_target("cpu")
        add_target(dataclasses.replace(cpu, pipeline="inductor-cuda-interpret",
                                       loader="triton", lowerings={}, front="decompose,cse,dce",
                                       description="Triton in the interpreter (a smoke test)"))
        os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-autotune-"))
    dev = "cpu" if interp else "cuda"
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / "autotune.jsonl"
    rows: list[dict[str, Any]] = []
    dtypes = [torch.float32, torch.float16] if interp else [torch.float32, torch.bfloat16]
    mm_dtypes = [torch.float16] if interp else [torch.bfloat16, torch.float16]
    work = [("kernels", n, f, s, d) for n, f, s in kernel_cases(interp) for d in dtypes] + \
        [("matmul", n, f, s, d) for n, f, s in matmul_cases(interp) for d in mm_dtypes]
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if not interp
            else "triton interpreter (cpu)"}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        pass
    print(json.dumps(meta), flush=True)
    start = time.perf_counter()
    with out.open("w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for group, name, fn, shapes, dt in work:
            if a.only not in name:
                continue
            if time.perf_counter() - start > a.budget:
                rows.append({"group": group, "case": name, "dtype": str(dt),
                             "error": "not run: --budget spent"})
                continue
            try:
                row = run_case(group, name, fn, shapes, dt, dev, interp)
            except Exception as e:  # noqa: BLE001  (a failed case is a row, not the end)
                row = {"group": group, "case": name, "dtype": str(dt), "error":
                       f"{type(e).__name__}: {str(e)[:300]}"}
            rows.append(row)
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            print(json.dumps({k: v for k, v in row.items() if k != "choices"}, default=str),
                  flush=True)
    print("\n| case | dtype | eager ms | torch.compile ms | ember ms | ember tuned ms | tuning s "
          "| warm compile s | matmul: extern+epi / template ms, kept |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | {r['dtype']} | error: {r['error'][:80]} |||||||")
            continue
        mm = ""
        if "template_kept" in r:
            mm = f"{r['extern_plus_epilogue_ms']:.4g} / {r['best_template_ms']:.4g}, " + (
                "template" if r["template_kept"] else "extern")
        tc = r.get("torch_compile_ms")
        print(f"| {r['case']} | {r['dtype']} | {r['eager_ms']:.4g} | "
              f"{'' if tc is None else f'{tc:.4g}'} | {r['ember_ms']:.4g} | "
              f"{r['tuned_ms']:.4g} | {r['tuning_s']:.2f} | {r['warm_compile_s']:.2f} | {mm} |")


if __name__ == "__main__":
    main()
