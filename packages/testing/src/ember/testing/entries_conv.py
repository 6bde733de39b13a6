"""Op database entries: convolution and pooling.

Convolutions draw 1-d, 2-d and 3-d problems with stride, padding, dilation, groups, an optional
bias, and transposed ones with output_padding (below max(stride, dilation), as eager requires);
spatial sizes are chosen so the output is non-empty, batch may be 0. Pooling draws 3-D and 4-D
inputs with the kernel/stride/padding/dilation/ceil_mode combinations eager accepts (padding at
most half the kernel); max pooling sees NaN, +-inf and ties (integer inputs of few values).
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.opdb import Sample, entry

CONV_DTYPES = S.FLOATS + (torch.int64,)
POOL_DTYPES = S.FLOATS + (torch.int64, torch.int32, torch.uint8)

CONV_TOL = {torch.float16: (2e-3, 4e-3), torch.bfloat16: (1.6e-2, 3e-2),
            torch.float32: (1.3e-6, 3e-5)}
CONV_REASON = ("sums of up to 54 products in another order than eager's kernel (mkldnn or the "
               "slow path, which also differ between transposed and direct forms); f16/bf16 "
               "with a bias rounded twice (convolution, then the bias add) where eager rounds once")
AVG_TOL = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 8e-3),
           torch.float32: (1.3e-6, 1e-5)}
AVG_REASON = ("window sums in another order than eager's loop (f32 for f16/bf16, rounded "
              "once as eager does)")


@st.composite
def _conv(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(CONV_DTYPES))
    n = draw(st.integers(1, 3))
    transposed = draw(st.booleans())
    groups = draw(st.integers(1, 2))
    cin, cout = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    batch = draw(st.sampled_from([0, 1, 2]))
    side = 4 if n < 3 else 3
    ks: list[int] = []
    st_: list[int] = []
    pd: list[int] = []
    dl: list[int] = []
    op: list[int] = []
    sizes: list[int] = []
    for _ in range(n):
        k = draw(st.integers(1, 3))
        s, d = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        p = draw(st.integers(0, 2))
        if transposed:
            o = draw(st.integers(0, max(s, d) - 1))
            # output (size-1)*s - 2p + d(k-1) + o + 1 must be >= 1
            lo = max(1, -(-(2 * p - d * (k - 1) - o) // s) + 1)
            size = draw(st.integers(lo, max(lo, side)))
        else:
            o = 0
            lo = max(1, d * (k - 1) + 1 - 2 * p)
            size = draw(st.integers(lo, max(lo, side)))
        for acc, val in ((ks, k), (st_, s), (pd, p), (dl, d), (op, o), (sizes, size)):
            acc.append(val)
    # eager's bf16 grouped transposed convolution (CPU, torch 2.13) lets a NaN of one group
    # reach the other group's outputs: its samples hold no NaN/inf
    x = draw(S.tensors((batch, cin, *sizes), dt,
                       special=not (transposed and dt == torch.bfloat16)))
    wshape = (cin, cout // groups, *ks) if transposed else (cout, cin // groups, *ks)
    # transposed: no inf/NaN in the weight, see conv.py (the dilated input's zeros meet it)
    w = draw(S.tensors(wshape, dt, special=not transposed))
    bias = draw(S.tensors((cout,), dt)) if draw(st.booleans()) else None
    one = draw(st.booleans()) and len(set(st_)) == 1  # a 1-entry list stands for all dims
    stride = st_[:1] if one else st_
    return Sample((x, w, bias, stride, pd, dl, transposed, op if transposed else [0] * n,
                   groups))


# symbolic=False: duck sizing makes the channel counts independent symbols, and
# prims.convolution's exact shape rule cannot prove `in_channels == groups * weight.shape[1]`
# for them (real dynamic shapes keep channels static). packages/prims/tests/test_conv_attention_decomp.py covers
# convolutions and pooling with symbolic batch and spatial sizes.
entry("aten.convolution.default", lambda: _conv(), "convolution", tol=CONV_TOL,
      tol_reason=CONV_REASON, symbolic=False)


@st.composite
def _convolution_(draw: st.DrawFn) -> Sample:
    s = draw(_conv())
    return Sample((*s.args, False, True, True, True))


entry("aten._convolution.default", lambda: _convolution_(), "convolution", tol=CONV_TOL,
      tol_reason=CONV_REASON, symbolic=False)  # as aten.convolution


# ---- pooling -----------------------------------------------------------------------------------


@st.composite
def _pool_input(draw: st.DrawFn, dtypes: tuple[torch.dtype, ...], min_side: int
                ) -> torch.Tensor:
    dt = draw(S.dtypes(dtypes))
    lead = [draw(st.sampled_from([0, 1, 2]))] if draw(st.booleans()) else []
    c = draw(st.integers(1, 2))
    h, w = (draw(st.integers(min_side, 5)) for _ in range(2))
    if dt.is_floating_point:
        return draw(S.tensors((*lead, c, h, w), dt))
    return draw(S.tensors((*lead, c, h, w), dt, low=0, high=3))  # ties


@st.composite
def _window(draw: st.DrawFn, x: torch.Tensor, dilation: bool) -> dict[str, Any]:
    """kernel, stride, padding (<= kernel // 2), dilation: the window fits the padded input."""
    h, w = x.shape[-2:]
    ks: list[int] = []
    ss: list[int] = []
    ps: list[int] = []
    ds: list[int] = []
    for size in (h, w):
        while True:
            k = draw(st.integers(1, 3))
            d = draw(st.integers(1, 2)) if dilation else 1
            p = draw(st.integers(0, k // 2))
            if size + 2 * p >= d * (k - 1) + 1:
                break
        for acc, val in ((ks, k), (ss, draw(st.integers(1, 3))), (ps, p), (ds, d)):
            acc.append(val)
    kw: dict[str, Any] = {"kernel_size": ks}
    if draw(st.booleans()):
        kw["stride"] = ss
    if draw(st.booleans()) or any(ps):
        kw["padding"] = ps
    if dilation and (draw(st.booleans()) or any(d > 1 for d in ds)):
        kw["dilation"] = ds
    kw["ceil_mode"] = draw(st.booleans())
    return kw


@st.composite
def _max_pool(draw: st.DrawFn) -> Sample:
    x = draw(_pool_input(S.FLOATS + (torch.int64, torch.int32, torch.uint8), 1))
    kw = draw(_window(x, dilation=True))
    return Sample((x, kw.pop("kernel_size")), kw)


@st.composite
def _avg_pool(draw: st.DrawFn) -> Sample:
    x = draw(_pool_input(S.FLOATS + (torch.int64,), 1))
    kw = draw(_window(x, dilation=False))
    kw["count_include_pad"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        kw["divisor_override"] = draw(st.integers(1, 5))
    return Sample((x, kw.pop("kernel_size")), kw)


@st.composite
def _adaptive(draw: st.DrawFn) -> Sample:
    x = draw(_pool_input(S.FLOATS, 1))
    h, w = x.shape[-2:]
    out = [draw(st.integers(1, h + 1)), draw(st.integers(1, w + 1))]
    return Sample((x, out))


_STATIC = ("spatial sizes must be static: windows are laid out at decomposition time "
           "(batch and channel dims may be symbolic)")
# symbolic=False: _STATIC (the harness makes every dim >= 2 symbolic)
entry("aten.max_pool2d_with_indices.default", lambda: _max_pool(), "pooling", symbolic=False)
entry("aten.avg_pool2d.default", lambda: _avg_pool(), "pooling", tol=AVG_TOL,
      tol_reason=AVG_REASON, symbolic=False)
entry("aten._adaptive_avg_pool2d.default", lambda: _adaptive(), "pooling", tol=AVG_TOL,
      tol_reason=AVG_REASON, symbolic=False)
entry("aten.adaptive_avg_pool2d.default", lambda: _adaptive(), "pooling", tol=AVG_TOL,
      tol_reason=AVG_REASON, symbolic=False)


# what training's VJP rule of a convolution emits; prims would write the weight gradient as a
# convolution with an image-sized kernel, which oneDNN runs 2-5x slower
KEPT_WHOLE = ("kept whole: torch's backward kernel as one extern call (its rule runs it, checked "
              "against eager by packages/runtime/tests/test_training_conv_bn.py)")


@st.composite
def _conv_backward(draw: st.DrawFn) -> Sample:
    """torch's convolution backward at a floating-point convolution sample, every gradient
    asked for (bias_sizes given whether or not the forward had a bias: the bias gradient is
    the cotangent's sum either way)."""
    s = draw(_conv().filter(lambda s: s.args[0].dtype.is_floating_point))
    x, w, bias, stride, pd, dl, transposed, op, groups = s.args
    y = torch.ops.aten.convolution(x, w, bias, stride, pd, dl, transposed, op, groups)
    grad = draw(S.tensors(tuple(y.shape), y.dtype, special=False))
    cout = w.shape[1] * groups if transposed else w.shape[0]
    return Sample((grad, x, w, [cout], stride, pd, dl, transposed, op, groups,
                   [True, True, True]))


entry("aten.convolution_backward.default", lambda: _conv_backward(), "convolution",
      tol=CONV_TOL, tol_reason=CONV_REASON, symbolic=False,
      gaps={"decomposition": KEPT_WHOLE})  # the later checks skip it in their data files
