"""Decode-step GEMVs with fewer launches: two independent products in one kernel, the bias and
erf-GELU epilogues in the kernel.

A batch-1 decode step's layer runs four GEMVs (QKV, attention dense, h_to_4h, 4h_to_h) and
small pointwise kernels between them. On the H200 each launch inside a CUDA graph costs ~2-3 us
beyond its bytes (launch, ramp-up, DRAM latency, tail: the 13 MB dense GEMV takes 6 us where
4.2 TB/s would be 3.1), so launches, not bandwidth, are what is left to cut. `gemv_pair` runs
two products y1 = x1 @ w1.T (+ b1, GELU), y2 = x2 @ w2.T (+ b2, GELU) as one launch: programs
[0, P1) take w1's rows, the rest w2's, each with its own block sizes (gemv_blocks.py's `config`). The
`decode-gemv` pass pairs a GEMV with a later one whose input does not depend on it (a GPT-NeoX
layer's QKV with h_to_4h, which reads the other layernorm of the same residual; the dense with
4h_to_h) and absorbs the bias add and an erf GELU that read only its result.

Numerics: each product accumulates in f32 and rounds once; with a bias the sum acc + b rounds
once (cuBLAS's bias epilogue; eager's linear). The GELU reads that rounded value and computes
(v * 0.5) * (1 + erf(v / sqrt 2)) in f32 as the decomposed eager op does, rounding once.

`pdl=True` launches with programmatic dependent launch (sm_90): a program issues its first
weight chunk before `gdc_wait` (the weights are never written by the kernel before it), so the
weight stream starts while the previous kernel drains; every kernel here also signals its
dependents early.

A batch-8 step's [8, K] products stay cuBLAS's: on the H200 it runs them as fast as one row
(12.1 us for QKV at M=8 against 12.5 at M=1), where a Triton kernel summing a [M, BN, BK] block
per program was 5-16x slower (benchmarks/results/2026-12-02-h200-decode-gemv-group.md).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from ember.inductor.targets.cuda.gemv_blocks import config

ACTS = {None: 0, "gelu": 1}


@functools.cache
def _kernels() -> dict[str, Any]:
    from ember.inductor.targets.cuda import gemv_fused_kernels as k
    return {"pair": k.gemv_pair_kernel}


def _use_triton(x: torch.Tensor, triton: bool | None) -> bool:
    if triton is not None:
        return triton
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _check(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: str | None) -> None:
    N, K = w.shape
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != K:
        raise ValueError(f"gemv_pair: x must be [1, {K}] for a [{N}, {K}] weight, got "
                         f"{list(x.shape)}")
    if b is not None and (b.dim() != 1 or b.shape[0] != N):
        raise ValueError(f"gemv_pair: the bias must be [{N}], got {list(b.shape)}")
    if act not in ACTS:
        raise ValueError(f"gemv_pair: activation {act!r} is not one of {sorted(map(str, ACTS))}")


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              act: str | None) -> torch.Tensor:
    """The eager computation the kernel stands for: linear (bias in the product's f32
    epilogue, one rounding), then the erf GELU of the rounded value in f32."""
    y = (x.float() @ w.float().t() + (b.float() if b is not None else 0.0)).to(x.dtype)
    if act == "gelu":
        v = y.float()
        y = ((v * 0.5) * (1.0 + torch.erf(v * 0.7071067811865476))).to(x.dtype)
    return y


def gemv_pair(x1: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, act1: str | None,
              x2: torch.Tensor | None = None, w2: torch.Tensor | None = None,
              b2: torch.Tensor | None = None, act2: str | None = None, *,
              pdl: bool = False, triton: bool | None = None,
              blocks: tuple[tuple[int, int, int], ...] | None = None
              ) -> tuple[torch.Tensor, ...]:
    """(x1 @ w1.T + b1 [GELU], x2 @ w2.T + b2 [GELU]) in one launch (the second product
    optional: then one GEMV with its epilogue). x [1, K], w [N, K] with unit stride along K,
    b [N] or None, act None or "gelu". `blocks`: (BLOCK_N, BLOCK_K, warps) per product
    (default gemv_blocks.config's); the kernel takes the larger warp count."""
    two = w2 is not None
    _check(x1, w1, b1, act1)
    if two:
        assert x2 is not None and w2 is not None
        _check(x2, w2, b2, act2)
    pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str | None]] = [
        (x1, w1, b1, act1)]
    if x2 is not None and w2 is not None:
        pairs.append((x2, w2, b2, act2))
    if not _use_triton(x1, triton) or any(w.stride(1) != 1 for _, w, _, _ in pairs):
        return tuple(reference(*p) for p in pairs)
    # PDL is launch scheduling only (the interpreter has no grid dependency control)
    pdl = pdl and x1.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"
    outs = [torch.empty((1, w.shape[0]), dtype=x.dtype, device=x.device) for x, w, _, _ in pairs]
    cfg = list(blocks) if blocks is not None else [config(*w.shape) for _, w, _, _ in pairs]
    progs = [-(-w.shape[0] // c[0]) for (_, w, _, _), c in zip(pairs, cfg, strict=False)]
    args: list[Any] = []
    for (x, w, b, _), y in zip(pairs, outs, strict=True):
        bias = b.contiguous() if b is not None else y  # the kernel reads it at unit stride
        args += [x, w, bias, y, w.shape[0], x.stride(1), w.stride(0)]
    if not two:
        args += args[:]
    args.append(progs[0])
    const: dict[str, Any] = {}
    for i, ((_, w, b, act), c) in enumerate(zip(pairs * (1 if two else 2),
                                               cfg * (1 if two else 2), strict=True)):
        const.update({f"K{i + 1}": w.shape[1], f"BN{i + 1}": c[0], f"BK{i + 1}": c[1],
                      f"HB{i + 1}": b is not None, f"ACT{i + 1}": ACTS[act]})
    extra = {"launch_pdl": True} if pdl else {}
    _kernels()["pair"][(sum(progs),)](*args, **const, TWO=two, PDL=pdl,
                                      num_warps=max(c[2] for c in cfg), **extra)
    return tuple(outs)


__all__ = ["ACTS", "gemv_pair", "reference"]
