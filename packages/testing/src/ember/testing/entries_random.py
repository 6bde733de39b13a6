"""Op database entries: random ops.

Eager's generator cannot be matched, so each entry's `compare` checks what holds for every
draw: dtype and shape as eager gives them, and the range of the values (uniform in [0, 1) or
[from, to], integers in [low, high), 0/1 for bernoulli, finite normals). native_dropout is
checked exactly given ember's own mask: the output is `input * mask * scale` as eager computes
it. Distributions are tested against eager in packages/prims/tests/test_random.py. Factory
forms take no tensors (`symbolic=False`); the *_like forms and those of a tensor are traced with
symbolic sizes too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.opdb import Compare, Sample, entry

Draw = st.DrawFn
Gen = Callable[[], st.SearchStrategy[Sample]]
FAMILY = "random"
NUMERIC = S.FLOATS + S.INTS


def _same_type(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert isinstance(g, torch.Tensor), f"output {i} is {type(g).__name__}"
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, eager {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {tuple(g.shape)}, eager {tuple(w.shape)}"


def _in_range(low: float, high: float, *, closed: bool = False, integral: bool = False
              ) -> Compare:
    """Values in [low, high) (or [low, high]); integers with `integral`."""

    def compare(sample: Sample, got: list[Any], want: list[Any]) -> None:
        _same_type(got, want)
        x = got[0].double()
        assert bool((x >= low).all()), f"values below {low}: {x.min()}"
        above = x > high if closed else x >= high
        assert not bool(above.any()), f"values not below {high}: {x.max()}"
        if integral:
            assert bool((x == x.floor()).all()), "non-integral values"
    return compare


def _finite(sample: Sample, got: list[Any], want: list[Any]) -> None:
    _same_type(got, want)
    assert bool(torch.isfinite(got[0].double()).all()), "non-finite normal numbers"


def _float_kw(draw: Draw, kw: dict[str, Any]) -> None:
    if draw(st.booleans()):
        kw["dtype"] = draw(S.dtypes(S.FLOATS))


@st.composite
def _factory(draw: Draw) -> Sample:
    kw: dict[str, Any] = {}
    _float_kw(draw, kw)
    return Sample((list(draw(S.shapes(0, 3, 5))),), kw)


@st.composite
def _like(draw: Draw, dtypes: tuple[torch.dtype, ...] = S.FLOATS) -> Sample:
    x = draw(S.tensors(draw(S.shapes(0, 3, 5)), draw(S.dtypes(dtypes))))
    kw: dict[str, Any] = {}
    _float_kw(draw, kw)
    return Sample((x,), kw)


# ---- randint ------------------------------------------------------------------------------

_LOW, _HIGH = -3, 7


@st.composite
def _randint(draw: Draw, form: str) -> Sample:
    kw: dict[str, Any] = {}
    x = draw(S.tensors(draw(S.shapes(0, 3, 5)), draw(S.dtypes(NUMERIC))))
    dt = draw(S.dtypes(NUMERIC)) if draw(st.booleans()) else None
    if dt is not None:
        kw["dtype"] = dt
    result = dt or (x.dtype if form.startswith("like") else torch.int64)
    low = draw(st.integers(_LOW if result.is_signed else 0, 2)) if "low" in form else 0
    high = draw(st.integers(max(low, 0) + 1, _HIGH))
    bounds: tuple[int, ...] = (low, high) if "low" in form else (high,)
    if form.startswith("like"):
        return Sample((x, *bounds), kw)
    return Sample((*bounds, list(x.shape)), kw)


def _compare_randint(sample: Sample, got: list[Any], want: list[Any]) -> None:
    ints = [a for a in sample.args if isinstance(a, int)]
    low, high = (0, ints[0]) if len(ints) == 1 else (ints[0], ints[1])
    _in_range(low, high, integral=True)(sample, got, want)


# ---- uniform, normal ----------------------------------------------------------------------


@st.composite
def _uniform(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes(0, 3, 5)), draw(S.dtypes(S.FLOATS))))
    lo = draw(st.integers(-4, 2))
    return Sample((x,), {"from": float(lo), "to": float(lo + draw(st.integers(1, 4)))})


def _compare_uniform(sample: Sample, got: list[Any], want: list[Any]) -> None:
    # rounding to the dtype may reach `to`
    _in_range(sample.kwargs["from"], sample.kwargs["to"], closed=True)(sample, got, want)


@st.composite
def _normal_functional(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes(0, 3, 5)), draw(S.dtypes(S.FLOATS))))
    return Sample((x, draw(st.integers(-3, 3)) * 0.5, draw(st.integers(0, 4)) * 0.5))


@st.composite
def _normal_float_float(draw: Draw) -> Sample:
    kw: dict[str, Any] = {}
    _float_kw(draw, kw)
    return Sample((draw(st.integers(-3, 3)) * 0.5, draw(st.integers(0, 4)) * 0.5,
                   list(draw(S.shapes(0, 3, 5)))), kw)


# ---- bernoulli, dropout -------------------------------------------------------------------

_PROBS = st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0])


def _binary_values(sample: Sample, got: list[Any], want: list[Any]) -> None:
    _same_type(got, want)
    x = got[0].double()
    assert bool(((x == 0) | (x == 1)).all()), "bernoulli values other than 0 and 1"
    p = sample.args[1] if len(sample.args) > 1 else sample.args[0]
    if isinstance(p, float):
        if p == 0.0:
            assert not bool(x.any())
        if p == 1.0:
            assert bool((x == 1).all())
    elif isinstance(p, torch.Tensor):  # certain outcomes where p is 0 or 1
        p = p.double().expand(x.shape)
        assert bool((x[p == 0] == 0).all()) and bool((x[p == 1] == 1).all())


@st.composite
def _bernoulli_p(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes(0, 3, 5)), draw(S.dtypes())))
    return Sample((x, draw(_PROBS)))


@st.composite
def _bernoulli(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes(0, 3, 5)), draw(S.dtypes(S.FLOATS)), low=0, high=1,
                       special=False))
    return Sample((x,))


@st.composite
def _bernoulli_tensor(draw: Draw) -> Sample:
    shape = draw(S.shapes(0, 3, 5))
    x = draw(S.tensors(shape, draw(S.dtypes(S.FLOATS))))
    pshape = list(shape[draw(st.integers(0, len(shape))):])
    p = draw(S.tensors(tuple(1 if draw(st.booleans()) else d for d in pshape),
                       draw(S.dtypes(S.FLOATS)), low=0, high=1, special=False))
    return Sample((x, p))


@st.composite
def _dropout(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes(0, 3, 5)), draw(S.dtypes(S.FLOATS))))
    return Sample((x, draw(_PROBS), draw(st.sampled_from([True, False, None]))))


def _compare_dropout(sample: Sample, got: list[Any], want: list[Any]) -> None:
    x, p, train = sample.args
    out, mask = got
    assert out.dtype == x.dtype and out.shape == x.shape
    assert mask.dtype == torch.bool and mask.shape == x.shape  # eager's meta kernel agrees
    if train is False:
        torch.testing.assert_close(out, x, equal_nan=True, rtol=0, atol=0)
        assert bool(mask.all())
        return
    keep = 1.0 - p
    scale = 0.0 if keep == 0 else 1.0 / keep
    expect = x.mul(mask.to(x.dtype)).mul(scale)  # eager's arithmetic, on ember's mask
    torch.testing.assert_close(out, expect, equal_nan=True, rtol=0, atol=0)
    if p == 0.0:
        assert bool(mask.all())
    if p == 1.0:
        assert not bool(mask.any())


def _rn(op: str, samples: Gen, compare: Compare, symbolic: bool) -> None:
    entry(op, samples, FAMILY, compare=compare, symbolic=symbolic)


_rn("aten.rand.default", lambda: _factory(), _in_range(0, 1), False)
_rn("aten.rand_like.default", lambda: _like(), _in_range(0, 1), True)
_rn("aten.randn.default", lambda: _factory(), _finite, False)
_rn("aten.randn_like.default", lambda: _like(), _finite, True)
_rn("aten.randint.default", lambda: _randint("high"), _compare_randint, False)
_rn("aten.randint.low", lambda: _randint("low"), _compare_randint, False)
_rn("aten.randint_like.default", lambda: _randint("like"), _compare_randint, True)
_rn("aten.randint_like.low_dtype", lambda: _randint("like_low"), _compare_randint, True)
_rn("aten.uniform.default", lambda: _uniform(), _compare_uniform, True)
_rn("aten.normal_functional.default", lambda: _normal_functional(), _finite, True)
_rn("aten.normal.float_float", lambda: _normal_float_float(), _finite, False)
_rn("aten.bernoulli.p", lambda: _bernoulli_p(), _binary_values, True)
_rn("aten.bernoulli.default", lambda: _bernoulli(), _binary_values, True)
_rn("aten.bernoulli.Tensor", lambda: _bernoulli_tensor(), _binary_values, True)
_rn("aten.native_dropout.default", lambda: _dropout(), _compare_dropout, True)
