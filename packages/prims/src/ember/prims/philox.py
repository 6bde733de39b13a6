"""Philox4x32-10, ember's one random number generator, and its counter layout.

The layout (every backend — reference, C++, Triton — implements exactly this, so all give
bitwise the same numbers):

- key: `k0 = seed mod 2**32`, `k1 = (seed >> 32) mod 2**32` (seed taken as a 64-bit integer);
- element `i` of the output (row-major linear index) uses the counter
  `(c0, c1, c2, c3) = (lo32(offset + i), hi32(offset + i), 0, 0)`;
- ten Philox rounds (multipliers 0xD2511F53, 0xCD9E8D57; key increments 0x9E3779B9,
  0xBB67AE85, added between rounds); the words `c0` and `c1` of the result are used;
- uniform in [0, 1) with `p` bits of precision, p = the dtype's significand digits
  (f16 11, bf16 8, f32 24, f64 53): `(c0 >> (32 - p)) * 2**-p` for p <= 32, and
  `(c0 * 2**21 + (c1 >> 11)) * 2**-53` for f64. Every value is exact in the dtype, so no
  rounding can reach 1.0.

A random op consuming N elements advances the offset by N. `prims.philox_uniform`'s `skip=`
attribute (an int or size expression, default 0) adds to the offset operand: element `i` uses
`offset + skip + i`. The decompose pass gives each random op of a graph the graph's one offset
parameter and, as `skip`, the elements consumed by the graph's earlier random ops
(docs/decisions.md, "Random numbers in graphs").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF
ROUNDS = 10
SIGNIFICAND_BITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * b for a constant a < 2**32 and int64 b < 2**32,
    computed in 16-bit halves so nothing overflows int64."""
    lo_part = b * (a & 0xFFFF)          # < 2**48
    hi_part = b * (a >> 16)             # < 2**48
    hi = (hi_part + (lo_part >> 16)) >> 16
    lo = (lo_part + ((hi_part & 0xFFFF) << 16)) & MASK32
    return hi & MASK32, lo


def philox4x32(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
               k0: int, k1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ten Philox rounds over int64 tensors holding uint32 words."""
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox_words(seed: int, offset: int, n: int, device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Words c0 and c1 for elements 0..n-1 (int64 tensors holding uint32 values)."""
    seed &= (1 << 64) - 1
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    idx = torch.arange(n, dtype=torch.int64, device=device) + offset
    # lo32/hi32 of offset + i, as unsigned words of the 64-bit sum
    c0 = idx & MASK32
    c1 = (idx >> 32) & MASK32
    zero = torch.zeros_like(c0)
    w0, w1, _, _ = philox4x32(c0, c1, zero, zero, k0, k1)
    return w0, w1


def uniform(seed: int, offset: int, shape: Sequence[int], dtype: torch.dtype,
            device: torch.device | str = "cpu") -> torch.Tensor:
    """Uniform [0, 1) numbers in ember's layout (see the module docstring)."""
    if dtype not in SIGNIFICAND_BITS:
        raise ValueError(f"philox uniform numbers are floating point, not {dtype}")
    n = 1
    for d in shape:
        n *= int(d)
    w0, w1 = philox_words(seed, offset, n, device)
    p = SIGNIFICAND_BITS[dtype]
    if p <= 32:
        out = (w0 >> (32 - p)).to(torch.float64) * 2.0**-p
    else:
        out = ((w0 << 21) + (w1 >> 11)).to(torch.float64) * 2.0**-53
    return out.to(dtype).reshape(tuple(int(d) for d in shape))
