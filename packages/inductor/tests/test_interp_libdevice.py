"""interp_libdevice.py: libdevice for Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY


def test_a_scalar_first_operand_takes_the_block_shape() -> None:
    """remainder(1.0, x) in f64 calls libdevice.fmod(tl.full([], 1.0), x): the result has the
    block's shape, not the scalar's (the op database's pointwise family drew this)."""
    x = torch.tensor([[0.9902, 2.0608, -1.3413]], dtype=torch.float64)
    c = capture(lambda a: torch.remainder(1.0, a), (x,), {})
    m = run_pipeline(c.module, "decompose,cse,dce,inductor-cuda-interpret")  # type: ignore[arg-type]
    assert [k.lang for k in m.kernels.values()] == ["triton"]
    assert "libdevice.fmod" in next(iter(m.kernels.values())).source
    load_module(m)
    got = compiled_runner(m)(None, [x]).outputs[0]
    torch.testing.assert_close(got, torch.remainder(1.0, x))
