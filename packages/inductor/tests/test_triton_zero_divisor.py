"""Index math over a dimension of size 0 (`x.repeat(2, 0)`: `i // 0`, `i % 0`) prints as 0.

Every access such an index reaches is masked off or never runs, so any value does. Printed as
written, Triton evaluates it on masked lanes too, and its compiler aborts the whole process
folding a constant `0 % 0` (TritonGPUCoalesce; seen on the H200 on 2026-12-03, where it took
down the op database's worker pool). Checked here: the expression printer, the rendered
kernels (interpreter, against eager) and Triton's real compile for sm_90 in a subprocess (the
abort came from the device's triton 3.6; this machine's 3.9 compiles the old form too, so
there the compile check guards only against regressions of the fixed form)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.ir.expr import CPP, TRITON, FloorDiv, PyMod, print_expr
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

ZERO_DIVISOR = re.compile(r"(_mod|_floordiv)\([^()]*, 0\)|(%|//) \(?0\)?(?![.\d])")


def test_a_zero_divisor_prints_as_zero_in_every_language() -> None:
    i = sympy.Symbol("i0", integer=True, nonnegative=True)
    for lang in (TRITON, CPP):
        assert print_expr(FloorDiv(i, 0), lang) == "0"
        assert print_expr(PyMod(FloorDiv(i, 0), 2), lang).endswith("_mod(0, 2)")
        assert print_expr(PyMod(i + 1, 0), lang) == "0"
    assert "_mod" in print_expr(PyMod(i, 3), TRITON)  # other divisors are untouched


def _sources(fn: Any, *args: torch.Tensor) -> tuple[Any, list[str]]:
    m = run_pipeline(capture(fn, args, {}).module,  # type: ignore[attr-defined]
                     "decompose,cse,dce,inductor-cuda-interpret")
    return m, [k.source for k in m.kernels.values()]


@INTERPRETER_ONLY
@settings(max_examples=12, deadline=None)
@given(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2), st.integers(0, 2))
def test_repeat_with_a_zero_factor_renders_no_zero_divisor(r: int, c: int, f0: int,
                                                           f1: int) -> None:
    x = torch.randn(r, c, dtype=torch.float64)
    m, srcs = _sources(lambda a: a.repeat(f0, f1) + 1, x)
    for src in srcs:
        assert not ZERO_DIVISOR.search(src), src
    got = compiled_runner(m)(None, [x]).outputs[0]
    torch.testing.assert_close(got, x.repeat(f0, f1) + 1)


def zero_divisor_compile_check() -> None:
    """repeat(2, 0)'s kernel compiled for sm_90 for real (Triton's compile and ptxas, a
    FakeDriver for the rest), in a process where Triton never interpreted."""
    import contextlib
    import tempfile

    import triton.compiler.compiler as triton_compiler
    from triton.runtime import driver

    from ember.inductor.targets.cuda import codegen, launcher
    from ember.ir import parse
    from packages.inductor.tests.test_cuda_launch import FakeDriver, block_module, captured
    assert os.environ.get("TRITON_INTERPRET", "0") != "1"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-test-triton-")
    x = torch.randn(2, 3, dtype=torch.float64)  # (the H200's abort was an f64 kernel)
    text = re.sub(r"((?:f64|i64)\[[^\]]*\])(?!@)", r"\1@cuda:0",
                  str(captured(lambda a: a.repeat(2, 0) + 1, x)))
    m = run_pipeline(parse(text), "decompose,cse,dce,inductor-cuda")
    setattr(triton_compiler, "max_shared_mem", lambda dev: 232448)  # noqa: B010
    driver.set_active(FakeDriver())  # type: ignore[arg-type,unused-ignore]
    sigs = codegen._signatures(m)
    jobs = []
    for k in m.kernels.values():
        want = sigs[k.name]
        assert not isinstance(want, str), want
        args, dev = want
        jobs.append(launcher.Job(k.name, block_module(k), args, dev, len(args)))
    report = launcher.LoadReport()
    launcher.compile_and_bind(jobs, report, workers=1,
                              device=lambda d: contextlib.nullcontext(), init=lambda: None)
    assert report.summary()["fast"] == len(jobs) >= 1, report.kernels
    print("zero divisor compile: ok")


@INTERPRETER_ONLY
def test_triton_compiles_a_kernel_over_a_zero_dimension() -> None:
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        if not os.path.exists(get_ptxas(90).path):
            pytest.skip("triton without its ptxas")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"triton without its nvidia backend ({e})")
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # (ember.testing.triton_mode: no interpreter)
    code = ("from packages.inductor.tests.test_triton_zero_divisor import "
            "zero_divisor_compile_check; zero_divisor_compile_check()")
    p = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and "zero divisor compile: ok" in p.stdout, \
        (p.returncode, p.stderr[-3000:])
