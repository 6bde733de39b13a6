"""The decode GEMVs' block sizes: a leaf module, so the GEMV kernels (gemv.py, gemv_fused.py)
share one table without importing each other."""

from __future__ import annotations

# (N, K) -> (BLOCK_N, BLOCK_K, warps): the fastest of 6-8 candidates per shape on the H200 with
# cold weights inside a CUDA graph (benchmarks/results/2026-12-02-h200-decode-step-kernels.md):
# the dolly-v2-3b linears and its lm_head
MEASURED = {(7680, 2560): (8, 512, 4), (2560, 2560): (4, 4096, 8), (10240, 2560): (16, 256, 4),
            (2560, 10240): (4, 2048, 8), (50280, 2560): (16, 512, 8)}


def config(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) for an [N, K] weight: a measured shape's, else the same rule
    the measurements follow: few rows per program where N is small (enough programs to keep
    ~3-4 MB of loads in flight), 8-16 kB chunks, 8 warps for the 16 kB ones."""
    got = MEASURED.get((n, k))
    if got is not None:
        return got
    bn = 4 if n <= 4096 else 8 if n <= 8192 else 16
    bk = (4096 if k <= 4096 else 2048) if bn == 4 else 512 if bn == 8 else 256
    bk = min(bk, max(64, 1 << (k - 1).bit_length()))
    return bn, bk, 8 if bn * bk >= 8192 else 4


__all__ = ["MEASURED", "config"]
