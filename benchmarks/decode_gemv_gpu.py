"""The decode step's GEMVs on the GPU, one launch against two (issue 20): microbenchmarks inside
CUDA graphs with cold weights (8 copies of each weight cycled, more than the 50 MB L2).

Run from the repository root on a CUDA machine:

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :).devlibs python3 benchmarks/decode_gemv_gpu.py

Cases (us per call, the graph's replay time over its calls; dolly-v2-3b shapes, bf16):
`one`: gemv.py's GEMV per shape and gemv_fused's one-product kernel (same blocks) against
cuBLAS; `pair`: QKV with h_to_4h (bias, and bias + GELU) and dense with 4h_to_h as one
gemv_pair launch against the two GEMVs and the epilogue kernel they replace; `pdl`: a layer's
chain of the pair kernels with and without programmatic dependent launch; `rows`: a batch-8
step's [8, K] products by cuBLAS against one row's. (Run at 51cfd9c+wip, `rows` also timed a
Triton kernel of [M, BN, BK] blocks, since removed: 5-16x slower than cuBLAS at M=8.) Each line is also a JSON row in
OUT/decode_gemv.jsonl. Values are checked against torch before timing.
"""

# ruff: noqa: B023  (each closure runs inside timed() before its loop variables move on)

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_rows import append_rows, provenance  # noqa: E402

SHAPES = {"qkv": (7680, 2560), "dense": (2560, 2560), "h_to_4h": (10240, 2560),
          "4h_to_h": (2560, 10240), "lm_head": (50280, 2560)}
COPIES = 8


def timed(fn: Any, reps: int = 20) -> float | str:
    """us per call of fn() (one call per weight copy) captured in a CUDA graph (off CUDA: each
    call once, untimed: the --small smoke run); the error's text where one is raised."""
    try:
        return _timed(fn, reps)
    except Exception as e:  # one variant failing (a launch option) leaves the others' rows
        return f"error: {type(e).__name__}: {e}"[:200]


def _timed(fn: Any, reps: int) -> float:
    if not torch.cuda.is_available():
        for i in range(COPIES):
            fn(i)
        return 0.0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(COPIES):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(COPIES):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / (reps * COPIES))
    return round(best, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="pair,pdl,one,rows", help="run in this file's order")
    ap.add_argument("--small", action="store_true", help="shapes / 32 (a CPU smoke run under "
                    "TRITON_INTERPRET=1)")
    a = ap.parse_args()
    if a.small:
        for k, (n, kk) in list(SHAPES.items()):
            SHAPES[k] = (n // 32, kk // 32)
    from ember.inductor.targets.cuda.gemv import config, gemv
    from ember.inductor.targets.cuda.gemv_fused import gemv_pair, reference
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bf = torch.bfloat16
    torch.manual_seed(0)
    W = {k: [torch.randn(n, kk, device=dev, dtype=bf) * 0.02 for _ in range(COPIES)]
         for k, (n, kk) in SHAPES.items()}
    B = {k: torch.randn(n, device=dev, dtype=bf) for k, (n, _) in SHAPES.items()}
    X = {k: torch.randn(1, kk, device=dev, dtype=bf) for k, (_, kk) in SHAPES.items()}
    rows: list[dict[str, Any]] = []

    def emit(**row: Any) -> None:
        row.update(provenance(dev))
        rows.append(row)
        print(json.dumps(row), flush=True)

    def err(got: torch.Tensor, want: torch.Tensor) -> float:
        return round(float((got.float() - want.float()).abs().max()), 4)

    cases = a.cases.split(",")
    if "pair" in cases:
        for k1, k2, b1, act2 in (("qkv", "h_to_4h", True, "gelu"), ("qkv", "h_to_4h", False, None),
                                 ("dense", "4h_to_h", True, None)):
            x1, x2, w1, w2 = X[k1], X[k2], W[k1], W[k2]
            bb1 = B[k1] if b1 else None
            bb2 = B[k2] if b1 else None
            y1, y2 = gemv_pair(x1, w1[0], bb1, None, x2, w2[0], bb2, act2)
            e = max(err(y1, reference(x1, w1[0], bb1, None)),
                    err(y2, reference(x2, w2[0], bb2, act2)))

            def sep(i: int) -> None:
                gemv(x1, w1[i])
                y = gemv(x2, w2[i])
                if b1 or act2:  # the epilogue kernel the pair absorbs (one launch)
                    torch.nn.functional.gelu(y + B[k2]) if act2 else y + B[k2]
            emit(case="pair", shapes=[k1, k2], bias=b1, act=act2, err=e,
                 separate=timed(sep),
                 pair=timed(lambda i: gemv_pair(x1, w1[i], bb1, None, x2, w2[i], bb2, act2)),
                 pair_pdl=timed(lambda i: gemv_pair(x1, w1[i], bb1, None, x2, w2[i], bb2, act2,
                                                    pdl=True)))
    if "pdl" in cases:
        # a layer's GEMV launches as the paired pipeline makes them: (QKV, h_to_4h + GELU),
        # then (dense, 4h_to_h); with a small kernel between (attention's place)
        xa = torch.randn(1, 32, 1, 80, device=dev, dtype=bf)

        def layer(i: int, pdl: bool, small: bool) -> None:
            gemv_pair(X["qkv"], W["qkv"][i], B["qkv"], None, X["h_to_4h"], W["h_to_4h"][i],
                      B["h_to_4h"], "gelu", pdl=pdl)
            if small:
                xa.mul_(1.0)
            gemv_pair(X["dense"], W["dense"][i], B["dense"], None, X["4h_to_h"],
                      W["4h_to_h"][i], B["4h_to_h"], None, pdl=pdl)
        for small in (False, True):
            emit(case="pdl", small_kernel_between=small,
                 plain=timed(lambda i: layer(i, False, small)),
                 pdl=timed(lambda i: layer(i, True, small)))
    if "one" in cases:
        for k, (n, kk) in SHAPES.items():
            w, x = W[k], X[k]
            cf = config(n, kk)
            e1 = err(gemv_pair(x, w[0], None, None)[0], x @ w[0].t())
            emit(case="one", shape=k, block=list(cf), gb=round(n * kk * 2 / 1e9, 4),
                 cublas=timed(lambda i: x @ w[i].t()), gemv=timed(lambda i: gemv(x, w[i])),
                 fused_one=timed(lambda i: gemv_pair(x, w[i], None, None)),
                 fused_one_bias=timed(lambda i: gemv_pair(x, w[i], B[k], None)),
                 fused_one_pdl=timed(lambda i: gemv_pair(x, w[i], None, None, pdl=True)),
                 err=e1)
            for bn, bk, warps in ((4, 1024, 4), (8, 512, 8), (16, 512, 8), (4, 2048, 8)):
                if bk > 1 << (kk - 1).bit_length() or k == "lm_head":
                    continue
                emit(case="one-block", shape=k, block=[bn, bk, warps],
                     fused_one=timed(lambda i, c=(bn, bk, warps): gemv_pair(
                         x, w[i], None, None, blocks=(c,))))
    if "rows" in cases:  # a batch-8 step's products: cuBLAS at 1 and 8 rows
        for k, (_, kk) in SHAPES.items():
            for m in (1, 8):
                xm = torch.randn(m, kk, device=dev, dtype=bf)
                w = W[k]
                emit(case="rows", shape=k, m=m, cublas=timed(lambda i: xm @ w[i].t()))
    append_rows("decode_gemv.jsonl", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
