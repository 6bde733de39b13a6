"""Op database entries: the matmul family and scaled dot-product attention.

Shapes are small (sides up to 4) with 0- and 1-sized dims; operands come contiguous,
transposed or strided. Matmul operands hold NaN and +-inf sometimes (special values); attention
operands do not (the CPU flash kernel turns a NaN score row into zeros, a quirk not worth
copying), but masks hold -inf and fully masked rows.

The CUDA forms of attention (`_scaled_dot_product_efficient_attention`, `..._flash_attention`,
`..._cudnn_attention`: what sdpa dispatches to on a GPU) cannot run eagerly on a CPU machine:
their entries compare with a reference built from eager CPU ops (`_reference`) in the kernels'
output layouts and conventions, which packages/prims/tests/test_attention_cuda.py checks against
the kernels themselves where a GPU is present. Their placeholder results (philox seed/offset,
rng state, debug mask: unset without dropout) are compared by dtype and shape only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.harness import assert_outputs_close
from ember.testing.opdb import OPDB, Sample, entry

FLOATS = S.FLOATS
MATMUL_DTYPES = S.FLOATS + (torch.int64, torch.int32, torch.int8)
_SIDE = 4

# Products of up to 4 terms: eager's kernels (BLAS, mkldnn) and the prims' reference may sum in
# another order or, for f16/bf16, round once where eager rounds twice (or the other way).
MM_TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 2e-2),
          torch.float32: (1.3e-6, 2e-5)}
MM_REASON = ("a product of up to 4 terms summed in another order than eager's BLAS kernel; "
             "f16/bf16 rounded once from f32 where eager may round the product and the "
             "epilogue separately")
ATTN_TOL = {torch.float16: (5e-3, 5e-3), torch.bfloat16: (2e-2, 3e-2),
            torch.float32: (1e-5, 1e-5)}
ATTN_REASON = ("computed in f32 for f16/bf16; eager's CPU flash kernel rounds the softmax "
               "probabilities to the input dtype before the second product, and sums in "
               "another order")


def _t(draw: st.DrawFn, shape: Sequence[int], dt: torch.dtype, **kw: Any) -> torch.Tensor:
    return draw(S.tensors(shape, dt, **kw))


def _side(draw: st.DrawFn, empty: bool = True) -> int:
    return draw(S.dims(_SIDE) if empty else st.integers(1, _SIDE))


def _scalar(draw: st.DrawFn, dt: torch.dtype) -> Any:
    """beta/alpha: 0 and 1 likely (eager special-cases them)."""
    if dt.is_floating_point:
        return draw(st.one_of(st.sampled_from([0, 1, 0.0, 1.0]),
                              st.floats(-2, 2, allow_nan=False, width=32)))
    return draw(st.integers(-2, 3))


# ---- matmul family -----------------------------------------------------------------------------


@st.composite
def _mm(draw: st.DrawFn, batched: bool = False) -> Sample:
    dt = draw(S.dtypes(MATMUL_DTYPES))
    m, k, n = (_side(draw) for _ in range(3))
    b = (_side(draw),) if batched else ()
    return Sample((_t(draw, (*b, m, k), dt), _t(draw, (*b, k, n), dt)))


@st.composite
def _addmm(draw: st.DrawFn, batched: bool = False) -> Sample:
    dt = draw(S.dtypes(MATMUL_DTYPES))
    m, k, n = (_side(draw) for _ in range(3))
    b = (_side(draw),) if batched else ()
    out = (*b, m, n)
    # self broadcasts to the result: drop leading dims, set some dims to 1
    drop = draw(st.integers(0, len(out)))
    self_shape = tuple(1 if draw(st.booleans()) and draw(st.booleans()) else s
                       for s in out[drop:])
    kw: dict[str, Any] = {}
    if draw(st.booleans()):
        kw["beta"] = _scalar(draw, dt)
    if draw(st.booleans()):
        kw["alpha"] = _scalar(draw, dt)
    mat1 = _t(draw, (*b, m, k), dt)
    if dt.is_floating_point and mat1.numel() and draw(st.integers(0, 3)) == 0:
        kw["alpha"] = 0  # eager's f32/f64 addmm then skips the product: a NaN stays out
        mat1 = mat1.clone()
        mat1[(0,) * mat1.dim()] = math.nan
    return Sample((_t(draw, self_shape, dt), mat1, _t(draw, (*b, k, n), dt)), kw)


@st.composite
def _dot(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(MATMUL_DTYPES))
    k = _side(draw)
    return Sample((_t(draw, (k,), dt), _t(draw, (k,), dt)))


@st.composite
def _mv(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(MATMUL_DTYPES))
    m, k = _side(draw), _side(draw)
    return Sample((_t(draw, (m, k), dt), _t(draw, (k,), dt)))


@st.composite
def _matmul(draw: st.DrawFn) -> Sample:
    """Every rank combination 1-D..4-D, batch dims broadcasting (some set to 1 or dropped)."""
    dt = draw(S.dtypes(MATMUL_DTYPES))
    ra, rb = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    m, k, n = (_side(draw) for _ in range(3))
    base = [draw(st.integers(0, 3)) for _ in range(max(ra, rb, 2) - 2)]

    def batch(r: int) -> list[int]:
        dims = base[len(base) - max(r - 2, 0):] if r > 2 else []
        return [1 if draw(st.integers(0, 2)) == 0 else d for d in dims]

    a = [k] if ra == 1 else [*batch(ra), m, k]
    b = [k] if rb == 1 else [*batch(rb), k, n]
    return Sample((_t(draw, a, dt), _t(draw, b, dt)))


@st.composite
def _linear(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(FLOATS))
    lead = [_side(draw) for _ in range(draw(st.integers(0, 2)))]
    i, o = _side(draw), _side(draw)
    x = _t(draw, (*lead, i), dt)
    w = _t(draw, (o, i), dt)
    return Sample((x, w, _t(draw, (o,), dt) if draw(st.booleans()) else None))


def _mm_entry(op: str, samples: Any) -> None:
    entry(op, samples, "linalg", tol=MM_TOL, tol_reason=MM_REASON)


_mm_entry("aten.mm.default", lambda: _mm())
_mm_entry("aten.bmm.default", lambda: _mm(batched=True))
_mm_entry("aten.addmm.default", lambda: _addmm())
_mm_entry("aten.baddbmm.default", lambda: _addmm(batched=True))
_mm_entry("aten.dot.default", lambda: _dot())
_mm_entry("aten.mv.default", lambda: _mv())
_mm_entry("aten.matmul.default", lambda: _matmul())
_mm_entry("aten.linear.default", lambda: _linear())


# ---- attention ---------------------------------------------------------------------------------


@st.composite
def _attention(draw: st.DrawFn, form: str) -> Sample:
    """q [B, Hq, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev]; a bool or float mask broadcastable
    to [B, Hq, L, S] (float masks hold -inf, bool masks fully masked rows), or is_causal.
    `form`: "sdpa" (3-D or 4-D, 0-sized L/S, GQA, Ev != E), "cpu" (4-D, GQA, no 0 sizes: the
    CPU kernel crashes on them, E == Ev), "efficient" and "cudnn" (float bias only), "flash" (no
    mask, E == Ev)."""
    dt = draw(S.dtypes(FLOATS))
    empty = form == "sdpa"
    B, Hk = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    gqa = form in ("sdpa", "cpu") and draw(st.booleans())  # the CPU kernel groups heads too
    if gqa:  # real grouping: 2 key/value heads serve 2 or 3 query heads each
        Hk = 2
    Hq = Hk * (draw(st.integers(2, 3)) if gqa else 1)
    L, Sk = (draw(st.integers(0 if empty else 1, 5)) for _ in range(2))
    E = draw(st.sampled_from([1, 2, 4, 8]))
    Ev = draw(st.sampled_from([1, 3, E])) if form in ("sdpa", "efficient", "cudnn") else E
    lead = [B, Hq] if form != "sdpa" or gqa or draw(st.booleans()) else [B * Hq]
    klead = lead[:-1] + [Hk] if len(lead) == 2 else lead
    q = _t(draw, (*lead, L, E), dt, special=False)
    k = _t(draw, (*klead, Sk, E), dt, special=False)
    v = _t(draw, (*klead, Sk, Ev), dt, special=False)
    kind = draw(st.sampled_from(["none", "causal", "bool", "float"]))
    if form == "flash":
        kind = draw(st.sampled_from(["none", "causal"]))
    if form in ("cpu", "efficient", "cudnn") and kind == "bool":
        kind = "float"  # the fused kernels take float masks (sdpa converts bool ones first)
    kw: dict[str, Any] = {}
    mask = None
    if kind == "causal":
        kw["is_causal"] = True
    elif kind in ("bool", "float"):
        full = [*lead, L, Sk]
        lo = 4 if form in ("efficient", "cudnn") else 2
        rank = draw(st.integers(lo, len(full)))
        shape = [1 if i < len(full) - 2 and draw(st.booleans()) else s
                 for i, s in enumerate(full[len(full) - rank:])]
        if form == "cpu" and rank == 3:
            shape = [1, *shape]  # the CPU kernel takes 2-D or 4-D masks
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        keep = torch.rand(shape, generator=g) < 0.75
        if kind == "bool":
            mask = keep
        else:
            bias = _t(draw, shape, dt, special=False)
            mask = torch.where(keep, bias, torch.tensor(-math.inf, dtype=dt))
    if draw(st.booleans()):
        kw["scale"] = draw(st.sampled_from([0.5, 1.0, 0.125, 2.0]))
    if form == "sdpa":
        if mask is not None:
            kw["attn_mask"] = mask
        if gqa:
            kw["enable_gqa"] = True
        return Sample((q, k, v), kw)
    if form == "cpu":
        if mask is not None:
            kw["attn_mask"] = mask
        return Sample((q, k, v), kw)
    if form in ("efficient", "cudnn"):
        return Sample((q, k, v, mask, draw(st.booleans())), kw)
    return Sample((q, k, v), kw)


def _reference(s: Sample, *, bottom_right: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in f32 (f64 for f64) from eager CPU ops, independent of the prims: (output in
    the input dtype, logsumexp, -inf on fully masked rows). `s` is a fused form's sample."""
    q, k, v = s.args[:3]
    mask = s.args[3] if len(s.args) > 3 and isinstance(s.args[3], torch.Tensor) else None
    causal, scale = s.kwargs.get("is_causal", False), s.kwargs.get("scale")
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = q.to(acc) @ k.to(acc).transpose(-2, -1)
    scores = scores * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    L, Sk = scores.shape[-2:]
    if causal:
        allowed = torch.ones(L, Sk, dtype=torch.bool).tril(Sk - L if bottom_right else 0)
        scores = scores.masked_fill(~allowed, -math.inf)
    elif mask is not None:
        scores = scores + mask.to(acc)
    lse = torch.logsumexp(scores, -1)
    p = torch.softmax(scores, -1).nan_to_num(0.0)  # fully masked rows: 0/0 -> zeros
    return (p @ v.to(acc)).to(q.dtype), lse.float() if acc == torch.float32 else lse


def _efficient_reference(s: Sample) -> list[Any]:
    out, lse = _reference(s)
    lse = lse.float().masked_fill(lse == -math.inf, 0.0)  # the kernel stores 0 there
    L = s.args[0].shape[-2]
    width = (L + 31) // 32 * 32 if s.args[4] else 0
    padded = torch.full((*lse.shape[:-1], width), math.inf)
    padded[..., :min(L, width)] = lse[..., :width]
    return [out, padded, torch.tensor(0), torch.tensor(0)]


def _flash_reference(s: Sample) -> list[Any]:
    q, k = s.args[:2]
    out, lse = _reference(s, bottom_right=True)
    lse = lse.float().masked_fill(lse == -math.inf, math.inf)  # the kernel stores +inf there
    return [out, lse, q.shape[-2], k.shape[-2], torch.zeros(2, dtype=torch.uint64),
            torch.zeros((), dtype=torch.uint64), torch.zeros(0, dtype=q.dtype)]


def _cudnn_reference(s: Sample) -> list[Any]:
    q, k = s.args[:2]
    out, lse = _reference(s)
    return [out, lse.float().unsqueeze(-1), q.shape[-2], k.shape[-2], torch.tensor(0),
            torch.tensor(0)]


def _compare_fused(op: str, n: int) -> Any:
    """Output and logsumexp as values; the `n` trailing placeholder tensors (rng state, philox
    seed/offset, debug mask: unset by the kernels without dropout) by dtype and shape only."""

    def compare(sample: Sample, got: list[Any], want: list[Any]) -> None:
        assert len(got) == len(want) == 2 + n
        assert_outputs_close(OPDB[op], got[:2], want[:2])
        for g, w in zip(got[2:], want[2:], strict=True):
            assert (g.dtype, g.shape) == (w.dtype, w.shape), (g, w)
    return compare


_EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
_FLASH = "aten._scaled_dot_product_flash_attention.default"
_CUDNN = "aten._scaled_dot_product_cudnn_attention.default"
_CUDA_ONLY = ("; CUDA-only kernel: compared with attention from eager CPU ops in the kernel's "
              "output layout (the decomposition was checked against the kernel on an H200)")

entry("aten.scaled_dot_product_attention.default", lambda: _attention("sdpa"), "attention",
      tol=ATTN_TOL, tol_reason=ATTN_REASON)
entry("aten._scaled_dot_product_flash_attention_for_cpu.default", lambda: _attention("cpu"),
      "attention", tol=ATTN_TOL, tol_reason=ATTN_REASON)
entry(_EFFICIENT, lambda: _attention("efficient"), "attention", tol=ATTN_TOL,
      tol_reason=ATTN_REASON + _CUDA_ONLY, reference=_efficient_reference,
      compare=_compare_fused(_EFFICIENT, 2))
# results: max_q/max_k (2, 3) are literals after decomposition and cannot be graph outputs
entry(_FLASH, lambda: _attention("flash"), "attention", tol=ATTN_TOL,
      tol_reason=ATTN_REASON + _CUDA_ONLY, reference=_flash_reference,
      compare=_compare_fused(_FLASH, 3), results=(0, 1, 4, 5, 6))
entry(_CUDNN, lambda: _attention("cudnn"), "attention", tol=ATTN_TOL,
      tol_reason=ATTN_REASON + _CUDA_ONLY, reference=_cudnn_reference,
      compare=_compare_fused(_CUDNN, 2), results=(0, 1, 4, 5))


@st.composite
def _flash_cpu_backward(draw: st.DrawFn) -> Sample:
    """The CPU flash kernel's backward at a forward sample: eager's forward gives the saved
    output and logsumexp, the cotangent is drawn like the output."""
    s = draw(_attention("cpu"))
    q, k, v = s.args
    causal, scale = s.kwargs.get("is_causal", False), s.kwargs.get("scale")
    mask = s.kwargs.get("attn_mask")
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    grad = _t(draw, tuple(out.shape), q.dtype, special=False)
    kw: dict[str, Any] = {"scale": scale} if scale is not None else {}
    if mask is not None:
        kw["attn_mask"] = mask
    return Sample((grad, q, k, v, out, lse, 0.0, causal), kw)


entry("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
      lambda: _flash_cpu_backward(), "attention", tol=ATTN_TOL, tol_reason=ATTN_REASON,
      symbolic=False)  # its GQA grouping needs static head counts (real dynamic shapes keep them)
