"""Low-precision compute in the CUDA target's Triton kernels (issue 16; render.py "cuda_lowp").

The default ("f32"): f16/bf16 values are upcast at loads, every op, conversion and reduction is
computed in f32 and the result is rounded to its dtype only at the store, as TorchInductor does.
"per-op" (`schedule-cuda{lowp=per-op}`, or `cuda_lowp="per-op"` edited into a dump) rounds every
op's result as eager does. Kernels run in Triton's interpreter on f16 (its bf16 arithmetic is
wrong): bf16 on the device, with EMBER_TEST_CUDA=1 (real launches; the interpreter's tests
are skipped there), and in benchmarks/gpu_cuda_suite.py and cuda_schedule_sweep.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.ir import Module, parse
from ember.ir.passes import PipelineError, run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

FRONT = "decompose,cse,dce,lower-loops,fuse"
pytestmark = INTERPRETER_ONLY
ROUND_F16 = ".to(tl.float16).to(tl.float32)"  # per-op rounding as render.py writes it


def chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b + a - b


def scheduled(fn: Callable[..., Any], *args: torch.Tensor, lowp: str = "") -> Module:
    c = capture(fn, args, {})
    opt = f"{{lowp={lowp}}}" if lowp else ""
    return run_pipeline(c.module, f"{FRONT},schedule-cuda{opt}")  # type: ignore[arg-type]


def run(m: Module, *args: torch.Tensor) -> tuple[torch.Tensor, str]:
    out = run_pipeline(m, "codegen-triton{interpret=true},plan-buffers")
    load_module(out)
    (k,) = out.kernels.values()
    return compiled_runner(out)(None, list(args)).outputs[0], k.source


def inputs(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(*shape, generator=g).half() * 3,
            torch.randn(*shape, generator=g).half() * 3)


def test_f16_chain_computes_in_f32_by_default_and_rounds_at_the_store() -> None:
    a, b = inputs(16, 64)
    m = scheduled(chain, a, b)
    assert 'cuda_lowp="f32"' in str(m)  # the choice is in the dump
    got, src = run(m, a, b)
    assert "# f16/bf16: cuda_lowp=f32" in src
    assert ROUND_F16 not in src  # per-op rounding must not come back as the default
    assert ".to(tl.float16), mask=" in src  # the store rounds
    fa, fb = a.float(), b.float()
    want_f32 = (fa * fb + fa - fb).half()  # f32 compute, one rounding
    assert torch.equal(got, want_f32)
    eager = chain(a, b)  # rounds a*b, then +a, then -b
    assert not torch.equal(got, eager)  # the inputs do tell the two modes apart
    torch.testing.assert_close(got, eager, atol=0.05, rtol=2e-3)


def test_per_op_mode_rounds_every_result_as_eager() -> None:
    a, b = inputs(16, 64)
    m = scheduled(chain, a, b, lowp="per-op")
    assert 'cuda_lowp="per-op"' in str(m)
    got, src = run(m, a, b)
    assert "# f16/bf16: cuda_lowp=per-op" in src
    assert src.count(ROUND_F16) >= 3  # after the mul, the add and the sub
    assert torch.equal(got, chain(a, b))  # bit for bit


def test_the_mode_is_edited_in_a_dump_and_replays() -> None:
    a, b = inputs(8, 32)
    text = str(scheduled(chain, a, b))
    got, src = run(parse(text.replace('cuda_lowp="f32"', 'cuda_lowp="per-op"')), a, b)
    assert ROUND_F16 in src and torch.equal(got, chain(a, b))
    with pytest.raises(PipelineError, match="cuda_lowp='f8' is not valid"):
        run(parse(text.replace('cuda_lowp="f32"', 'cuda_lowp="f8"')), a, b)
    with pytest.raises(PipelineError, match="lowp='f8' is not one of f32, per-op"):
        scheduled(chain, a, b, lowp="f8")


def test_f32_kernels_carry_no_mode() -> None:
    a, b = inputs(8, 32)
    m = scheduled(chain, a.float(), b.float())
    assert "cuda_lowp" not in str(m)
    _, src = run(m, a.float(), b.float())
    assert "cuda_lowp" not in src


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, -1),
    lambda x: F.gelu(F.layer_norm(x, (x.shape[-1],))),
    lambda x: x.sum(-1) * 2,
], ids=["softmax", "layernorm_gelu", "sum"])
def test_f16_rows_keep_reductions_in_f32(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    x, _ = inputs(6, 100)
    got, src = run(scheduled(fn, x), x)
    assert ROUND_F16 not in src  # neither the row values nor the body are rounded
    want = fn(x.float()).half()  # the f32 computation, rounded once
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(got, fn(x), atol=1e-2, rtol=1e-2)  # and eager's, within f16
    got_op, src_op = run(scheduled(fn, x, lowp="per-op"), x)
    assert ROUND_F16 in src_op
    torch.testing.assert_close(got_op, fn(x), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("lowp", ["f32", "per-op"])
def test_bf16_cast_placement(lowp: str) -> None:
    """bf16 (rendered only: the interpreter's bf16 arithmetic is wrong; test_triton_lowp_cuda
    runs it on the device): loads upcast, the store rounds; per-op also rounds between ops."""
    a, b = (t.bfloat16() for t in inputs(8, 32))
    m = run_pipeline(scheduled(chain, a, b, lowp=lowp), "codegen-triton{interpret=true}")
    (k,) = m.kernels.values()
    body = k.source[k.source.index("def ember_k_"):]
    loads = [ln for ln in body.splitlines() if "tl.load(" in ln]
    assert loads and all("= _up_bf16(tl.load(" in ln for ln in loads)  # a 16-bit shift up
    assert ".to(tl.bfloat16), mask=" in body  # the store
    rounds = body.count(".to(tl.bfloat16).to(tl.float32)")
    assert (rounds >= 3) if lowp == "per-op" else (rounds == 0)
