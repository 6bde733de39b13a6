"""Op database entries: activation functions (float-only unless eager takes integers)."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.entries_pointwise import LOW_PRECISION_REASON, LOW_PRECISION_TOL, unary
from ember.testing.harness import assert_outputs_close
from ember.testing.opdb import OPDB, Sample, entry

NUMERIC = S.FLOATS + S.INTS


def _act(op: str, samples: Any, **kw: Any) -> None:
    entry(op, samples, "activation", tol=LOW_PRECISION_TOL, tol_reason=LOW_PRECISION_REASON,
          **kw)


def _coef(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, width=32)


def _gelu_compare(sample: Sample, got: list[Any], want: list[Any]) -> None:
    """Eager's vectorized f32/f16/bf16 gelu(approximate="none") gives NaN at +inf (its erf
    polynomial), its scalar path and f64 give inf; ember gives inf everywhere."""
    x, w = sample.args[0], want[0].clone()
    if sample.kwargs.get("approximate", "none") == "none":
        eager_nan = (x == float("inf")) & w.isnan()
        assert bool((got[0][eager_nan] == float("inf")).all()), "gelu(+inf) must be inf"
        w[eager_nan] = float("inf")
    assert_outputs_close(OPDB["aten.gelu.default"], got, [w])


_act("aten.relu.default", lambda: unary(NUMERIC))
_act("aten.gelu.default", lambda: unary(S.FLOATS, approximate=st.sampled_from(["none", "tanh"])),
     compare=_gelu_compare)
_act("aten.silu.default", lambda: unary(S.FLOATS))
_act("aten.mish.default", lambda: unary(S.FLOATS))
_act("aten.softplus.default", lambda: unary(
    S.FLOATS, beta=st.one_of(st.just(1), _coef(0.5, 3)),
    threshold=st.one_of(st.just(20), _coef(0, 5))))
_act("aten.leaky_relu.default", lambda: unary(S.FLOATS, negative_slope=_coef(0, 0.5)))
_act("aten.elu.default", lambda: unary(S.FLOATS, alpha=_coef(0.5, 2), scale=_coef(0.5, 2),
                                       input_scale=_coef(0.5, 2)))
_act("aten.celu.default", lambda: unary(S.FLOATS, alpha=_coef(0.5, 2)))
_act("aten.hardsigmoid.default", lambda: unary(S.FLOATS, low=-5, high=5))
_act("aten.hardswish.default", lambda: unary(S.FLOATS, low=-5, high=5))
_act("aten.softshrink.default", lambda: unary(S.FLOATS, lambd=_coef(0, 1)))
_act("aten.hardshrink.default", lambda: unary(S.FLOATS, lambd=_coef(0, 1)))


@st.composite
def _hardtanh(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(NUMERIC))
    x = draw(S.tensors(draw(S.shapes()), dt))
    if dt.is_floating_point:
        lo, hi = draw(_coef(-3, 0)), draw(_coef(0, 3))
    else:  # eager converts the bounds to the dtype (uint8 rejects negative ones)
        low = 0 if dt == torch.uint8 else -3
        lo, hi = draw(st.integers(low, 1)), draw(st.integers(1, 4))
    if dt == torch.uint8 or draw(st.booleans()):
        return Sample((x, lo, hi))
    return Sample((x,))


@st.composite
def _threshold(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(NUMERIC))
    x = draw(S.tensors(draw(S.shapes()), dt))
    return Sample((x, draw(S.scalars(dt)), draw(S.scalars(dt))))


@st.composite
def _glu(draw: st.DrawFn) -> Sample:
    shape = list(draw(S.shapes(min_rank=1, max_rank=3)))
    d = draw(st.integers(0, len(shape) - 1))
    shape[d] = 2 * draw(st.integers(1, 3))
    dim = d - len(shape) if draw(st.booleans()) else d
    return Sample((draw(S.tensors(shape, draw(S.dtypes(S.FLOATS)))), dim))


@st.composite
def _prelu(draw: st.DrawFn) -> Sample:
    xs = draw(S.shapes())
    drop = draw(st.integers(0, len(xs)))  # the weight broadcasts to x (eager's prelu makes it)
    ws = [1 if draw(st.booleans()) else n for n in xs[drop:]]
    dt = draw(S.dtypes(S.FLOATS))
    return Sample((draw(S.tensors(xs, dt)), draw(S.tensors(ws, dt))))


_act("aten.hardtanh.default", lambda: _hardtanh())
_act("aten.threshold.default", lambda: _threshold())
_act("aten.glu.default", lambda: _glu())
_act("aten._prelu_kernel.default", lambda: _prelu())
