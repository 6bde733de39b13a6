"""Clamped indices in the C++ target's kernels (targets/cpu/cpp.py, `KERNEL_CPP`).

A `where` over a load whose index is clamped into its buffer (pad, concatenation, pooling's
and convolutions' windows) writes the clamp as max/min. As `std::max<int64_t>` (which returns
a reference) inside an `omp simd` loop, g++ kept the operands in per-lane arrays and read the
loads' indices back through gathers, even where the clamp does not depend on the vectorised
loop: a channels-last pad + mul ran ~8x slower than with the by-value `ember_imax`/`ember_imin`
of the prelude."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.targets.cpu.cache import BASE_FLAGS, CXX
from ember.inductor.targets.cpu.cpp import cexpr
from ember.ir.expr import parse_expr
from ember.runtime.compile import compile as ember_compile


def _pad_mul(x: torch.Tensor) -> torch.Tensor:
    # channels last: N, H, W padded; the kernel's loops are cut at H's and W's edges (9 nests,
    # splitloops.MAX_NESTS), N's clamps stay
    return torch.nn.functional.pad(x, (0, 0, 1, 1, 1, 1, 1, 1)) * 2.0


def _compiled(x: torch.Tensor, tmp: Path) -> str:
    """The pad kernel's dumped module; its result is eager's exactly."""
    got = ember_compile(_pad_mul, options={"dump_dir": str(tmp)})(x)
    torch.testing.assert_close(got, _pad_mul(x), rtol=0, atol=0, equal_nan=True)
    return next(tmp.glob("*.kernels.ir")).read_text()


def _blocks(text: str) -> dict[str, str]:
    return dict(re.findall(r'kernel @(\S+) cpp """(.*?)"""', text, re.S))


def test_index_max_and_min_are_written_by_value() -> None:
    assert cexpr(parse_expr("min(55, max(0, i1 - 1))")) == \
        "ember_imin(55, ember_imax(0, (-1 + i1)))"


def test_clamped_loads_match_eager_and_use_the_by_value_helpers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 12, 12, 32)
    x[0, 1, 2, 3] = float("nan")
    x[1, 2, 3, 4] = float("inf")
    text = _compiled(x, tmp_path)
    kernels = "".join(src for name, src in _blocks(text).items() if name != "cpp_prelude")
    assert "ember_imax(" in kernels and "ember_imin(" in kernels, kernels
    assert "std::max<int64_t>" not in kernels and "std::min<int64_t>" not in kernels, kernels


@pytest.mark.skipif(shutil.which("objdump") is None or shutil.which(CXX) is None,
                    reason="needs the C++ compiler and objdump")
def test_a_padded_channels_last_kernel_loads_without_gathers(tmp_path: Path) -> None:
    """The property itself: g++'s code for the pad kernel's vectorised loop has no gather
    (with std::max<int64_t> in its index it had 24)."""
    text = _compiled(torch.randn(2, 12, 12, 32), tmp_path / "dump")
    blocks = _blocks(text)
    src = tmp_path / "k.cpp"
    src.write_text("\n".join([blocks.pop("cpp_prelude"), *blocks.values()]))
    lib = tmp_path / "k.so"
    subprocess.run([CXX, *BASE_FLAGS, str(src), "-o", str(lib)], check=True)
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], check=True,
                         capture_output=True, text=True).stdout
    kernels = [f for f in asm.split("\n\n") if "<ember_k_" in f]
    assert kernels, asm[:2000]
    assert not any("gather" in f for f in kernels), \
        [line for f in kernels for line in f.splitlines() if "gather" in line][:10]
