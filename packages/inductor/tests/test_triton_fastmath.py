"""The CUDA target's cheaper math and row scheduling for memory-bound kernels (render.py):
f32 exp as ex2.approx.ftz, 1 / x as div.approx (a numerator of 1 only), erf as the prelude's
rational fit, and `cuda_programs` (a rows kernel as a grid-stride loop over blocks of rows).
Rendering checked as text, results in Triton's interpreter against eager."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.inductor.schedule import ScheduleError
from ember.ir import parse
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY

Fn = Callable[..., torch.Tensor]


def scheduled(fn: Fn, *args: torch.Tensor) -> str:
    return str(run_pipeline(capture(fn, args, {}).module,  # type: ignore[arg-type]
                            "decompose,cse,dce,lower-loops,fuse,schedule-cuda"))


def run(text: str, fn: Fn, *args: torch.Tensor, tol: float = 1e-5) -> str:
    """Render the (edited) dump for the interpreter, run it, compare with eager; the source."""
    m = run_pipeline(parse(text), "codegen-triton{interpret=true},plan-buffers")
    load_module(m)
    got = compiled_runner(m)(None, list(args)).outputs[0]
    torch.testing.assert_close(got, fn(*args), atol=tol, rtol=tol)
    return "\n".join(k.source for k in m.kernels.values())


def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2.0 + y).sin() * x - y.abs()


def test_exp_and_reciprocal_forms() -> None:
    """sigmoid's exp and 1 / x render as fast_expf and fast_dividef(1.0, .); a tensor divided
    by a tensor stays `/` (div.approx would flush normal quotients); f64 keeps tl.exp."""
    x, y = torch.randn(8, 32), torch.randn(8, 32)
    src = run(scheduled(chain, x, y), chain, x, y)
    assert "= libdevice.fast_expf(" in src and "= libdevice.fast_dividef(1.0, " in src
    assert "tl.exp(" not in src and "(1.0 / " not in src

    def ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a / (b.abs() + 1.0)
    src = run(scheduled(ratio, x, y), ratio, x, y)
    body = src.split("@triton.jit")[-1]  # the kernel (the prelude's _erf has its own)
    assert "fast_dividef" not in body and " / " in body
    xd, yd = x.double(), y.double()
    src = run(scheduled(chain, xd, yd), chain, xd, yd, tol=1e-12)
    body = src.split("@triton.jit")[-1]
    assert "tl.exp(" in body and "fast_" not in body


EXP_FNS: dict[str, Fn] = {"exp": lambda a: torch.exp(a), "sigmoid": lambda a: torch.sigmoid(a)}
_COMPILED: dict[str, object] = {}


def compiled(name: str) -> object:
    """The interpreted kernel of EXP_FNS[name] over 4x16 f32 (compiled once per name)."""
    if name not in _COMPILED:
        x = torch.zeros(4, 16)
        m = run_pipeline(parse(scheduled(EXP_FNS[name], x)),
                         "codegen-triton{interpret=true},plan-buffers")
        load_module(m)
        _COMPILED[name] = compiled_runner(m)
    return _COMPILED[name]


@given(st.floats(-110.0, 100.0, width=32))
def test_sigmoid_and_exp_over_their_range(v: float) -> None:
    """exp and sigmoid (exp and 1 / x) of values around v, in f32 (down to where
    exp's results are below 2**-126: within an absolute 2e-38 of eager's)."""
    x = torch.linspace(-3.0, 3.0, 64).reshape(4, 16) + v
    for name, fn in EXP_FNS.items():
        got = compiled(name)(None, [x]).outputs[0]  # type: ignore[operator]
        torch.testing.assert_close(got, fn(x), atol=2e-38, rtol=2e-6)


def test_gelu_uses_the_prelude_erf() -> None:
    def f(a: torch.Tensor) -> torch.Tensor:
        return F.gelu(a)
    x = torch.randn(4, 64) * 3
    src = run(scheduled(f, x), f, x)
    assert "= _erf(" in src


def row_sum(a: torch.Tensor) -> torch.Tensor:
    return a.sum(-1)


def softmax(a: torch.Tensor) -> torch.Tensor:
    return torch.softmax(a, -1)


def ln_gelu(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(a, (a.shape[-1],), w, b))


@pytest.mark.parametrize("programs", [1, 3, 4, 5])
@pytest.mark.parametrize("case", ["row_sum", "softmax", "ln_gelu", "looped"])
def test_grid_stride_rows(case: str, programs: int) -> None:
    """cuda_programs=P: P programs each loop over every P-th block of rows (P dividing the
    blocks or not: the last pass masked), the results as with a program per block."""
    rows = 12
    x = torch.randn(rows, 64)
    fn: Fn
    args: tuple[torch.Tensor, ...]
    if case == "ln_gelu":
        fn, args = ln_gelu, (x, torch.randn(64), torch.randn(64))
    elif case == "looped":  # a row longer than one block: looped chunks inside the loop
        fn, args = softmax, (torch.randn(rows, 20000),)  # past PMAX_ROW
    else:
        fn, args = (row_sum if case == "row_sum" else softmax), (x,)
    text = re.sub(r"cuda_xblock=\d+", f"cuda_programs={programs}, cuda_xblock=2",  # 6 blocks
                  scheduled(fn, *args), count=1)
    src = run(text, fn, *args)
    assert f"'programs': {programs}" in src and "for it in range(" in src
    # 12 rows, XBLOCK 2: 6 blocks; P programs take ceil(6 / P) passes, masked when P does
    # not divide 6
    assert f"range({-(-6 // programs)})" in src
    assert ("if 12 % XBLOCK == 0" in src) == (6 % programs == 0)


def test_programs_past_the_blocks_is_a_program_per_block() -> None:
    x = torch.randn(4, 64)
    text = scheduled(row_sum, x).replace("cuda_xblock=", "cuda_programs=64, cuda_xblock=", 1)
    src = run(text, row_sum, x)
    assert "for it in range(" not in src and "'programs'" not in src


def test_a_bad_programs_value_is_named() -> None:
    x = torch.randn(4, 64)
    text = scheduled(row_sum, x).replace("cuda_xblock=", "cuda_programs=-2, cuda_xblock=", 1)
    with pytest.raises(ScheduleError, match="cuda_programs"):
        run_pipeline(parse(text), "codegen-triton{interpret=true}")


def test_division_by_a_row_value_is_one_reciprocal_per_row() -> None:
    """softmax's e / sum(e): e * (1 / sum), the reciprocal of the [XBLOCK, 1] row value once
    per row; a division by a per-element value stays a division."""
    x = torch.randn(6, 64)
    src = run(scheduled(softmax, x), softmax, x, tol=2e-6)
    assert "* (1.0 / " in src.split("@triton.jit")[-1]

    def per_element(a: torch.Tensor) -> torch.Tensor:
        return a.sum(-1, keepdim=True) / (a.abs() + 1.0)
    src = run(scheduled(per_element, x), per_element, x)
    assert "* (1.0 / " not in src.split("@triton.jit")[-1]


@pytest.mark.parametrize(("case", "dtype", "warps", "evict"), [
    ("row_sum", torch.bfloat16, 8, True), ("row_sum", torch.float32, 16, True),
    ("softmax", torch.bfloat16, 4, False), ("softmax", torch.float32, 8, False),
    ("ln_gelu", torch.bfloat16, 4, False), ("ln_gelu", torch.float32, 8, False)])
def test_rows_schedule_by_bytes(case: str, dtype: torch.dtype, warps: int, evict: bool) -> None:
    """4096-element rows: warps so that a thread loads 32 bytes in a plain row reduction (and
    L2 eviction hints on), 64 in a row with a body (hints off), as measured on the H200."""
    x = torch.randn(4, 4096, dtype=dtype)
    fn: Fn = {"row_sum": row_sum, "softmax": softmax, "ln_gelu": ln_gelu}[case]
    args = (x, torch.randn(4096, dtype=dtype), torch.randn(4096, dtype=dtype)) \
        if case == "ln_gelu" else (x,)
    text = scheduled(fn, *args)
    assert f"cuda_warps={warps}" in text
    m = run_pipeline(parse(text), "codegen-triton{interpret=true},plan-buffers")
    src = next(iter(m.kernels.values())).source
    assert ("eviction_policy='evict_first'" in src) == evict
    if dtype == torch.float32:  # the interpreter's bf16 arithmetic is not eager's
        load_module(m)
        torch.testing.assert_close(compiled_runner(m)(None, list(args)).outputs[0], fn(*args),
                                   atol=1e-4, rtol=1e-4)


def test_autotune_times_a_plain_reduction_without_its_default_hints() -> None:
    from ember.inductor.targets.cuda import autotune as at
    c = at.loop_candidates({"XBLOCK": 1, "num_warps": 8, "persistent": 1, "one_pass": 1,
                            "evict": 1}, 64, 4096)
    assert c[-1] == {**c[0], "cuda_evict": 0}


@pytest.mark.parametrize("name", ["amax", "amin", "argmax", "argmin", "softmax"])
def test_nan_propagating_row_max_and_min(name: str) -> None:
    """A persistent f32 row's amax/amin reduce with a NaN-propagating combine (one max.NaN an
    element, no second reduction looking for NaN): a row holding NaN gives NaN (argmax: its
    first NaN's index), as eager; +-inf rows too."""
    x = torch.randn(6, 64)
    x[1, 5] = float("nan")
    x[2, :] = float("-inf")
    x[3, 7] = float("inf")
    x[4, 60] = float("nan")
    x[4, 3] = float("nan")
    fn: Fn = {"amax": lambda a: a.amax(-1), "amin": lambda a: a.amin(-1),
              "argmax": lambda a: a.argmax(-1), "argmin": lambda a: a.argmin(-1),
              "softmax": softmax}[name]
    m = run_pipeline(parse(scheduled(fn, x)), "codegen-triton{interpret=true},plan-buffers")
    src = next(iter(m.kernels.values())).source
    assert "_nanmax" in src or "_nanmin" in src
    load_module(m)
    torch.testing.assert_close(compiled_runner(m)(None, [x]).outputs[0], fn(x), equal_nan=True)
