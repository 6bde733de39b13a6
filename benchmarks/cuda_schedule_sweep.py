"""Schedule sweep of ember's memory-bound Triton kernels on a GPU (issue 16): what block sizes,
warps and persistent/looped rows reach the copy bandwidth, per case and dtype.

For each case of gpu_cuda_suite.py's kernels section (16384x4096) it captures the function,
lowers and schedules it (`schedule-cuda`), then renders its loop kernel under each candidate
schedule (the cuda_* attributes, as max-autotune does), compiles them in launcher.py's pool,
checks each against the default schedule's result and times it (do_bench medians, CUDA events)
on the case's real inputs. It also checks the default kernel (both `cuda_lowp` modes) against
eager and reports the default schedule's place among the candidates. One JSON line per result
on stdout and in $OUT/sweep.jsonl; a markdown table in $OUT/sweep.md. Needs a CUDA device:

    python3 benchmarks/cuda_schedule_sweep.py [--cases row_sum,pointwise] [--budget 120]

`--dry-run` runs the same code on CPU in Triton's interpreter at 8x256 (checks the script, not
a timing).
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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.gpu_cuda_suite
START = time.perf_counter()
OUT = Path(os.environ.get("OUT", "/tmp/cuda_schedule_sweep"))
DRY = "--dry-run" in sys.argv
NO_PER_OP = "--no-per-op" in sys.argv
# --cands FILE: candidates per case name (or "rows" / "pointwise") in place of candidates()
CANDS: dict[str, list[dict[str, int]]] = json.loads(Path(
    sys.argv[sys.argv.index("--cands") + 1]).read_text()) if "--cands" in sys.argv else {}
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton.jit runs
SHAPE = (8, 256) if DRY else (16384, 4096)
# --math A,B: only these MATH_VARIANTS (default: all that apply)
MATH = sys.argv[sys.argv.index("--math") + 1].split(",") if "--math" in sys.argv else None
# --anchor: each case at issue 16's 1 GiB-class size (gpu_cuda_suite.ANCHOR_SHAPES)
ANCHOR = "--anchor" in sys.argv
DEVICE = "cpu" if DRY else "cuda"


def inputs(case: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    rows, cols = SHAPE
    if ANCHOR and not DRY:
        from benchmarks.gpu_cuda_suite import ANCHOR_SHAPES
        rows, cols = ANCHOR_SHAPES[case]
    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=DEVICE, dtype=dtype)
    if case.startswith("layernorm"):
        return r(rows, cols), r(cols), r(cols)
    if case == "pointwise":
        return r(rows, cols), r(rows, cols)
    return (r(rows, cols),)


def bench(run: Any) -> float:
    if DRY:
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench
    return float(do_bench(run, warmup=25, rep=100, return_mode="median"))


def emit(row: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    row.setdefault("t", round(time.perf_counter() - START, 1))
    line = json.dumps(row, default=str)
    print(line, flush=True)
    with (OUT / "sweep.jsonl").open("a") as f:
        f.write(line + "\n")


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def layernorm_gelu_tanh(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b), approximate="tanh")


# diagnostics next to gpu_cuda_suite's cases: how much of layernorm+gelu is erf
EXTRA_CASES = {"layernorm": layernorm, "layernorm_gelu_tanh": layernorm_gelu_tanh}


# math variants of the default kernel, by source text at its call sites (`v = f(...)`): the
# functions ember rendered before (libdevice's erff for the prelude's _erf, tl.exp for
# ex2.approx.ftz, div.full for 1 / x, a division per element by a row value), one at a time
# and all of them ("before")
_ERF = ("= _erf(", "= tl.erf(")
_EXP = ("= libdevice.fast_expf(", "= tl.exp(")
_RECIP = ("= libdevice.fast_dividef(1.0, ", "= (1.0 / ")
_ROWDIV = ("* (1.0 / ", "/ (")  # x * (1 / row value) back to x / row value
# cuda_math="bf16"'s cheaper 1 + erf and gelu (prelude.py) back to the accurate _erf
_ERF1P = ("    return libdevice.fast_dividef(2.0, 1.0 + libdevice.exp2(_erf_exponent(x, C)))",
          "    return 1.0 + _erf(x * C)")
_PHI = ("    return libdevice.fast_dividef(1.0, 1.0 + libdevice.exp2(_erf_exponent(x, C)))",
        "    return 0.5 * (1.0 + _erf(x * C))")
# bf16 loads upcast by cvt.f32.bf16 in place of the prelude's 16-bit shift
_UP = ("return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)",
       "return v.to(tl.float32)")
MATH_VARIANTS: list[tuple[str, list[tuple[str, str]]]] = [
    ("libdevice_erf", [_ERF]), ("tl_exp", [_EXP]), ("div_full", [_RECIP]),
    ("row_div", [_ROWDIV]), ("before", [_ERF, _EXP, _RECIP, _ROWDIV]),
    ("accurate_erf", [_ERF1P, _PHI]), ("cvt_upcast", [_UP])]


def candidates(rows: bool, row_len: int, few: bool = False) -> list[dict[str, int]]:
    """Pointwise: XBLOCK x warps with 4..64 elements per thread; rows: rows per program x warps,
    persistent, and looped over RBLOCK chunks (`few`: a handful of each)."""
    if few:  # the defaults' neighbours, eviction hints on/off, TorchInductor's looped shape
        if not rows:
            return [{"cuda_xblock": xb, "cuda_warps": w} for xb, w in (
                (1024, 4), (2048, 4), (2048, 8), (4096, 8))]
        return [{"cuda_xblock": 1, "cuda_warps": w, "cuda_persistent": 1, "cuda_evict": e}
                for w in (4, 8) for e in (0, 1)] + [
            {"cuda_xblock": 2, "cuda_warps": 8, "cuda_persistent": 1},
            *({"cuda_xblock": 1, "cuda_warps": 4, "cuda_persistent": 1, "cuda_programs": p,
               "cuda_evict": e} for p, e in ((8 if DRY else 1056, 0), (4 if DRY else 2112, 0),
                                             (4 if DRY else 2112, 1))),
            {"cuda_xblock": 1, "cuda_warps": 16, "cuda_persistent": 0, "cuda_rblock": 2048},
            {"cuda_xblock": 1, "cuda_warps": 16, "cuda_persistent": 0, "cuda_rblock": 2048,
             "cuda_evict": 1}]
    out: list[dict[str, int]] = []
    if not rows:
        for xb in (512, 1024, 2048, 4096, 8192):
            for w in (2, 4, 8, 16):
                if 4 <= xb // (32 * w) <= 64:
                    out.append({"cuda_xblock": xb, "cuda_warps": w})
        return out
    for xb in (1, 2, 4, 8):
        for w in (2, 4, 8, 16):
            if xb * row_len // (32 * w) <= 128:
                out.append({"cuda_xblock": xb, "cuda_warps": w, "cuda_persistent": 1})
                if xb == 1:  # with TorchInductor's L2 eviction hints (one-pass rows only)
                    out.append({"cuda_xblock": 1, "cuda_warps": w, "cuda_persistent": 1,
                                "cuda_evict": 1})
    for rb in (512, 1024, 2048):
        if rb < row_len:
            for xb in (1, 2, 4, 8):
                for w in (4, 8):
                    if 4 <= xb * rb // (32 * w) <= 64:
                        out.append({"cuda_xblock": xb, "cuda_warps": w, "cuda_persistent": 0,
                                    "cuda_rblock": rb})
    return out


def same_size_copy(nbytes: int) -> float:
    """TB/s of a copy moving `nbytes` in all (nbytes/2 read, nbytes/2 written): the ceiling
    at the kernel's own size (fixed costs of a short kernel included)."""
    x = torch.empty(nbytes // 8, dtype=torch.float32, device=DEVICE)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return max(2 * x.numel() * 4 / (ms * 1e-3) / 1e12, 1e-9)


def sweep_case(case: str, dtype: torch.dtype, copy_tbs: float, budget: float,
               few: bool = False) -> None:
    from benchmarks.gpu_cuda_suite import KERNEL_CASES
    from ember.capture import capture
    from ember.inductor.backend import compiled_runner
    from ember.inductor.launch import load_module
    from ember.inductor.targets.cuda import autotune as at
    from ember.inductor.targets.cuda.render import SCHED_KEYS, render
    from ember.ir import Graph, Ref, Value
    from ember.ir.passes import run_pipeline
    fn = {**KERNEL_CASES, **EXTRA_CASES}[case]
    args = inputs(case, dtype)
    dname = str(dtype).replace("torch.", "")
    with torch.no_grad():
        want = fn(*args)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    interp = "{interpret=true}" if DRY else ""
    for lowp in ("f32",) if NO_PER_OP else ("f32", "per-op"):  # the default kernel vs eager
        c = capture(fn, args, {})
        m = run_pipeline(c.module, "decompose,cse,dce,lower-loops,fuse,"  # type: ignore[arg-type]
                         f"schedule-cuda{{lowp={lowp}}},codegen-triton{interp},plan-buffers")
        table = load_module(m)
        got = compiled_runner(m)(None, list(args)).outputs[0]
        err = (got.float() - want.float()).abs().max().item()
        ok = bool(torch.allclose(got.float(), want.float(), atol=tol, rtol=tol))
        row: dict[str, Any] = {"section": "lowp", "case": case, "dtype": dname,
                               "cuda_lowp": lowp, "ok": ok, "max_abs_err": err,
                               "kernels": len(m.kernels)}
        g = next(iter(m.graphs.values()))
        calls = [n for n in g.nodes if n.op == "kernels.call"]
        if len(calls) == 1 and all(a in g.params for a in calls[0].args[1:]):  # time it alone
            ins = [args[g.params.index(a)] for a in calls[0].args[1:]]  # type: ignore[arg-type]
            kfn = table[calls[0].args[0].name].fn  # type: ignore[union-attr]
            dst = torch.empty_like(want)
            ms = bench(lambda: kfn(*ins, dst))  # noqa: B023
            nbytes = sum(a.numel() * a.element_size() for a in ins) + \
                dst.numel() * dst.element_size()
            row["ms"] = round(ms, 5)
            row["pct_copy"] = round(100 * nbytes / (ms * 1e-3) / 1e12 / copy_tbs, 1)
        emit(row)
    c = capture(fn, args, {})
    m = run_pipeline(c.module, "decompose,cse,dce,lower-loops,fuse,schedule-cuda")  # type: ignore[arg-type]
    g = next(iter(m.graphs.values()))
    loops = [n for n in g.nodes if n.op in ("loop.pointwise", "loop.reduction")]
    if len(loops) != 1 or any(a not in g.params for a in loops[0].args[1:]
                              if isinstance(a, Value)):
        emit({"section": "sweep", "case": case, "dtype": dname,
              "error": f"{len(loops)} loop kernels (one reading the inputs expected)"})
        return
    n = loops[0]
    ref = n.args[0]
    assert isinstance(ref, Ref)
    body = m.items[ref.name]
    assert isinstance(body, Graph)
    default = {k: n.kwargs[k] for k in SCHED_KEYS if k in n.kwargs}
    rows = "cuda_persistent" in default
    listed = CANDS.get(case, CANDS.get("rows" if rows else "pointwise")) if CANDS else None
    cands = [default] + [c for c in (listed if listed is not None else
                                     candidates(rows, args[0].shape[-1], few)) if c != default]
    sources = []
    for cand in cands:
        for k in SCHED_KEYS:
            n.kwargs.pop(k, None)
        n.kwargs.update(cand)
        sources.append(render(ref.name, n, body, m.items, DRY).source)
    for label, swaps in MATH_VARIANTS:  # the default schedule with other math
        if MATH is not None and label not in MATH:
            continue
        if any(old in sources[0] for old, _ in swaps) and not DRY:
            src = sources[0]
            for old, new in swaps:
                src = src.replace(old, new)
            cands.append({**default, "math": label})  # type: ignore[dict-item]
            sources.append(src)
    ins = [args[g.params.index(a)] for a in n.args[1:] if isinstance(a, Value)]
    out = torch.empty_like(want)
    nbytes = sum(a.numel() * a.element_size() for a in ins) + out.numel() * out.element_size()
    same = same_size_copy(nbytes)
    (OUT / f"src_{case}_{dname}.py").write_text(sources[0])  # the default kernel
    emit({"section": "ceiling", "case": case, "dtype": dname, "bytes": nbytes,
          "same_size_copy_TBps": round(same, 3),
          "same_size_copy_pct_of_copy": round(100 * same / copy_tbs, 1)})
    runs = at._runners(ref.name, sources, [*ins, out], DRY)
    base: torch.Tensor | None = None
    results = []
    for cand, run in zip(cands, runs, strict=True):
        if time.perf_counter() - START > budget:
            emit({"section": "sweep", "case": case, "dtype": dname, "skipped": "out of time"})
            break
        row: dict[str, Any] = {"section": "sweep", "case": case, "dtype": dname,
                               "default": cand is default,
                               **{k.removeprefix("cuda_"): v for k, v in cand.items()}}
        if run is None:
            row["error"] = "does not load"
        else:
            try:
                run()
                if base is None:
                    base = out.clone()
                row["ok"] = bool(torch.allclose(out.float(), base.float(), atol=tol, rtol=tol))
                ms = bench(run)
                row["ms"] = round(ms, 5)
                row["pct_copy"] = round(100 * nbytes / (ms * 1e-3) / 1e12 / copy_tbs, 1)
                row["pct_same_size_copy"] = round(100 * nbytes / (ms * 1e-3) / 1e12 / same, 1)
                results.append(row)
            except Exception as e:  # noqa: BLE001  (a candidate that fails is a result)
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        emit(row)
    if results:
        best = max(results, key=lambda r: r["pct_copy"] if r["ok"] else -1)
        emit({**best, "section": "best",
              "default_pct_copy": next((r["pct_copy"] for r in results if r["default"]), None)})


def copy_bandwidth() -> float:
    x = torch.empty(1 << (16 if DRY else 28), dtype=torch.float32, device=DEVICE)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return max(2 * x.numel() * 4 / (ms * 1e-3) / 1e12, 1e-9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", default="row_sum,pointwise,layernorm_gelu,softmax")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds; no new work after")
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, 8x256")
    ap.add_argument("--few", action="store_true", help="a handful of candidates per case")
    ap.add_argument("--no-per-op", action="store_true", help="check cuda_lowp=f32 only")
    ap.add_argument("--math", help="comma-separated MATH_VARIANTS labels (default: all)")
    ap.add_argument("--anchor", action="store_true",
                    help="each case at its 1 GiB-class size (gpu_cuda_suite.ANCHOR_SHAPES)")
    ap.add_argument("--cands", help="JSON file: {case or 'rows'/'pointwise': [schedule, ...]}")
    a = ap.parse_args()
    if not DRY and not torch.cuda.is_available():
        print("cuda_schedule_sweep: no CUDA device", file=sys.stderr)
        return 2
    import triton
    copy_tbs = copy_bandwidth()
    emit({"section": "env", "gpu": "dry run" if DRY else torch.cuda.get_device_name(), "torch": torch.__version__,
          "triton": triton.__version__, "copy_TBps": round(copy_tbs, 3),
          "ember commit": os.environ.get("EMBER_COMMIT", "?")})
    for case in a.cases.split(","):
        for dname in a.dtypes.split(","):
            if time.perf_counter() - START > a.budget:
                break
            try:
                sweep_case(case, getattr(torch, dname), copy_tbs, a.budget, a.few)
            except Exception as e:  # noqa: BLE001
                emit({"section": "sweep", "case": case, "dtype": dname,
                      "error": f"{type(e).__name__}: {str(e)[:300]}"})
    lines = ["| case | dtype | schedule | ok | ms | % copy |", "|---|---|---|---|---|---|"]
    for line in (OUT / "sweep.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("section") == "sweep" and "ms" in r:
            sched = ", ".join(f"{k}={v}" for k, v in r.items() if k in (
                "xblock", "warps", "persistent", "rblock", "evict", "programs", "math")) + (
                " (default)" if r["default"] else "")
            lines.append(f"| {r['case']} | {r['dtype']} | {sched} | {r['ok']} | {r['ms']} | "
                         f"{r['pct_copy']} |")
    (OUT / "sweep.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
