"""prims.digamma in the CUDA target (prelude.py `_digamma`; libdevice has none): eager's CPU
algorithm (reflection below 0, recurrence to 10, asymptotic series), checked in Triton's
interpreter against eager over the whole line, its poles and special values included (the op
database's pointwise family draws only (0.1, 5))."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY


def digamma(x: torch.Tensor) -> torch.Tensor:
    return torch.digamma(x)


_RUNNERS: dict[tuple[int, torch.dtype], Any] = {}


def triton_digamma(x: torch.Tensor) -> torch.Tensor:
    key = (x.numel(), x.dtype)
    if key not in _RUNNERS:  # one compile per size and dtype
        m = run_pipeline(capture(digamma, (x,), {}).module,  # type: ignore[arg-type]
                         "decompose,cse,dce,lower-loops,fuse,schedule-cuda,"
                         "codegen-triton{interpret=true},plan-buffers")
        assert len(m.kernels) == 1 and "_digamma(" in next(iter(m.kernels.values())).source
        load_module(m)
        _RUNNERS[key] = compiled_runner(m)
    return _RUNNERS[key](None, [x]).outputs[0]


SPECIAL = [0.0, -0.0, -1.0, -7.0, -2.5, float("inf"), float("-inf"), float("nan"), 1e-30,
           10.0, 3.0, 0.5, -0.5, 1e20, -1e10 - 0.5]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_digamma_matches_eager_on_the_line(dtype: torch.dtype, tol: float) -> None:
    """Every 0.05 of [-20, 30] (close to the poles at the negative integers), special values
    (0 and -0 give -inf and inf, negative integers and -inf NaN)."""
    x = torch.cat([torch.tensor(SPECIAL), torch.linspace(-20, 30, 1001)]).to(dtype)
    torch.testing.assert_close(triton_digamma(x), digamma(x), atol=tol, rtol=tol,
                               equal_nan=True)


@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=32))
def test_digamma_matches_eager_hypothesis(xs: list[float]) -> None:
    x = torch.tensor(xs + [1.0] * (32 - len(xs)), dtype=torch.float32)  # one size: one compile
    torch.testing.assert_close(triton_digamma(x), digamma(x), atol=1e-4, rtol=1e-4,
                               equal_nan=True)
