"""bf16 in the CUDA target's Triton kernels with real launches (the device run:
EMBER_TEST_CUDA=1 on a machine with CUDA; skipped elsewhere: Triton's interpreter computes
bf16 wrongly, so test_triton_lowp.py checks the modes on f16). cuda_lowp="f32" (the default)
equals the f32 computation rounded once, bit for bit; "per-op" equals eager's per-op rounding."""

from __future__ import annotations

import pytest
import torch

from ember.testing.triton_mode import NEEDS_CUDA

pytestmark = NEEDS_CUDA


def chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b + a - b


def test_bf16_chain_modes_on_the_gpu() -> None:
    pytest.importorskip("triton")
    import ember.inductor  # noqa: F401
    from ember.capture import capture
    from ember.inductor.backend import compiled_runner
    from ember.inductor.launch import load_module
    from ember.ir.passes import run_pipeline
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(256, 512, device="cuda", generator=g) * 3).bfloat16()
    b = (torch.randn(256, 512, device="cuda", generator=g) * 3).bfloat16()
    got = {}
    for lowp in ("f32", "per-op"):
        m = run_pipeline(capture(chain, (a, b), {}).module,  # type: ignore[arg-type]
                         f"decompose,cse,dce,lower-loops,fuse,schedule-cuda{{lowp={lowp}}},"
                         "codegen-triton,plan-buffers")
        assert [k.lang for k in m.kernels.values()] == ["triton"]
        load_module(m)
        got[lowp] = compiled_runner(m)(None, [a, b]).outputs[0]
    fa, fb = a.float(), b.float()
    assert torch.equal(got["f32"], (fa * fb + fa - fb).bfloat16())
    assert torch.equal(got["per-op"], chain(a, b))
    assert not torch.equal(got["f32"], got["per-op"])  # the inputs tell the modes apart
