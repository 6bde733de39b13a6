"""Op database entries: pointwise ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from hypothesis import strategies as st

from ember.prims.decomp.pointwise import FLOAT_UNARY
from ember.prims.testing import strategies as S
from ember.prims.testing.opdb import Sample, entry

# Domain-restricted functions sample inside their domain (outside, NaN positions are compared
# too, which is covered by the special values of the other entries).
_DOMAINS: dict[str, tuple[float, float]] = {
    "log": (0.01, 5), "log2": (0.01, 5), "log10": (0.01, 5), "log1p": (-0.9, 5),
    "sqrt": (0, 5), "rsqrt": (0.01, 5), "asin": (-1, 1), "acos": (-1, 1),
    "acosh": (1, 5), "atanh": (-0.99, 0.99), "erfinv": (-0.99, 0.99), "lgamma": (0.1, 5),
    "digamma": (0.1, 5),
}


def unary(dtypes: Sequence[torch.dtype] = S.FLOATS + S.INTS + (torch.bool,),
          low: float | None = None, high: float | None = None
          ) -> st.SearchStrategy[Sample]:
    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        dt = draw(S.dtypes(dtypes))
        x = draw(S.tensors(draw(S.shapes()), dt, low=low, high=high))
        return Sample((x,))
    return gen()


def binary(dtypes: Sequence[torch.dtype] = S.FLOATS + S.INTS, scalar_other: bool = True,
           mixed: bool = True) -> st.SearchStrategy[Sample]:
    """Two broadcastable operands; sometimes of different dtypes (promotion), sometimes the
    second is a Python number."""

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        a_shape, b_shape = draw(S.broadcastable(2))
        da = draw(S.dtypes(dtypes))
        db = draw(S.dtypes(dtypes)) if mixed and draw(st.booleans()) else da
        a = draw(S.tensors(a_shape, da))
        if scalar_other and draw(st.integers(0, 3)) == 0:
            return Sample((a, draw(S.scalars(da))))
        return Sample((a, draw(S.tensors(b_shape, db))))
    return gen()


_LOW_PRECISION_TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 2e-2)}

def _unary_in_domain(name: str) -> Callable[[], st.SearchStrategy[Sample]]:
    lo, hi = _DOMAINS.get(name, (None, None))
    return lambda: unary(low=lo, high=hi)


for _name in FLOAT_UNARY:
    entry(f"aten.{_name}.default", _unary_in_domain(_name), "pointwise",
          tol=_LOW_PRECISION_TOL,
          tol_reason="computed in f32 and rounded once; eager's half kernels may round "
                     "intermediate steps differently by one ulp of the half type")


@st.composite
def _add(draw: st.DrawFn) -> Sample:
    s = draw(binary())
    if draw(st.booleans()):
        a = s.args[0]
        alpha = draw(S.scalars(torch.int64 if not a.dtype.is_floating_point else a.dtype))
        if isinstance(s.args[1], torch.Tensor) and not s.args[1].dtype.is_floating_point \
                and not a.dtype.is_floating_point:
            alpha = int(alpha)
        return Sample(s.args, {"alpha": alpha})
    return s


entry("aten.add.Tensor", lambda: _add(), "pointwise")
entry("aten.mul.Tensor", lambda: binary(), "pointwise")


def scalar_binary(dtypes: Sequence[torch.dtype] = S.FLOATS + S.INTS
                  ) -> st.SearchStrategy[Sample]:
    """A tensor and a Python number (the `.Scalar` overloads)."""

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        dt = draw(S.dtypes(dtypes))
        return Sample((draw(S.tensors(draw(S.shapes()), dt)), draw(S.scalars(dt))))
    return gen()


entry("aten.add.Scalar", lambda: scalar_binary(), "pointwise")
entry("aten.mul.Scalar", lambda: scalar_binary(), "pointwise")
