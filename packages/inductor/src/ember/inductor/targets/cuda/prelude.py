"""The helpers every Triton kernel module of the CUDA target defines (render.py): NaN-propagating
maximum/minimum, Python's floor division and remainder, integer division by zero, shifts past
the width and integer powers as eager computes them; for Triton's interpreter, libdevice is
interp_libdevice.py (numpy's functions)."""

from __future__ import annotations

# helpers every kernel module defines (jit functions the kernels call)
PRELUDE = '''import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _maximum(a, b):  # NaN-propagating, as eager
    return tl.where((a != a) | (a > b), a, b)


@triton.jit
def _minimum(a, b):
    return tl.where((a != a) | (a < b), a, b)


@triton.jit
def _nanmax(a, b):  # a reduction's combine: NaN wins, as eager's amax (one max.NaN)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nanmin(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _sign(a):
    return (a > 0).to(a.dtype) - (a < 0).to(a.dtype)


@triton.jit
def _remainder(a, b):
    r = libdevice.fmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _floordiv(a, b):
    q = a // b
    return tl.where((q * b != a) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def _mod(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _mul(a, b):
    return a * b


# integer division and modulo: Triton's // and % truncate, as C; a zero divisor gives 0 (a GPU
# kernel cannot raise: eager's CPU kernels raise, its CUDA kernels give unspecified values)
@triton.jit
def _idiv(a, b):
    z = b == 0
    return tl.where(z, 0, a // tl.where(z, tl.full([], 1, b.dtype), b))


@triton.jit
def _ifmod(a, b):
    z = b == 0
    return tl.where(z, 0, a % tl.where(z, tl.full([], 1, b.dtype), b))


@triton.jit
def _iremainder(a, b):
    z = b == 0
    r = a % tl.where(z, tl.full([], 1, b.dtype), b)
    return tl.where(z, 0, tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r))


@triton.jit
def _shl(a, b, BITS: tl.constexpr):  # past the width or negative: 0, as eager
    out = (b < 0) | (b >= BITS)
    return tl.where(out, 0, a << tl.where(out, tl.full([], 0, b.dtype), b))


@triton.jit
def _shr(a, b, BITS: tl.constexpr):  # past the width or negative: the sign, as eager
    out = (b < 0) | (b >= BITS)
    return tl.where(out, tl.where(a < 0, -1, 0), a >> tl.where(out, tl.full([], 0, b.dtype), b))


# erf in f32 (prims.erf): a rational minimax fit of erf(x)/x in x*x on [0, 3.92] (beyond it
# erf rounds to 1 in f32; the fit crosses 1 near 4.02 and is 1 + 1.2e-5 at 4.5, so |x| clamped
# at 4.5 and the result at 1 give exactly 1 there): 10 fma, one reciprocal, no branch, ~18
# instructions against libdevice erff's ~30 (two polynomials, both taken under divergence,
# their coefficients selected per element). Within 10 ulp of erf over every f32 (libdevice:
# 2), relative near 0, never above 1 in magnitude, NaN in NaN out (test_triton_erf.py). On the
# H200 the bf16 layernorm+gelu kernel is bound by these instructions, not by memory
# (benchmarks/results/2026-12-02-h200-memory-bound-math.md).
@triton.jit
def _erf(x):
    a = tl.minimum(tl.abs(x), 4.5, propagate_nan=tl.PropagateNan.ALL)
    s = a * a
    p = 2.0423344722075853e-06 * s + 0.0002852490870282054
    p = p * s + 0.003791381372138858
    p = p * s + 0.05282778665423393
    p = p * s + 0.19103139638900757
    p = p * s + 1.1283791065216064
    q = 3.80310375476256e-05 * s + 0.0011683895718306303
    q = q * s + 0.015021092258393764
    q = q * s + 0.11436408013105392
    q = q * s + 0.502629816532135
    q = q * s + 1.0
    # q is in [1, 26]: a reciprocal without div.full's range fix-ups
    r = tl.minimum(libdevice.fast_dividef(a * p, q), 1.0, propagate_nan=tl.PropagateNan.ALL)
    return libdevice.copysign(r, x)




# digamma (prims.digamma; libdevice has none), as eager's CPU kernel computes it (calc_digamma):
# 0 -> -inf with the sign flipped, a negative integer -> NaN; x < 0 by reflection (the
# fractional part's tangent), then the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 10 (at
# most 10 steps past the reflection, unrolled) and the asymptotic series there
@triton.jit
def _digamma(x):
    neg = x < 0
    y = tl.where(neg, 1.0 - x, x)
    acc = tl.zeros_like(y)
    for _ in tl.static_range(10):
        small = y < 10.0
        acc = tl.where(small, acc - 1.0 / y, acc)
        y = tl.where(small, y + 1.0, y)
    z = 1.0 / (y * y)
    p = 8.33333333333333333333e-2 * z - 2.10927960927960927961e-2
    p = p * z + 7.57575757575757575758e-3
    p = p * z - 4.16666666666666666667e-3
    p = p * z + 3.96825396825396825397e-3
    p = p * z - 8.33333333333333333333e-3
    p = p * z + 8.33333333333333333333e-2
    series = tl.where(y < 1.0e17, z * p, 0.0)
    r = tl.where(y == 10.0, acc + 2.25175258906672110764, acc + tl.log(y) - 0.5 / y - series)
    frac = x - libdevice.trunc(x)  # pi / tan(pi frac) in f64, as eager (exact near the poles)
    f64 = frac.to(tl.float64)
    cot = (3.14159265358979323846 / libdevice.tan(3.14159265358979323846 * f64)).to(x.dtype)
    r = tl.where(neg, r - cot, r)
    r = tl.where(neg & (frac == 0), float("nan"), r)
    return tl.where(x == 0, -1.0 / x, r)  # -inf at +0, inf at -0

# bf16 outputs only (render.py's cuda_math="bf16"): cheaper math whose error is a small part
# of a bf16 ulp (2**-8 relative spacing), never used where an f32/f16 value is stored. (A bf16
# sin, a polynomial after a two-step reduction with libdevice's sinf for any block holding
# |x| > 2**20, measured slower on the H200: the block-wide max and its barrier cost more than
# the ~12 instructions an element it saved; pointwise chain bf16 85.8% of copy vs 88.9.)
# 1 + erf(C * x) (a gelu's, C = 1/sqrt(2) folded into the coefficients at compile time):
# 2 / (1 + 2 ** (-C x R(C |x|))), R a degree-5 minimax fit of log2((1 + erf)/(1 - erf)) / x
# in |x| on [0, 4] (past 4 the fit only grows, so 1 + erf stays within 3e-11 of the true
# value, below 1.6e-8). Relative error <= 9.3e-4 for C x >= -4 (a quarter of a bf16 ulp;
# relative in the lower tail, where 1 + erf is small, unlike 1 + _erf(x)), absolute <= 2e-8
# beyond; ~9 instructions against _erf's 18 plus the add and the scaling. 2 at +inf, 0 at -inf, NaN in NaN out (test_triton_bf16_math.py). A gelu's
# (y * 0.5) * (1 + erf(C y)) is y * _gelu_phi_bf16(y, C): half of it, two multiplies fewer
# (layernorm+gelu bf16 on sm_90: 36.3 SASS instructions per element -> 24.5 with _up_bf16).
@triton.jit
def _erf1p_bf16(x, C: tl.constexpr):
    return libdevice.fast_dividef(2.0, 1.0 + libdevice.exp2(_erf_exponent(x, C)))


@triton.jit
def _gelu_phi_bf16(x, C: tl.constexpr):  # (1 + erf(C x)) / 2: a gelu's y * 0.5 * (1 + erf)
    return libdevice.fast_dividef(1.0, 1.0 + libdevice.exp2(_erf_exponent(x, C)))


@triton.jit
def _erf_exponent(x, C: tl.constexpr):  # -log2((1 + erf(C x)) / (1 - erf(C x))), fitted
    a = tl.abs(x)  # no clamp: the fit stays above 6.7 past 4 (e only grows)
    p = (-0.0009105989593081176 * C * C * C * C * C * C) * a + (
        0.006350887473672628 * C * C * C * C * C)
    p = p * a + 0.02471012808382511 * C * C * C * C
    p = p * a - 0.3762096166610718 * C * C * C
    p = p * a + 0.06997891515493393 * C * C
    p = p * a - 3.2734391689300537 * C
    return x * p


# bf16 -> f32 of a load: the bits shifted up 16 (exact). cvt.f32.bf16 of a packed pair's upper
# half takes two instructions (a byte permute, then the shift); this takes one per value.
@triton.jit
def _up_bf16(v):
    return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)

@triton.jit
def _ipow(a, b, BITS: tl.constexpr, SIGNED: tl.constexpr):  # square and multiply
    one = tl.full([], 1, a.dtype)
    base = a + tl.zeros_like(b)
    e = b + tl.zeros_like(a)
    r = tl.zeros_like(base) + one
    for _ in tl.static_range(BITS):
        r = tl.where((e & one) != 0, r * base, r)
        base = base * base
        e = e >> one
    if SIGNED:  # a negative exponent: 1 ** b, (-1) ** b, else 0 (a ** b truncated)
        neg = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & one) != 0, -1, 1), 0))
        r = tl.where(b < 0, neg.to(r.dtype), r)
    return r
'''


INTERP_LIBDEVICE = "from ember.inductor.targets.cuda import interp_libdevice as libdevice"
GPU_LIBDEVICE = "from triton.language.extra import libdevice"


def prelude(interpret: bool) -> str:
    """The helpers; for Triton's interpreter, which has no libdevice, numpy's functions in its
    place (interp_libdevice.py)."""
    if not interpret:
        return PRELUDE
    return PRELUDE.replace(GPU_LIBDEVICE, INTERP_LIBDEVICE)


__all__ = ["GPU_LIBDEVICE", "INTERP_LIBDEVICE", "PRELUDE", "prelude"]
