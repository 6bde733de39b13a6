"""Op database entries: pointwise ops.

Dtypes per op are the ones eager accepts (sub rejects bool, hypot and lerp take only floats,
...). Integer division, fmod and remainder never sample a zero integer divisor: eager raises
ZeroDivisionError there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from ember.prims.decomp.pointwise import EXACT_UNARY, FLOAT_UNARY
from ember.testing import strategies as S
from ember.testing.opdb import Sample, entry

NUMERIC = S.FLOATS + S.INTS
Samples = Callable[[], st.SearchStrategy[Sample]]

# Domain-restricted functions sample inside their domain (outside, NaN positions are compared
# too, which is covered by the special values of the other entries).
_DOMAINS: dict[str, tuple[float, float]] = {
    "log": (0.01, 5), "log2": (0.01, 5), "log10": (0.01, 5), "log1p": (-0.9, 5),
    "sqrt": (0, 5), "rsqrt": (0.01, 5), "asin": (-1, 1), "acos": (-1, 1),
    "acosh": (1, 5), "atanh": (-0.99, 0.99), "erfinv": (-0.99, 0.99), "lgamma": (0.1, 5),
    "digamma": (0.1, 5),
}

LOW_PRECISION_TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 2e-2)}
LOW_PRECISION_REASON = ("computed in f32 and rounded once; eager's half kernels may round "
                        "intermediate steps differently by one ulp of the half type")


def nonzero(t: torch.Tensor) -> torch.Tensor:
    """t with integer zeros replaced by 1, in place (the layout stays)."""
    if not t.dtype.is_floating_point and t.dtype != torch.bool:
        t.masked_fill_(t == 0, 1)
    return t


def number(draw: st.DrawFn, dt: torch.dtype, *, promote: bool = True, bools: bool = True,
           nonzero: bool = False) -> Any:
    """A Python number to combine with a `dt` tensor; with `promote`, sometimes of a higher
    category (a float with integers, an int with bools); ints replace bools unless `bools`."""
    if promote and not dt.is_floating_point and draw(st.integers(0, 3)) == 0:
        v: Any = draw(st.floats(-4, 4, allow_nan=False, width=32))
    elif dt == torch.bool and not bools:
        v = draw(st.integers(-4, 4))
    else:
        v = draw(S.scalars(dt))
    if nonzero and not isinstance(v, float) and v == 0:
        v = 1
    if nonzero and isinstance(v, float) and abs(v) < 1e-30:
        v = 0.0  # eager's vectorized fmod by a subnormal gives NaN, its scalar loop 0
    return v


def unary(dtypes: Sequence[torch.dtype] = S.ALL, low: float | None = None,
          high: float | None = None, **kwargs: st.SearchStrategy[Any]
          ) -> st.SearchStrategy[Sample]:
    """One tensor; keyword arguments drawn from `kwargs`."""

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        dt = draw(S.dtypes(dtypes))
        x = draw(S.tensors(draw(S.shapes()), dt, low=low, high=high))
        return Sample((x,), {k: draw(v) for k, v in kwargs.items()})
    return gen()


def binary(dtypes: Sequence[torch.dtype] = NUMERIC, scalar_other: bool = True,
           mixed: bool = True, divisor: bool = False) -> st.SearchStrategy[Sample]:
    """Two broadcastable operands; sometimes of different dtypes (promotion), sometimes the
    second is a Python number. `divisor`: no integer zeros in the second."""

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        a_shape, b_shape = draw(S.broadcastable(2))
        da = draw(S.dtypes(dtypes))
        db = draw(S.dtypes(dtypes)) if mixed and draw(st.booleans()) else da
        a = draw(S.tensors(a_shape, da))
        if scalar_other and draw(st.integers(0, 3)) == 0:
            v = draw(S.scalars(da))
            return Sample((a, 1 if divisor and v == 0 and not isinstance(v, float) else v))
        b = draw(S.tensors(b_shape, db))
        return Sample((a, nonzero(b) if divisor else b))
    return gen()


def scalar_binary(dtypes: Sequence[torch.dtype] = NUMERIC, *, promote: bool = True,
                  bools: bool = True, divisor: bool = False, reverse: bool = False
                  ) -> st.SearchStrategy[Sample]:
    """A tensor and a Python number (the `.Scalar` overloads); the number first with
    `reverse` (`.Scalar_Tensor`)."""

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        dt = draw(S.dtypes(dtypes))
        x = draw(S.tensors(draw(S.shapes()), dt))
        if reverse:
            return Sample((number(draw, dt, promote=promote, bools=bools),
                           nonzero(x) if divisor else x))
        return Sample((x, number(draw, dt, promote=promote, bools=bools, nonzero=divisor)))
    return gen()


def with_kwargs(samples: st.SearchStrategy[Sample], **kwargs: st.SearchStrategy[Any]
                ) -> st.SearchStrategy[Sample]:
    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        s = draw(samples)
        return Sample(s.args, {**s.kwargs, **{k: draw(v) for k, v in kwargs.items()}})
    return gen()


def _pw(op: str, samples: Samples, **kw: Any) -> None:
    entry(op, samples, "pointwise", **kw)


# ---- unary --------------------------------------------------------------------------------
def _unary_of(dtypes: Sequence[torch.dtype]) -> Samples:
    return lambda: unary(dtypes)


def _unary_in_domain(name: str) -> Samples:
    lo, hi = _DOMAINS.get(name, (None, None))
    return lambda: unary(low=lo, high=hi)


for _name in FLOAT_UNARY:
    _pw(f"aten.{_name}.default", _unary_in_domain(_name), tol=LOW_PRECISION_TOL,
        tol_reason=LOW_PRECISION_REASON)
_pw("aten.sigmoid.default", lambda: unary(), tol=LOW_PRECISION_TOL,
    tol_reason=LOW_PRECISION_REASON)
_pw("aten.reciprocal.default", lambda: unary())
_BITS = S.INTS + (torch.bool,)
for _name in EXACT_UNARY:
    _pw(f"aten.{_name}.default", _unary_of(_BITS if _name == "bitwise_not" else NUMERIC))
_pw("aten.sign.default", lambda: unary())
_pw("aten.round.decimals", lambda: unary(S.FLOATS, decimals=st.integers(-2, 3)))
for _name in ("isnan", "isinf", "isposinf", "isneginf"):
    _pw(f"aten.{_name}.default", lambda: unary())


# ---- arithmetic ---------------------------------------------------------------------------
@st.composite
def _alpha(draw: st.DrawFn, samples: st.SearchStrategy[Sample]) -> Sample:
    """`alpha`, sometimes: an int when both operands are integers (eager requires it)."""
    s = draw(samples)
    if not draw(st.booleans()):
        return s
    dts = [a.dtype for a in s.args if isinstance(a, torch.Tensor)]
    dts += [torch.float32 for a in s.args if isinstance(a, float)]
    floating = any(d.is_floating_point for d in dts)
    alpha = draw(S.scalars(torch.float32 if floating else torch.int64))
    return Sample(s.args, {**s.kwargs, "alpha": alpha})


_ALPHA_REASON = ("with alpha, eager's f16/bf16 vector loop computes self + alpha * other in f32 "
                 "(as ember does) but its scalar loop, which takes the tail elements, rounds "
                 "alpha * other to the half type first: one ulp of the half type apart")
_ALPHA = {"tol": LOW_PRECISION_TOL, "tol_reason": _ALPHA_REASON}
_pw("aten.add.Tensor", lambda: _alpha(binary()), **_ALPHA)
_pw("aten.add.Scalar", lambda: scalar_binary())
_pw("aten.mul.Tensor", lambda: binary())
_pw("aten.mul.Scalar", lambda: scalar_binary())
_pw("aten.sub.Tensor", lambda: _alpha(binary()), **_ALPHA)
_pw("aten.sub.Scalar", lambda: _alpha(scalar_binary()), **_ALPHA)
_pw("aten.rsub.Tensor", lambda: _alpha(binary(scalar_other=False)), **_ALPHA)
_pw("aten.rsub.Scalar", lambda: _alpha(scalar_binary()), **_ALPHA)
_pw("aten.div.Tensor", lambda: binary(S.ALL))
_pw("aten.div.Scalar", lambda: scalar_binary(S.ALL))
_ROUNDING = st.sampled_from([None, "trunc", "floor"])
_pw("aten.div.Tensor_mode", lambda: with_kwargs(binary(divisor=True),
                                                rounding_mode=_ROUNDING))
_pw("aten.div.Scalar_mode", lambda: with_kwargs(
    scalar_binary(S.ALL, bools=False, divisor=True), rounding_mode=_ROUNDING))
_pw("aten.floor_divide.default", lambda: binary(divisor=True))
_pw("aten.floor_divide.Scalar", lambda: scalar_binary(S.ALL, bools=False, divisor=True))
for _name in ("fmod", "remainder"):
    _pw(f"aten.{_name}.Tensor", lambda: binary(scalar_other=False, divisor=True))
    _pw(f"aten.{_name}.Scalar", lambda: scalar_binary(S.ALL, bools=False, divisor=True))
_pw("aten.remainder.Scalar_Tensor", lambda: scalar_binary(reverse=True, divisor=True))
_pw("aten.atan2.default", lambda: binary(S.ALL, scalar_other=False))
_pw("aten.hypot.default", lambda: binary(S.FLOATS, scalar_other=False, mixed=False))
_pw("aten.maximum.default", lambda: binary(S.ALL, scalar_other=False))
_pw("aten.minimum.default", lambda: binary(S.ALL, scalar_other=False))

_POW_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
            torch.bfloat16: (1.6e-2, 2e-2)}
_POW_REASON = ("powers reach |x| ~ 3^4: f32 pow vs eager's x*x*x differ by an ulp of the "
               "result; bf16 x*x*x rounds after each product in eager")


@st.composite
def _pow_tensor_scalar(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(S.ALL))
    x = draw(S.tensors(draw(S.shapes()), dt))
    if dt.is_floating_point or draw(st.booleans()):
        e: Any = draw(st.one_of(st.sampled_from([0.5, -0.5, -1, 2, 3, -2, 0, 1]),
                                st.floats(-3, 3, width=32)))
    else:
        e = draw(st.integers(0, 4))
    if not dt.is_floating_point and isinstance(e, int) and e < 0:
        e = float(e)  # integers to negative integer powers are an error
    return Sample((x, e))


@st.composite
def _pow_scalar(draw: st.DrawFn) -> Sample:
    dt = draw(S.dtypes(S.ALL))
    # int ** int: the exponent stays small and >= 0
    x = draw(S.tensors(draw(S.shapes()), dt, low=-3 if dt.is_floating_point else 0, high=3))
    base = draw(st.one_of(st.integers(-3, 3), st.floats(0.25, 3, width=32)))
    return Sample((base, x))


_pw("aten.pow.Tensor_Tensor", lambda: binary(scalar_other=False), tol=_POW_TOL,
    tol_reason=_POW_REASON)
_pw("aten.pow.Tensor_Scalar", lambda: _pow_tensor_scalar(), tol=_POW_TOL,
    tol_reason=_POW_REASON)
_pw("aten.pow.Scalar", lambda: _pow_scalar(), tol=_POW_TOL, tol_reason=_POW_REASON)


# ---- bitwise, logical, comparison ---------------------------------------------------------
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _pw(f"aten.{_name}.Tensor", lambda: binary(_BITS, scalar_other=False))
    _pw(f"aten.{_name}.Scalar", lambda: scalar_binary(_BITS, promote=False))
    _pw(f"aten.{_name}.Scalar_Tensor", lambda: scalar_binary(_BITS, promote=False,
                                                             reverse=True))
for _name in ("and", "or", "xor"):
    _pw(f"aten.logical_{_name}.default", lambda: binary(S.ALL, scalar_other=False))
_pw("aten.logical_not.default", lambda: unary())
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _pw(f"aten.{_name}.Tensor", lambda: binary(S.ALL, scalar_other=False))
    _pw(f"aten.{_name}.Scalar", lambda: scalar_binary(S.ALL))


# ---- selection and clamping ---------------------------------------------------------------
@st.composite
def _where(draw: st.DrawFn) -> Sample:
    cs, a_shape, b_shape = draw(S.broadcastable(3))
    da = draw(S.dtypes(S.ALL))
    db = draw(S.dtypes(S.ALL)) if draw(st.booleans()) else da
    return Sample((draw(S.tensors(cs, torch.bool)), draw(S.tensors(a_shape, da)),
                   draw(S.tensors(b_shape, db))))


@st.composite
def _clamp_scalar(draw: st.DrawFn, which: str = "both") -> Sample:
    """clamp(x, min, max) with numbers; one of them may be None (not both)."""
    dt = draw(S.dtypes(S.ALL))
    x = draw(S.tensors(draw(S.shapes()), dt))
    lo = number(draw, dt, bools=False)
    hi = number(draw, dt, bools=False)
    if which == "min":
        return Sample((x, lo))
    if which == "max":
        return Sample((x, hi))
    drop = draw(st.sampled_from(["", "min", "max"]))
    return Sample((x, None if drop == "min" else lo, None if drop == "max" else hi))


@st.composite
def _clamp_tensor(draw: st.DrawFn, which: str = "both") -> Sample:
    shapes = draw(S.broadcastable(3))
    drop = draw(st.sampled_from(["", "min", "max"])) if which == "both" else which
    dtypes = NUMERIC if drop == "" else S.ALL  # eager's clamp with both bounds rejects bool
    dt = draw(S.dtypes(dtypes))
    ts = [draw(S.tensors(s, draw(S.dtypes(dtypes)) if draw(st.booleans()) else dt))
          for s in shapes]
    if which != "both":
        return Sample((ts[0], ts[1]))
    return Sample((ts[0], None if drop == "min" else ts[1], None if drop == "max" else ts[2]))


_pw("aten.where.self", lambda: _where())
_pw("aten.clamp.default", lambda: _clamp_scalar())
_pw("aten.clamp.Tensor", lambda: _clamp_tensor())
_pw("aten.clamp_min.default", lambda: _clamp_scalar("min"))
_pw("aten.clamp_min.Tensor", lambda: _clamp_tensor("min"))
_pw("aten.clamp_max.default", lambda: _clamp_scalar("max"))
_pw("aten.clamp_max.Tensor", lambda: _clamp_tensor("max"))

_OPT_FLOAT = st.one_of(st.none(), st.floats(-1e5, 1e5, allow_nan=False, width=32))
_pw("aten.nan_to_num.default", lambda: unary(nan=_OPT_FLOAT, posinf=_OPT_FLOAT,
                                             neginf=_OPT_FLOAT))


# ---- lerp, addcmul, addcdiv ---------------------------------------------------------------
@st.composite
def _ternary(draw: st.DrawFn, dtypes: Sequence[torch.dtype], mixed: bool = False,
             divisor: bool = False) -> tuple[torch.Tensor, ...]:
    shapes = draw(S.broadcastable(3))
    dt = draw(S.dtypes(dtypes))
    ts = [draw(S.tensors(s, draw(S.dtypes(dtypes)) if mixed and draw(st.booleans()) else dt))
          for s in shapes]
    return (ts[0], ts[1], nonzero(ts[2]) if divisor else ts[2])


@st.composite
def _lerp(draw: st.DrawFn, tensor_weight: bool) -> Sample:
    a, b, w = draw(_ternary(S.FLOATS))
    if tensor_weight:
        return Sample((a, b, w.to(a.dtype)))
    return Sample((a, b, draw(st.one_of(st.sampled_from([0.0, 0.5, 1.0, -0.5]),
                                        st.floats(-2, 2, width=32)))))


@st.composite
def _addc(draw: st.DrawFn, dtypes: Sequence[torch.dtype], divisor: bool) -> Sample:
    ts = draw(_ternary(dtypes, mixed=True, divisor=divisor))
    if not draw(st.booleans()):
        return Sample(ts)
    floating = any(t.dtype.is_floating_point for t in ts)
    return Sample(ts, {"value": draw(S.scalars(torch.float32 if floating else torch.int64))})


_pw("aten.lerp.Scalar", lambda: _lerp(False))
_pw("aten.lerp.Tensor", lambda: _lerp(True))
_pw("aten.addcmul.default", lambda: _addc(NUMERIC, False))
_pw("aten.addcdiv.default", lambda: _addc(S.FLOATS, True))
