"""Op database entries: creation ops, copy, fill, tril and triu.

Factory ops take no tensors, so there is nothing symbolic to trace (`symbolic=False`); the
*_like and new_* forms and copy/fill/tril/triu are traced with symbolic sizes too. dtype= is
drawn (or left to eager's inference). The empty forms compare dtype and shape with eager (its
contents are garbage) and check ember's defined contents: zeros.

arange draws start, end and step (ints or floats, either sign) that eager accepts: a length
>= 0 and, for integer dtypes, a step that does not truncate to 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.opdb import Sample, entry

Draw = st.DrawFn
Gen = Callable[[], st.SearchStrategy[Sample]]
FAMILY = "creation"
NUMERIC = S.FLOATS + S.INTS


def _size(draw: Draw) -> list[int]:
    return list(draw(S.shapes(0, 3, 4)))


def _maybe_dtype(draw: Draw, kw: dict[str, Any], dtypes: tuple[torch.dtype, ...] = S.ALL
                 ) -> torch.dtype | None:
    if draw(st.booleans()):
        dt = draw(S.dtypes(dtypes))
        kw["dtype"] = dt
        return dt
    return None


def _fill(draw: Draw, dtype: torch.dtype | None) -> Any:
    """A fill value eager writes into dtype (inferred from the value when None)."""
    if dtype is None:
        return draw(st.one_of(st.booleans(), st.integers(-4, 4),
                              st.floats(-4, 4, allow_nan=False, width=32)))
    return draw(S.scalars(dtype))


@st.composite
def _factory(draw: Draw, fill: bool = False) -> Sample:
    kw: dict[str, Any] = {}
    dt = _maybe_dtype(draw, kw)
    args: tuple[Any, ...] = (_size(draw),)
    if fill:
        args += (_fill(draw, dt),)
    return Sample(args, kw)


@st.composite
def _like(draw: Draw, fill: bool = False) -> Sample:
    x = draw(S.tensors(draw(S.shapes()), draw(S.dtypes())))
    kw: dict[str, Any] = {}
    dt = _maybe_dtype(draw, kw)
    return Sample((x, _fill(draw, dt or x.dtype)) if fill else (x,), kw)


@st.composite
def _zero(draw: Draw) -> Sample:
    return Sample((draw(S.tensors(draw(S.shapes()), draw(S.dtypes()))),))


@st.composite
def _new(draw: Draw, fill: bool = False, strided: bool = False) -> Sample:
    x = draw(S.tensors(draw(S.shapes(0, 2)), draw(S.dtypes())))
    kw: dict[str, Any] = {}
    dt = _maybe_dtype(draw, kw)
    size = _size(draw)
    args: tuple[Any, ...] = (x, size)
    if strided:
        args += (_strides(size),)
    if fill:
        args += (_fill(draw, dt or x.dtype),)
    return Sample(args, kw)


def _strides(size: list[int]) -> list[int]:
    """Column-major strides: a layout that is not the default."""
    out, step = [], 1
    for n in size:
        out.append(step)
        step *= max(n, 1)
    return out


@st.composite
def _empty_strided(draw: Draw) -> Sample:
    kw: dict[str, Any] = {}
    _maybe_dtype(draw, kw)
    size = _size(draw)
    return Sample((size, _strides(size)), kw)


@st.composite
def _scalar_tensor(draw: Draw) -> Sample:
    kw: dict[str, Any] = {}
    dt = _maybe_dtype(draw, kw)
    return Sample((_fill(draw, dt or torch.float32),), kw)


def _compare_empty(sample: Sample, got: list[Any], want: list[Any]) -> None:
    g, w = got[0], want[0]
    assert g.dtype == w.dtype and g.shape == w.shape, f"{g.dtype}{list(g.shape)} vs eager " \
        f"{w.dtype}{list(w.shape)}"
    assert not g.any(), "ember defines empty's contents as zeros"


# ---- arange -------------------------------------------------------------------------------


@st.composite
def _arange(draw: Draw, form: str) -> Sample:
    kw: dict[str, Any] = {}
    dt = _maybe_dtype(draw, kw, NUMERIC)
    floats = draw(st.booleans())
    num = (st.floats(-4, 4, allow_nan=False, width=32).map(lambda v: round(v, 2)) if floats
           else st.integers(-5, 5))
    start = 0 if form == "default" else draw(num)
    step: Any = 1
    if form == "start_step":
        step = draw(st.one_of(st.integers(1, 3), st.floats(0.1, 2.5).map(lambda v: round(v, 2))))
        if dt is not None and not dt.is_floating_point:
            step = max(1, int(step))
        if draw(st.booleans()):
            step = -step
    count = draw(st.integers(0, 8))
    end = start + step * count + draw(st.sampled_from([0, 0.5 * step, -0.25 * step][:3 if count else 2]))
    if not floats and isinstance(step, int) and isinstance(end, float) and end.is_integer():
        end = int(end)
    if dt is not None and not dt.is_floating_point:  # integer dtypes: 0 <= values, no overflow
        shift = -min(start, end, 0)
        start, end = start + shift, end + shift
    if dt == torch.uint8 or dt == torch.int8:
        start, end = min(start, 100), min(end, 100)
    args = {"default": (end,), "start": (start, end), "start_step": (start, end, step)}[form]
    return Sample(args, kw)


# ---- copy, fill, tril, triu -----------------------------------------------------------------


def _shrink(draw: Draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    s = list(shape[draw(st.integers(0, len(shape))):])
    return tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in s)


@st.composite
def _copy(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes()), draw(S.dtypes())))
    sdt = draw(S.dtypes())
    to_int = sdt.is_floating_point and not x.dtype.is_floating_point
    # float -> integer conversions of NaN, inf and negatives (to u8) are undefined in C++
    src = draw(S.tensors(_shrink(draw, tuple(x.shape)), sdt, special=not to_int,
                         low=0 if to_int else None))
    return Sample((x, src))


@st.composite
def _fill_scalar(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes()), draw(S.dtypes())))
    return Sample((x, draw(S.scalars(x.dtype))))


@st.composite
def _fill_tensor(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes()), draw(S.dtypes())))
    dt = draw(S.dtypes(NUMERIC if x.dtype.is_floating_point else (x.dtype, torch.bool)))
    return Sample((x, draw(S.tensors((), dt, special=x.dtype.is_floating_point))))


@st.composite
def _triangle(draw: Draw) -> Sample:
    x = draw(S.tensors(draw(S.shapes(2, 4, 5)), draw(S.dtypes())))
    return Sample((x, draw(st.integers(-6, 6))))


def _cr(op: str, samples: Gen, **kw: Any) -> None:
    entry(op, samples, FAMILY, **kw)


_cr("aten.full.default", lambda: _factory(fill=True), symbolic=False)
_cr("aten.zeros.default", lambda: _factory(), symbolic=False)
_cr("aten.ones.default", lambda: _factory(), symbolic=False)
_cr("aten.empty.memory_format", lambda: _factory(), symbolic=False, compare=_compare_empty)
_cr("aten.empty_strided.default", lambda: _empty_strided(), symbolic=False,
    compare=_compare_empty)
_cr("aten.scalar_tensor.default", lambda: _scalar_tensor(), symbolic=False)
_cr("aten.full_like.default", lambda: _like(fill=True))
_cr("aten.zeros_like.default", lambda: _like())
_cr("aten.zero.default", lambda: _zero())
_cr("aten.ones_like.default", lambda: _like())
_cr("aten.empty_like.default", lambda: _like(), compare=_compare_empty)
_cr("aten.new_full.default", lambda: _new(fill=True))
_cr("aten.new_zeros.default", lambda: _new())
_cr("aten.new_ones.default", lambda: _new())
_cr("aten.new_empty.default", lambda: _new(), compare=_compare_empty)
_cr("aten.new_empty_strided.default", lambda: _new(strided=True), compare=_compare_empty)
_cr("aten.arange.default", lambda: _arange("default"), symbolic=False)
_cr("aten.arange.start", lambda: _arange("start"), symbolic=False)
_cr("aten.arange.start_step", lambda: _arange("start_step"), symbolic=False)
_cr("aten.copy.default", lambda: _copy())
_cr("aten.fill.Scalar", lambda: _fill_scalar())
_cr("aten.fill.Tensor", lambda: _fill_tensor())
_cr("aten.tril.default", lambda: _triangle())
_cr("aten.triu.default", lambda: _triangle())
