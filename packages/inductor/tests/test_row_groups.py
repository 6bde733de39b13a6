"""Short rows in groups (targets/cpu/rowgroups.py) and the inline f32 exp (cpp.py's
`ember_expf`), against eager. Each test also checks the generated code took the path it is
about, so it fails when the path is removed."""

from __future__ import annotations

import math
import re
import subprocess

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.inductor.targets.cpu import cache
from ember.inductor.targets.cpu.rowgroups import ROW_GROUP
from ember.ir import GraphBuilder, Value
from packages.inductor.tests.test_reduction_loops import Build, compile_run, tensor, tol

GROUPED = "for (int64_t rg = 0; rg < "  # rows computed ROW_GROUP at a time
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _op(name: str, n: int) -> Build:
    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        if name == "softmax":
            return [gb.op("aten._softmax.default", [p[0], -1, False])]
        if name == "log_softmax":
            return [gb.op("aten._log_softmax.default", [p[0], -1, False])]
        if name == "layer_norm":
            return gb.emit("aten.native_layer_norm.default", [p[0], [n], None, None, 1e-5])[:1]
        if name == "sum":
            return [gb.op("aten.sum.dim_IntList", [p[0], [-1]])]
        return [gb.op("aten.amax.default", [p[0], [-1]])]
    return build


def _eager(name: str, x: torch.Tensor) -> torch.Tensor:
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if name == "softmax":
        return torch.softmax(x, -1)
    if name == "log_softmax":
        return torch.log_softmax(x, -1)
    if name == "layer_norm":
        return torch.nn.functional.layer_norm(wide, (x.shape[-1],)).to(x.dtype)
    return x.sum(-1) if name == "sum" else x.amax(-1)


@settings(max_examples=30, deadline=None)
@given(outer=st.sampled_from([(1,), (3,), (4,), (7,), (2, 9), (5, 3), (3, 2, 5)]),
       n=st.sampled_from([1, 3, 8, 49, 197, 256, 257]),
       op=st.sampled_from(["softmax", "log_softmax", "layer_norm", "sum", "amax"]),
       dtype=st.sampled_from(FLOATS), special=st.sampled_from(["", "nan", "inf", "-inf row"]),
       seed=st.integers(0, 2**16))
def test_short_rows_in_groups_match_eager(outer: tuple[int, ...], n: int, op: str,
                                          dtype: torch.dtype, special: str, seed: int) -> None:
    """Rows of a constant length up to SHORT_ROW are computed ROW_GROUP at a time where there
    are at least ROW_GROUP rows (the rows past the last group one by one), as eager computes
    them: remainders, several outer dims, NaN and infinities in some rows."""
    x = tensor((*outer, n), dtype, seed)
    flat = x.view(-1, n)
    rows = flat.shape[0]
    if special == "nan":
        flat[rows // 2, n // 2] = float("nan")
    elif special == "inf":
        flat[rows - 1, 0] = float("inf")
    elif special == "-inf row":
        flat[0] = float("-inf")  # softmax: NaN in eager; amax: -inf
    (got, *_), src = compile_run(_op(op, n), [x])
    torch.testing.assert_close(got, _eager(op, x), equal_nan=True, **tol(dtype))
    assert (GROUPED in src) == (rows >= ROW_GROUP and n <= 256), src


def test_grouped_rows_keep_a_row_each() -> None:
    """softmax over Swin's windows ([6, 49, 49]: 294 rows, 2 past the last group): each row of
    a group keeps its own max, sum and lanes, and the rows past the groups run one by one."""
    x = tensor((6, 49, 49), torch.float32, 7)
    x[0, 1] = float("-inf")
    x[5, 48, 3] = float("nan")
    (got,), src = compile_run(_op("softmax", 49), [x])
    torch.testing.assert_close(got, torch.softmax(x, -1), equal_nan=True)
    assert f"{GROUPED}{294 // ROW_GROUP}; ++rg)" in src
    assert "for (int64_t rt = 292; rt < 294; ++rt)" in src
    last = ROW_GROUP - 1
    assert f"reduction(max:a0_{last}) reduction(|:nan0_{last}) simdlen(8)" in src
    assert f"reduction(+:a1_{last}) simdlen(16)\n" in src  # the exp pass: 64 bytes of lanes


# ---- exp -------------------------------------------------------------------------------------
def _exp(gb: GraphBuilder, p: list[Value]) -> list[Value]:
    return [gb.op("aten.exp.default", [p[0]])]


def _ulps(got: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|got - exp(x)| in units of the last place of the correctly rounded float result."""
    exact = torch.exp(x.double())
    want = exact.float()
    mag = want.abs()
    ulp = ((mag.view(torch.int32) + 1).view(torch.float32) - mag).double().clamp(min=2.0**-149)
    return (got.double() - exact).abs() / ulp


_SPECIAL = [0.0, -0.0, 1.0, -1.0, 88.72283, 88.7229, 89.0, 89.5, 100.0, -87.33655, -87.34,
            -100.0, -103.97, -103.9721, -104.0, -104.5, -200.0, 1e-40, -1e-40, 1e-30,
            math.inf, -math.inf, math.nan]


def test_exp_f32_is_within_two_ulp_and_exact_at_the_edges() -> None:
    """The inline exp over every range that matters (normal, overflow, denormal results,
    underflow to 0): within 2 ulp of the exact value (libmvec's was 2.5), inf above the
    range, 0 below it, NaN for NaN."""
    grid = torch.linspace(-110.0, 95.0, 400_000)
    small = torch.linspace(-1.0, 1.0, 100_000)
    x = torch.cat([grid, small, torch.tensor(_SPECIAL)])
    (got,), src = compile_run(_exp, [x])
    assert "ember_exp<float>" in src
    finite = torch.isfinite(torch.exp(x.double()).float()) & ~x.isnan()
    assert float(_ulps(got[finite], x[finite]).max()) <= 2.0
    want = torch.exp(x)
    torch.testing.assert_close(got[~finite], want[~finite], equal_nan=True, rtol=0, atol=0)
    assert bool((got[x < -104] == 0).all()) and bool((got[x > 89] == math.inf).all())


@settings(max_examples=20, deadline=None)
@given(values=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True),
                       min_size=67, max_size=67))
def test_exp_f32_any_floats(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float32)  # one shape: one compiled kernel
    (got,), _ = compile_run(_exp, [x])
    want = torch.exp(x)
    ok = torch.isfinite(want) & (want != 0)
    assert bool((_ulps(got[ok], x[ok]) <= 2.0).all())
    # where eager's result is 0, inf or NaN: the same, or a denormal within 2 ulp of 0
    rest = ~ok
    same = (got[rest] == want[rest]) | (got[rest].isnan() & want[rest].isnan())
    assert bool((same | (got[rest].abs() <= 2 * 2.0**-149)).all())


@pytest.mark.skipif(cache.CXX is None, reason="no C++ compiler")
def test_exp_f32_calls_no_math_library() -> None:
    """A softmax's exp is inline vector code: no call into libmvec or libm (a call clobbers
    every vector register, libmvec's vectors holding -inf take its scalar path, and a row's
    tail element called the scalar expf)."""
    x = tensor((64, 49), torch.float32, 3)
    (got,), src = compile_run(_op("softmax", 49), [x])
    torch.testing.assert_close(got, torch.softmax(x, -1))
    flags = [f for f in cache.flags() if f not in ("-shared", "-lmvec")]
    asm = subprocess.run([str(cache.CXX), *flags, "-x", "c++", "-S", "-o", "-", "-"],
                         input=src, text=True,
                         capture_output=True, check=True).stdout
    calls = re.findall(r"call\s+(\S+)", asm)
    assert not [c for c in calls if "exp" in c], calls
