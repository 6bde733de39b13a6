"""Op database entries: softmax and normalization.

Norm parameters are drawn in the input's dtype or, for f16/bf16 input, sometimes in f32 (eager's
"mixed" CPU kernels; the saved statistics are then f32). Parameters are finite, running variances
positive; inputs hold NaN and infinities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.harness import assert_outputs_close, eager
from ember.testing.opdb import OPDB, Compare, Sample, entry

FLOATS = S.FLOATS
LOW = (torch.float16, torch.bfloat16)
_EPS = st.sampled_from([1e-5, 1e-3, 0.1])


def _param_dtype(draw: st.DrawFn, dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in LOW and draw(st.booleans()) else dt


def _maybe(draw: st.DrawFn, shape: tuple[int, ...], dt: torch.dtype, layout: str | None = None
           ) -> torch.Tensor | None:
    """An optional affine parameter, finite: with an infinite weight, eager's CPU form
    x * a + b gives inf - inf = NaN where (x - mean) * rstd * w gives +-inf."""
    if not draw(st.booleans()):
        return None
    return draw(S.tensors(shape, dt, special=False, layout=layout))


def _cpu_conventions(names: Sequence[str], sample: Sample, got: list[Any], want: list[Any]
                     ) -> tuple[list[Any], list[Any]]:
    """Decompositions produce the node's declared types, which come from torch's meta kernels
    (eager CUDA's conventions). Eager on CPU differs for norms, undone here:
    - statistics in another dtype (f16/bf16 input: CPU keeps the half type where meta says f32,
      except group norm with f32 parameters, the other way round): both are compared in the
      coarser dtype;
    - batch norm in eval: CPU's save_mean/save_invstd are empty, meta's the running mean and
      1/sqrt(running_var + eps): ember's are compared with those, computed in f64;
    - the mean (result 1) of a set holding an infinity: CPU's Welford kernels give NaN (or
      +-inf, by order), ember the exact +-inf."""
    got, want = list(got), list(want)
    args = dict(zip(names, sample.args, strict=False))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w.shape == (0,) and g.shape != (0,) and i in (1, 2) and "running_var" in args:
            w = (args["running_mean"].double() if i == 1 else
                 (args["running_var"].double() + args["eps"]).rsqrt()).to(g.dtype)
        elif g.dtype != w.dtype:
            coarse = max(g.dtype, w.dtype, key=lambda d: torch.finfo(d).eps)
            g, w = g.to(coarse), w.to(coarse)
        if i == 1 and g.shape == w.shape:
            w = torch.where(g.isinf() & w.isnan(), g, w)
        got[i], want[i] = g, w
    return got, want


def _f64(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
        return v.detach().double()
    return [_f64(x) for x in v] if isinstance(v, (list, tuple)) else v


def _at_least_as_accurate(op: str, i: int, g: torch.Tensor, w: torch.Tensor, r: torch.Tensor
                          ) -> None:
    """ember's output is no further from the f64 result than eager's, up to the default
    tolerance of the dtype; where either is not finite, they agree exactly."""
    assert g.dtype == w.dtype and g.shape == w.shape, f"{op} output {i}: {g.dtype} {g.shape}"
    rtol, atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                  torch.float32: (1.3e-6, 1e-5)}.get(g.dtype, (1e-7, 1e-7))
    gd, wd, rd = g.double(), w.double(), r.double()
    finite = gd.isfinite() & wd.isfinite() & rd.isfinite()
    torch.testing.assert_close(gd[~finite], wd[~finite], rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"{op} output {i} (non-finite places): {m}")
    bound = (wd - rd).abs() + atol + rtol * rd.abs()
    worse = ((gd - rd).abs() > bound) & finite
    assert not worse.any(), (f"{op} output {i}: further from the f64 result than eager at "
                             f"{worse.nonzero()[:4].tolist()}: ember {gd[worse][:4].tolist()}, "
                             f"eager {wd[worse][:4].tolist()}, f64 {rd[worse][:4].tolist()}")


def _norm_compare(op: str, names: Sequence[str] = ()) -> Compare:
    """Against eager (its CPU conventions undone) at the entry's tolerance; failing that, as
    torch's own decomposition tests do, against the op run in f64: ember must be at least as
    accurate as eager. (Eager's CPU norms apply the statistics as x * a + b, which cancels
    when x is near the mean; ember computes (x - mean) * rstd, which does not.)"""

    def compare(sample: Sample, got: Any, want: Any) -> None:
        got, want = _cpu_conventions(names, sample, got, want)
        try:
            assert_outputs_close(OPDB[op], got, want)
            return
        except AssertionError:
            ref = eager(op, Sample(tuple(_f64(a) for a in sample.args),
                                   {k: _f64(v) for k, v in sample.kwargs.items()}))
        _, ref = _cpu_conventions(names, sample, [g.double() for g in got], ref)
        for i, (g, w, r) in enumerate(zip(got, want, ref, strict=True)):
            _at_least_as_accurate(op, i, g, w, r)
    return compare


# ---- softmax --------------------------------------------------------------------------------


@st.composite
def _softmax(draw: st.DrawFn) -> Sample:
    """(x, dim, half_to_float): eager's CPU kernels take half_to_float=False only."""
    x = draw(S.tensors(draw(S.shapes()), draw(S.dtypes(FLOATS))))
    return Sample((x, S.dim_of(draw, x.dim()), False))


@st.composite
def _safe_softmax(draw: st.DrawFn) -> Sample:
    """(x, dim, dtype=): integer input needs a float dtype; some rows along dim are all -inf
    (what the op exists for)."""
    dt = draw(S.dtypes(FLOATS + S.INTS))
    x = draw(S.tensors(draw(S.shapes()), dt))
    dim = S.dim_of(draw, x.dim())
    if dt.is_floating_point and draw(st.booleans()):
        x = x.clone()
        others = [e for e in range(x.dim()) if e != dim % max(x.dim(), 1)]
        if not others:
            x.fill_(-torch.inf)
        else:
            e = draw(st.sampled_from(others))
            x.narrow(e, 0, min(1, x.shape[e])).fill_(-torch.inf)
    kw: dict[str, Any] = {}
    if not dt.is_floating_point or draw(st.booleans()):
        kw["dtype"] = draw(S.dtypes(FLOATS))
    return Sample((x, dim), kw)


_SOFTMAX_TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}
_SOFTMAX_REASON = ("computed in f32 and rounded once; eager's CPU kernels round to the half "
                   "type in between (x - max, the sum), a one-ulp difference")
entry("aten._softmax.default", lambda: _softmax(), "normalization", tol=_SOFTMAX_TOL,
      tol_reason=_SOFTMAX_REASON)
entry("aten._log_softmax.default", lambda: _softmax(), "normalization", tol=_SOFTMAX_TOL,
      tol_reason=_SOFTMAX_REASON)
entry("aten._safe_softmax.default", lambda: _safe_softmax(), "normalization",
      tol=_SOFTMAX_TOL, tol_reason=_SOFTMAX_REASON)

# ---- layer norm -----------------------------------------------------------------------------

_NORM_TOL = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}
_NORM_REASON = ("computed in f32 and rounded once; eager's CPU kernels compute the statistics "
                "with Welford/cascade sums and apply them as x * a + b: one ulp of the half "
                "type apart")


@st.composite
def _layer_norm(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(FLOATS))
    shape = draw(S.shapes(min_rank=1))
    k = draw(st.integers(1, len(shape)))
    normalized = list(shape[len(shape) - k:])
    pdt = _param_dtype(draw, dt)
    x = draw(S.tensors(shape, dt))
    w = _maybe(draw, tuple(normalized), pdt)
    b = _maybe(draw, tuple(normalized), pdt)
    return Sample((x, normalized, w, b, draw(_EPS)))


entry("aten.native_layer_norm.default", lambda: _layer_norm(), "normalization", tol=_NORM_TOL,
      tol_reason=_NORM_REASON, compare=_norm_compare("aten.native_layer_norm.default"))



@st.composite
def _rms_norm(draw: st.DrawFn) -> Sample:
    """(input, normalized_shape, weight or None, eps or None: the opmath type's epsilon)."""
    dt = draw(S.dtypes(FLOATS))
    shape = draw(S.shapes(min_rank=1))
    k = draw(st.integers(1, len(shape)))
    normalized = list(shape[len(shape) - k:])
    x = draw(S.tensors(shape, dt))
    w = _maybe(draw, tuple(normalized), _param_dtype(draw, dt))
    return Sample((x, normalized, w, draw(st.one_of(st.none(), _EPS))))


# what F.rms_norm runs on a GPU (on the CPU it is composite: pow, mean, rsqrt, mul)
entry("aten._fused_rms_norm.default", lambda: _rms_norm(), "normalization", tol=_NORM_TOL,
      tol_reason=_NORM_REASON, compare=_norm_compare("aten._fused_rms_norm.default"))

# ---- weight norm ----------------------------------------------------------------------------


@st.composite
def _weight_norm(draw: st.DrawFn) -> Sample:
    """v and g (v's shape, 1 but at `dim`); eager's kernel takes only the first or last dim,
    and no empty tensor (it divides by zero: a floating point exception kills the process).
    Rank 2 or more: for a vector torch's meta kernel declares the norms [1] where the kernel
    returns one per element, and a graph's types are the meta kernel's. Contiguous: eager's CPU
    kernel reads a transposed or strided v as if it were contiguous (wrong values; ember
    computes the formula)."""
    dt = draw(S.dtypes(FLOATS))
    shape = draw(S.shapes(min_rank=2, allow_empty=False))
    dim = draw(st.sampled_from(sorted({0, len(shape) - 1})))
    gshape = tuple(n if i == dim else 1 for i, n in enumerate(shape))
    return Sample((draw(S.tensors(shape, dt, layout="contiguous")),
                   draw(S.tensors(gshape, dt, special=False, layout="contiguous")), dim))


entry("aten._weight_norm_interface.default", lambda: _weight_norm(), "normalization",
      tol=_NORM_TOL, tol_reason="computed in f32 and rounded once; eager's half kernel sums "
      "the squares in another order",
      compare=_norm_compare("aten._weight_norm_interface.default"))

# ---- batch norm -----------------------------------------------------------------------------


@st.composite
def _batch_norm_parts(draw: st.DrawFn, training: bool | None) -> dict[str, Any]:
    """Input [N, C, *] with at least one element (eager requires it), affine parameters,
    running statistics (variance positive), momentum and eps. In training, each channel has
    two or more values: torch's meta kernel computes n / (n - 1) in Python and fails at n = 1."""
    dt = draw(S.dtypes(FLOATS))
    shape = list(draw(S.shapes(min_rank=2, allow_empty=False)))
    training = draw(st.booleans()) if training is None else training
    if training and math.prod(shape) // shape[1] < 2:
        shape[0] = 2
    c = shape[1]
    pdt = _param_dtype(draw, dt)
    return {
        "input": draw(S.tensors(tuple(shape), dt)),
        "weight": _maybe(draw, (c,), pdt),
        "bias": _maybe(draw, (c,), pdt),
        "running_mean": draw(S.tensors((c,), pdt, low=-1, high=1, special=False)),
        "running_var": draw(S.tensors((c,), pdt, low=0.1, high=2, special=False)),
        "training": training,
        "momentum": draw(st.sampled_from([0.1, 0.5])),
        "eps": draw(_EPS),
    }


def _batch_norm(*names: str, training: bool | None = None) -> Any:
    """Samples of a batch-norm overload taking the arguments `names`, in order."""

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        parts = draw(_batch_norm_parts(training))
        return Sample(tuple(parts[n] for n in names))
    return lambda: gen()


_IN = ("input", "weight", "bias")
_STATS = ("running_mean", "running_var")
_HYPER = ("momentum", "eps")
_BATCH_NORMS: dict[str, tuple[tuple[str, ...], bool | None]] = {
    "aten.native_batch_norm.default": ((*_IN, *_STATS, "training", *_HYPER), None),
    "aten._native_batch_norm_legit.default": ((*_IN, *_STATS, "training", *_HYPER), None),
    # training=False crashes eager (there are no statistics)
    "aten._native_batch_norm_legit.no_stats": ((*_IN, "training", *_HYPER), True),
    "aten._native_batch_norm_legit_no_training.default": ((*_IN, *_STATS, *_HYPER), None),
    "aten._native_batch_norm_legit_functional.default":
        ((*_IN, *_STATS, "training", *_HYPER), None),
}
for _op, (_names, _training) in _BATCH_NORMS.items():
    entry(_op, _batch_norm(*_names, training=_training), "normalization", tol=_NORM_TOL,
          tol_reason=_NORM_REASON, compare=_norm_compare(_op, _names))

# The GPU forms of batch norm (what aten.batch_norm dispatches to on cuDNN and MIOpen) have no
# CPU kernel: their reference is native_batch_norm's eager CPU result (+ cuDNN's reserve buffer,
# empty: the decomposition's), compared as native_batch_norm is. The weight is required.
_NATIVE_BN = "aten.native_batch_norm.default"
_GPU_BN_NAMES = (*_IN, *_STATS, "training", *_HYPER)


def _gpu_batch_norm() -> Any:
    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        parts = draw(_batch_norm_parts(None))
        if parts["weight"] is None:
            parts["weight"] = torch.ones(parts["running_mean"].shape,
                                         dtype=parts["running_mean"].dtype)
        return Sample(tuple(parts[n] for n in _GPU_BN_NAMES))
    return lambda: gen()


def _gpu_bn_reference(reserve: bool) -> Any:
    def reference(s: Sample) -> list[Any]:
        out = eager(_NATIVE_BN, s)
        return [*out, torch.empty(0, dtype=torch.uint8)] if reserve else out
    return reference


def _gpu_bn_compare(reserve: bool) -> Compare:
    native = _norm_compare(_NATIVE_BN, _GPU_BN_NAMES)

    def compare(sample: Sample, got: Any, want: Any) -> None:
        native(sample, list(got)[:3], list(want)[:3])
        if reserve:
            assert (got[3].dtype, got[3].shape) == (torch.uint8, (0,)), got[3]
    return compare


_GPU_ONLY = ("; a GPU kernel: compared with native_batch_norm's eager CPU result (the "
             "decomposition is the same)")
entry("aten.cudnn_batch_norm.default", _gpu_batch_norm(), "normalization", tol=_NORM_TOL,
      tol_reason=_NORM_REASON + _GPU_ONLY, reference=_gpu_bn_reference(True),
      compare=_gpu_bn_compare(True))
entry("aten.miopen_batch_norm.default", _gpu_batch_norm(), "normalization", tol=_NORM_TOL,
      tol_reason=_NORM_REASON + _GPU_ONLY, reference=_gpu_bn_reference(False),
      compare=_gpu_bn_compare(False))

# ---- group norm -----------------------------------------------------------------------------


@st.composite
def _group_norm(draw: st.DrawFn) -> Sample:
    """(input [N, C, *spatial], weight, bias, N, C, HxW, group, eps) with C = group * k; any of
    N, k and the spatial sizes may be 0."""
    dt = draw(S.dtypes(FLOATS))
    group = draw(st.integers(1, 3))
    n, k = draw(S.dims(3)), draw(S.dims(3))
    spatial = draw(S.shapes(max_rank=2, max_side=4))
    c = group * k
    hxw = 1
    for s in spatial:
        hxw *= s
    pdt = _param_dtype(draw, dt)
    # contiguous: eager's kernel requires it of the input and silently misreads strided
    # weight and bias (aten.group_norm makes all three contiguous before calling it)
    x = draw(S.tensors((n, c, *spatial), dt, layout="contiguous"))
    w, b = (_maybe(draw, (c,), pdt, "contiguous") for _ in range(2))
    return Sample((x, w, b, n, c, hxw, group, draw(_EPS)))


entry("aten.native_group_norm.default", lambda: _group_norm(), "normalization", tol=_NORM_TOL,
      tol_reason=_NORM_REASON, compare=_norm_compare("aten.native_group_norm.default"))
