"""The Triton kernels of gemv_fused.py (a module of their own: a jit function calls another by
its global name, and Triton is imported only where a kernel runs)."""

import triton
import triton.language as tl


@triton.jit
def _seg(pid, x_ptr, w_ptr, b_ptr, y_ptr, N, sx, sw,  # type: ignore[no-untyped-def]
         K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
         ACT: tl.constexpr, PDL: tl.constexpr):
    n = pid * BN + tl.arange(0, BN)
    nm = n < N
    k = tl.arange(0, BK)
    km = k < K
    # the first chunk of the weight before waiting on the previous kernel (PDL)
    w = tl.load(w_ptr + n[:, None] * sw + k[None, :], mask=nm[:, None] & km[None, :],
                other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + k * sx, mask=km, other=0.0)
    acc = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
    for k0 in range(BK, K, BK):
        k = k0 + tl.arange(0, BK)
        km = k < K
        w = tl.load(w_ptr + n[:, None] * sw + k[None, :], mask=nm[:, None] & km[None, :],
                    other=0.0)
        x = tl.load(x_ptr + k * sx, mask=km, other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)
    if ACT == 1:  # erf GELU of the rounded linear output, as eager's two ops
        v = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
        acc = (v * 0.5) * (1.0 + tl.math.erf(v * 0.7071067811865476))
    tl.store(y_ptr + n, acc.to(y_ptr.dtype.element_ty), mask=nm)

@triton.jit
def gemv_pair_kernel(  # type: ignore[no-untyped-def]
        x1, w1, b1, y1, N1, sx1, sw1, x2, w2, b2, y2, N2, sx2, sw2, P1,
        K1: tl.constexpr, BN1: tl.constexpr, BK1: tl.constexpr, HB1: tl.constexpr,
        ACT1: tl.constexpr, K2: tl.constexpr, BN2: tl.constexpr, BK2: tl.constexpr,
        HB2: tl.constexpr, ACT2: tl.constexpr, TWO: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if TWO:
        if pid < P1:
            _seg(pid, x1, w1, b1, y1, N1, sx1, sw1, K1, BN1, BK1, HB1, ACT1, PDL)
        else:
            _seg(pid - P1, x2, w2, b2, y2, N2, sx2, sw2, K2, BN2, BK2, HB2, ACT2, PDL)
    else:
        _seg(pid, x1, w1, b1, y1, N1, sx1, sw1, K1, BN1, BK1, HB1, ACT1, PDL)
