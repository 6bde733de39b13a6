"""Op database entries: reductions and scans.

One strategy, `reduction`, draws an operand and the op's dim argument in the form its schema
takes ("none", "int", "optional_int", "list" = int[]? where [] means all dims, "list0" = int[]
where [] means all dims, "list1" = a non-empty int[], "dims" = any/all's int[]? where [] means no
dim), then keepdim and dtype= where the op has them. Ops with no identity (amax, max, argmax, ...) get non-empty reduced dims; other dims
may still be 0-sized. Samples are small: reductions of up to 4**4 elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.harness import assert_outputs_close
from ember.testing.opdb import OPDB, Compare, Sample, entry

FLOATS = S.FLOATS
NUMBERS = S.FLOATS + S.INTS
ALL = S.ALL
_MAX_SIDE = 4
_ABSENT = object()  # the op has no dim argument

DTypeFor = Callable[[st.DrawFn, torch.dtype], torch.dtype | None]


def _dims_list(draw: st.DrawFn, rank: int, *, allow_none: bool, allow_empty: bool
               ) -> list[int] | None:
    """A dim list as torch takes it: unique dims, each maybe negative; or None or []."""
    kinds = ["some"] + (["none"] if allow_none else []) + (["empty"] if allow_empty else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return None
    if kind == "empty":
        return []
    r = max(rank, 1)
    picked = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
    return [d - r if draw(st.booleans()) else d for d in picked]


def _reduced(dim: Any, rank: int, empty_means_all: bool) -> list[int]:
    if dim is _ABSENT or dim is None or (dim == [] and empty_means_all):
        return list(range(rank))
    ds = [dim] if isinstance(dim, int) else dim
    return [d % rank for d in ds] if rank else []


@st.composite
def _operand(draw: st.DrawFn, dtypes: Sequence[torch.dtype], dim_kind: str, nonempty: bool,
             low: float | None, high: float | None, max_side: int, max_rank: int
             ) -> tuple[torch.Tensor, Any]:
    """A tensor and the dim argument; with `nonempty`, the reduced dims have size >= 1."""
    dt = draw(S.dtypes(dtypes))
    shape = list(draw(S.shapes(max_rank=max_rank, max_side=max_side)))
    rank = len(shape)
    dim: Any = _ABSENT
    if dim_kind == "int":
        dim = S.dim_of(draw, rank)
    elif dim_kind == "optional_int":
        dim = None if draw(st.booleans()) else S.dim_of(draw, rank)
    elif dim_kind in ("list", "dims"):
        dim = _dims_list(draw, rank, allow_none=True, allow_empty=True)
    elif dim_kind == "list0":
        dim = _dims_list(draw, rank, allow_none=False, allow_empty=True)
    elif dim_kind == "list1":
        dim = _dims_list(draw, rank, allow_none=False, allow_empty=False)
    if nonempty:
        for d in _reduced(dim, rank, dim_kind != "dims"):
            shape[d] = max(shape[d], 1)
    return draw(S.tensors(shape, dt, low=low, high=high)), dim


def reduction(dtypes: Sequence[torch.dtype] = ALL, dim_kind: str = "list", *,
              keepdim: bool = True, dtype_for: DTypeFor | None = None, nonempty: bool = False,
              low: float | None = None, high: float | None = None, max_side: int = _MAX_SIDE,
              max_rank: int = 4, extra: Callable[[st.DrawFn], dict[str, Any]] | None = None
              ) -> Callable[[], st.SearchStrategy[Sample]]:
    """Samples (x[, dim], keepdim=, dtype=, **extra) for a reduction of the given schema."""

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        x, dim = draw(_operand(dtypes, dim_kind, nonempty, low, high, max_side, max_rank))
        args: tuple[Any, ...] = (x,) if dim is _ABSENT else (x, dim)
        kw: dict[str, Any] = dict(extra(draw)) if extra else {}
        if keepdim and draw(st.booleans()):
            kw["keepdim"] = draw(st.booleans())
        if dtype_for is not None:
            dt = dtype_for(draw, x.dtype)
            if dt is not None:
                kw["dtype"] = dt
        return Sample(args, kw)
    return lambda: gen()


def _accumulate_dtype(draw: st.DrawFn, dt: torch.dtype) -> torch.dtype | None:
    """sum/prod/cumsum's dtype=: absent, or one the input converts to without surprises."""
    if not draw(st.booleans()):
        return None
    if dt.is_floating_point:
        return draw(st.sampled_from(FLOATS))
    return draw(st.sampled_from((torch.int64, torch.int32, torch.float32, torch.float64)))


def _mean_dtype(draw: st.DrawFn, dt: torch.dtype) -> torch.dtype | None:
    """mean's dtype=: required (a float) for integer input, optional for float input."""
    if dt.is_floating_point and draw(st.booleans()):
        return None
    return draw(st.sampled_from(FLOATS))


_LOW_PRECISION = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}
_ACCUMULATION = ("accumulated in f32 and rounded once, as eager; the summation order differs, "
                 "so the rounded result may differ by one ulp of the half type")

entry("aten.sum.default", reduction(ALL, "none", keepdim=False, dtype_for=_accumulate_dtype),
      "reduction", tol=_LOW_PRECISION, tol_reason=_ACCUMULATION)
entry("aten.sum.dim_IntList", reduction(ALL, "list", dtype_for=_accumulate_dtype),
      "reduction", tol=_LOW_PRECISION, tol_reason=_ACCUMULATION)
entry("aten.mean.default", reduction(NUMBERS, "none", keepdim=False, dtype_for=_mean_dtype),
      "reduction", tol=_LOW_PRECISION, tol_reason=_ACCUMULATION)
entry("aten.mean.dim", reduction(NUMBERS, "list", dtype_for=_mean_dtype), "reduction",
      tol=_LOW_PRECISION, tol_reason=_ACCUMULATION)

# prod: eager's CPU kernel multiplies f16/bf16 in the half type, rounding every step; ember
# multiplies in f32 and rounds once (as eager's CUDA kernel). Few factors, near 1, keep the
# difference small and away from overflow.
_PROD_TOL = {torch.float16: (8e-3, 1e-3), torch.bfloat16: (5e-2, 1e-2)}
_PROD_REASON = ("eager's CPU kernel rounds f16/bf16 products after every factor; ember "
                "multiplies in f32 and rounds once (as eager's CUDA kernel does)")
entry("aten.prod.default", reduction(ALL, "none", keepdim=False, dtype_for=_accumulate_dtype,
                                     low=-1.5, high=1.5, max_side=3, max_rank=3),
      "reduction", tol=_PROD_TOL, tol_reason=_PROD_REASON)
entry("aten.prod.dim_int", reduction(ALL, "int", dtype_for=_accumulate_dtype, low=-1.5,
                                     high=1.5),
      "reduction", tol=_PROD_TOL, tol_reason=_PROD_REASON)


def _correction(draw: st.DrawFn) -> dict[str, Any]:
    c = draw(st.sampled_from([None, None, 0, 1, 2, 0.5]))
    return {} if c is None else {"correction": c}


_VAR_TOL = {torch.float16: (4e-3, 2e-3), torch.bfloat16: (2e-2, 1e-2)}
_VAR_REASON = ("eager's CPU kernel uses Welford's algorithm in f32 for f16/bf16, ember a "
               "two-pass mean and squared deviations in f32: both round once to the half type")


def _welford_mean(op: str) -> Compare:
    """var_mean/std_mean: eager's mean comes from Welford's algorithm, which turns the mean of
    a set holding an infinity into NaN (depending on the order); ember's is the exact mean
    (+-inf, as `mean` gives). Where eager says NaN and ember +-inf, ember's value is taken."""

    def compare(sample: Sample, got: Any, want: Any) -> None:
        g, w = got[1], want[1]
        if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor) and g.shape == w.shape:
            want = [want[0], torch.where(g.isinf() & w.isnan(), g, w)]
        assert_outputs_close(OPDB[op], got, want)
    return compare


for _op in ("aten.var.correction", "aten.std.correction"):
    entry(_op, reduction(FLOATS, "list", extra=_correction), "reduction", tol=_VAR_TOL,
          tol_reason=_VAR_REASON)
for _op in ("aten.var_mean.correction", "aten.std_mean.correction"):
    entry(_op, reduction(FLOATS, "list", extra=_correction), "reduction", tol=_VAR_TOL,
          tol_reason=_VAR_REASON, compare=_welford_mean(_op))
entry("aten.var.dim", reduction(FLOATS, "list", extra=lambda d: {"unbiased": d(st.booleans())}),
      "reduction", tol=_VAR_TOL, tol_reason=_VAR_REASON)

# Exact reductions: every dtype, NaN and ties included (ints tie often).
entry("aten.amax.default", reduction(ALL, "list0", nonempty=True), "reduction")
entry("aten.amin.default", reduction(ALL, "list0", nonempty=True), "reduction")
entry("aten.max.default", reduction(ALL, "none", keepdim=False, nonempty=True), "reduction")
entry("aten.min.default", reduction(ALL, "none", keepdim=False, nonempty=True), "reduction")
entry("aten.max.dim", reduction(ALL, "int", nonempty=True), "reduction")
entry("aten.min.dim", reduction(ALL, "int", nonempty=True), "reduction")
entry("aten.argmax.default", reduction(NUMBERS, "optional_int", nonempty=True), "reduction")
entry("aten.argmin.default", reduction(NUMBERS, "optional_int", nonempty=True), "reduction")

for _op in ("any", "all"):
    entry(f"aten.{_op}.default", reduction(ALL, "none", keepdim=False), "reduction")
    entry(f"aten.{_op}.dim", reduction(ALL, "int"), "reduction")
    entry(f"aten.{_op}.dims", reduction(ALL, "dims"), "reduction")

_LSE_TOL = {torch.float16: (4e-3, 2e-3), torch.bfloat16: (2e-2, 1e-2)}
entry("aten.logsumexp.default", reduction(ALL, "list1"), "reduction", tol=_LSE_TOL,
      tol_reason="computed in f32 and rounded once; eager's CPU kernel rounds x - max, exp, "
                 "the sum and the log to the half type in turn")
entry("aten.cumsum.default", reduction(ALL, "int", keepdim=False, dtype_for=_accumulate_dtype),
      "reduction", tol=_LOW_PRECISION, tol_reason=_ACCUMULATION)
entry("aten.cumprod.default", reduction(ALL, "int", keepdim=False, dtype_for=_accumulate_dtype,
                                        low=-1.5, high=1.5),
      "reduction", tol=_LOW_PRECISION, tol_reason=_ACCUMULATION)

def _vector_norm() -> st.SearchStrategy[Sample]:
    """`ord` is linalg_vector_norm's second positional argument: `dim` goes by keyword."""
    base = reduction(FLOATS, "list", nonempty=True)()
    orders = st.sampled_from([2, 1, 0, 3, 0.5, math.inf, -math.inf])

    @st.composite
    def gen(draw: st.DrawFn) -> Sample:
        s = draw(base)
        kw = dict(s.kwargs)
        if len(s.args) > 1:
            kw["dim"] = s.args[1]
        order = draw(orders)
        if s.args[0].numel() == 0 and order in (math.inf, -math.inf):
            order = 2  # eager refuses max/min norms of empty tensors (no identity)
        return Sample((s.args[0], order), kw)
    return gen()


entry("aten.linalg_vector_norm.default", _vector_norm, "reduction",
      tol={torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2)},
      tol_reason="computed in f32 and rounded once; eager's half kernel accumulates |x| ** ord "
                 "in a different order")
