"""The CUDA target's erf (prelude.py `_erf`, a rational minimax fit in place of libdevice's
erff): its error against erf in f64 over the whole f32 range, run by Triton's interpreter."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.inductor.tests.prelude_kernels import elementwise, prelude_module

pytestmark = INTERPRETER_ONLY

MAX_ULP = 10.0  # measured 9.0 (f32 arithmetic of the fit, exact division); libdevice erff: 2

KERNEL = '''

@triton.jit
def erf_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, _erf(tl.load(x_ptr + offs, mask=m, other=0.0)), mask=m)
'''


@pytest.fixture(scope="module")
def erf_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The prelude (interpreter form) with a kernel applying _erf elementwise."""
    return prelude_module(tmp_path_factory.mktemp("erf"), "ember_test_erf_kernels", KERNEL)


def erf32(mod: Any, x: torch.Tensor) -> torch.Tensor:
    return elementwise(mod.erf_kernel, x)


def ulp_error(got: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|got - erf(x)| in units of the last place of erf(x) rounded to f32."""
    want = torch.special.erf(x.double())
    ulp = torch.from_numpy(np.spacing(np.abs(want.float().numpy()))).double()
    return (got.double() - want).abs() / ulp


def test_erf_within_10_ulp_on_a_dense_grid(erf_module: Any) -> None:
    """Every 2**-12 step of [-4.5, 4.5] (past the clamp at 3.92) and powers of two down to
    the smallest normal: within MAX_ULP of erf in f64, relative near 0, |erf| <= 1."""
    dense = torch.arange(-4.5, 4.5, 2.0 ** -12, dtype=torch.float64).float()
    tiny = torch.tensor([2.0 ** -k for k in range(1, 126)], dtype=torch.float32)
    x = torch.cat([dense, tiny, -tiny])
    got = erf32(erf_module, x)
    err = ulp_error(got, x)
    assert err.max().item() <= MAX_ULP, (err.max().item(), x[err.argmax()].item())
    assert got.abs().max().item() <= 1.0
    assert torch.equal(got.sign(), x.sign())  # odd, and 0 only at 0


def test_erf_special_values(erf_module: Any) -> None:
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 4.5, 1e30,
                      -1e30, 3.4e38])
    got = erf32(erf_module, x)
    assert math.isnan(got[0].item())
    assert got[1:].tolist() == [1.0, -1.0, 0.0, -0.0, 1.0, 1.0, -1.0, 1.0]
    assert math.copysign(1.0, got[4].item()) == -1.0  # erf(-0) is -0, as eager


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1,
                max_size=64))
def test_erf_matches_torch_everywhere(erf_module: Any, values: list[float]) -> None:
    """Any f32 (hypothesis draws subnormals and extremes too): within MAX_ULP of erf in f64,
    subnormals within the f32 tolerance eager's own comparisons use."""
    x = torch.tensor(values, dtype=torch.float32)
    got = erf32(erf_module, x)
    normal = x.abs() >= torch.finfo(torch.float32).tiny
    assert (ulp_error(got, x)[normal] <= MAX_ULP).all()
    torch.testing.assert_close(got, torch.erf(x), rtol=1e-6, atol=1e-6)


def test_the_kernels_call_it() -> None:
    """prims.erf of f32 (and of bf16, computed in f32) renders as the prelude's _erf; f64
    keeps libdevice's erf (tl.erf)."""
    from ember.inductor.targets.cuda.render import OPS, OPS_F64
    assert OPS["prims.erf"]["f"] == "_erf({0})"
    assert OPS_F64["prims.erf"] == "tl.erf({0})"
