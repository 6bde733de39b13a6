"""The CUDA target's bf16-output math (lowp.py `cuda_math="bf16"`, prelude.py `_erf1p_bf16`,
`_gelu_phi_bf16`, `_up_bf16`): which kernels get it, and each function's stated
error bound, run by Triton's interpreter against torch in f64 (dense grids) and in f32
(hypothesis over the whole f32 range, results compared after rounding to bf16 as the kernel
stores them)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.schedule import ScheduleError
from ember.ir import parse
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.inductor.tests.prelude_kernels import elementwise, prelude_module

pytestmark = INTERPRETER_ONLY

ERF1P_REL = 9.4e-4  # 1 + erf(C x), C x >= -4 (measured 9.33e-4: the fit's own error)
ERF1P_ABS_TAIL = 2e-8  # C x < -4 (measured 3e-11)
GELU_C = 0.7071067811865476

KERNEL = '''

@triton.jit
def erf1p_kernel(x_ptr, out_ptr, n, C: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, _erf1p_bf16(tl.load(x_ptr + offs, mask=m, other=0.0), C), mask=m)


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # as a bf16 gelu kernel computes
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(out_ptr + offs, y * _gelu_phi_bf16(y, 0.7071067811865476), mask=m)


@triton.jit
def up_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, _up_bf16(tl.load(x_ptr + offs)))
'''


@pytest.fixture(scope="module")
def mod(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The prelude (interpreter form) with kernels applying the functions elementwise."""
    return prelude_module(tmp_path_factory.mktemp("bf16math"), "ember_test_bf16_math_kernels",
                          KERNEL)


@pytest.mark.parametrize("c", [1.0, GELU_C])
def test_erf1p_bound_on_a_dense_grid(mod: Any, c: float) -> None:
    """Every 2**-10 step of [-8, 8]: 1 + erf(c x) within ERF1P_REL of erfc(-c x) in f64 where
    c x >= -4 (relative: the lower tail keeps its digits), within ERF1P_ABS_TAIL below."""
    x = torch.arange(-8.0, 8.0, 2.0 ** -10, dtype=torch.float64).float()
    got = elementwise(mod.erf1p_kernel, x, C=c).double()
    want = torch.special.erfc(-c * x.double())
    inside = c * x.double() >= -4
    rel = ((got - want).abs() / want)[inside]
    assert rel.max().item() <= ERF1P_REL, (rel.max().item(), x[inside][rel.argmax()].item())
    assert (got - want).abs()[~inside].max().item() <= ERF1P_ABS_TAIL
    assert got.min().item() >= 0.0 and got.max().item() <= 2.0


def test_erf1p_special_values(mod: Any) -> None:
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e30, -1e30])
    got = elementwise(mod.erf1p_kernel, x, C=1.0)
    assert math.isnan(got[0].item())
    assert got[1:].tolist() == [2.0, 0.0, 1.0, 1.0, 2.0, 0.0]


def bf16_close(got: torch.Tensor, want: torch.Tensor, floor: float) -> None:
    """got and want (f32) rounded to bf16 within one bf16 step of each other, or within
    `floor` absolutely (where f32's own rounding in eager's formula dominates)."""
    g, w = got.bfloat16().double(), want.bfloat16().double()
    step = torch.ldexp(torch.ones_like(w), torch.frexp(w.abs().clamp_min(1e-30))[1] - 8)
    ok = ((g - w).abs() <= step) | ((got.double() - want.double()).abs() <= floor) | \
        (g.isnan() & w.isnan())
    assert bool(ok.all()), (got[~ok][:4].tolist(), want[~ok][:4].tolist())


floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
# eager's CPU gelu overflows to inf above 1.7e38 (its x * (1 + erf) before the 0.5)
GELU_MAX = 1e38


@given(st.lists(floats32, min_size=1, max_size=64))
def test_gelu_bf16_matches_torch_f32_over_the_whole_range(mod: Any, xs: list[float]) -> None:
    """y (1 + erf(y / sqrt 2)) / 2 as a bf16 gelu kernel computes it, against torch's f32
    gelu: within one bf16 step after both round to bf16 (or 1e-6 absolutely: eager's
    1 + erf cancels in f32 below y = -4)."""
    x = torch.tensor(xs, dtype=torch.float32).clamp(-GELU_MAX, GELU_MAX)
    bf16_close(elementwise(mod.gelu_kernel, x), F.gelu(x), floor=1e-6)


def test_gelu_bf16_every_bf16_input(mod: Any) -> None:
    """Every finite bf16 value as the input (the layernorm's output is f32; its bf16 values
    cover every binade)."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x[x.float().abs() < GELU_MAX].float()
    bf16_close(elementwise(mod.gelu_kernel, x, block=4096), F.gelu(x), floor=1e-6)


def test_up_bf16_is_exact(mod: Any) -> None:
    """bf16 loads upcast by a 16-bit shift: every bf16 bit pattern, NaNs and infinities
    included, gives the f32 that torch's conversion gives."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    out = torch.empty(x.numel(), dtype=torch.float32)
    mod.up_kernel[(x.numel() // 4096,)](x, out, BLOCK=4096)
    assert torch.equal(out.view(torch.int32), x.float().view(torch.int32))


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def sin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2.0


def scheduled(fn: Any, x: torch.Tensor, lowp: str = "f32") -> str:
    return str(run_pipeline(capture(fn, (x,), {}).module,  # type: ignore[arg-type]
                            f"decompose,cse,dce,lower-loops,fuse,schedule-cuda{{lowp={lowp}}}"))


def source(text: str) -> str:
    m = run_pipeline(parse(text), "codegen-triton{interpret=true}")
    return "\n".join(k.source[k.source.index("def ember_k_"):] for k in m.kernels.values())


@pytest.mark.parametrize("fn,name", [(gelu, "_gelu_phi_bf16(")])
def test_bf16_results_only_get_the_cheaper_math(fn: Any, name: str) -> None:
    """schedule-cuda writes cuda_math="bf16" on kernels whose every result is bf16 (under
    lowp=f32 only); f32 and f16 kernels, per-op rounding and an edited "accurate" keep the
    accurate functions; a bad value is refused."""
    x = torch.randn(4, 32)
    text = scheduled(fn, x.bfloat16())
    assert 'cuda_math="bf16"' in text
    assert name in source(text)
    accurate = text.replace('cuda_math="bf16"', 'cuda_math="accurate"')
    assert name not in source(accurate)
    for other in (scheduled(fn, x), scheduled(fn, x.half()),
                  scheduled(fn, x.bfloat16(), lowp="per-op")):
        assert "cuda_math" not in other and name not in source(other)
    with pytest.raises(ScheduleError, match="cuda_math"):
        source(text.replace('cuda_math="bf16"', 'cuda_math="fast"'))


def test_bf16_sin_stays_libdevice() -> None:
    """sin keeps libdevice's sinf in bf16 kernels too (a cheaper one measured slower)."""
    text = scheduled(sin, torch.randn(4, 32).bfloat16())
    assert 'cuda_math="bf16"' in text and "tl.sin(" in source(text)
