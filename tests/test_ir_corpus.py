"""The IR corpus: .ir files that must keep parsing, verifying and replaying (the compatibility
promise). Expected outputs were computed by calling the ATen ops in Python (make_corpus.py).

A replay is bitwise equal to eager computed here, on this machine (the promise is "bitwise on the
same machine"); the stored outputs, written on another CPU whose BLAS may round differently,
are met within a cross-machine tolerance (CROSS_MACHINE)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ember.ir import parse, verify
from ember.runtime import cli
from tests.ir_corpus import make_corpus

CORPUS = Path(__file__).parent / "ir_corpus"
# Another CPU's BLAS sums matmul/conv products in another order: ~1e-5 relative on the attention
# block's outputs (magnitudes up to ~60), seen between an AMD EPYC and the machine that wrote them.
CROSS_MACHINE = {"rtol": 1e-4, "atol": 1e-4}
IR_FILES = sorted(CORPUS.glob("*.ir"))
CASES = sorted(CORPUS.glob("*.in.safetensors"))


def _case_id(p: Path) -> str:
    return p.name.removesuffix(".in.safetensors")


def test_corpus_is_not_empty() -> None:
    assert len(IR_FILES) >= 4 and len(CASES) >= 7


@pytest.mark.parametrize("path", IR_FILES, ids=lambda p: p.name)
def test_corpus_parses_verifies_and_round_trips(path: Path) -> None:
    m = parse(path.read_text())
    verify(m)
    text = str(m)
    assert str(parse(text)) == text


def _assert_bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("inputs", CASES, ids=_case_id)
def test_corpus_replays_with_eager_numbers(inputs: Path, tmp_path: Path) -> None:
    file, graph = _case_id(inputs).split(".")
    out = tmp_path / "out.safetensors"
    rc = cli.main(["run", str(CORPUS / f"{file}.ir"), "--graph", graph, "--inputs", str(inputs),
                   "--out", str(out)])
    assert rc == 0
    got = load_file(str(out))
    _assert_bitwise(got, _eager_here(file, graph, load_file(str(inputs))))
    stored = load_file(str(CORPUS / f"{file}.{graph}.out.safetensors"))
    assert got.keys() == stored.keys()
    for k in stored:
        torch.testing.assert_close(got[k], stored[k], equal_nan=True, **CROSS_MACHINE)


def _eager_here(file: str, graph: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The case's eager function run now on its stored inputs."""
    (fn,) = [fn for f, g, fn, _ in make_corpus.CASES if (f, g) == (file, graph)]
    return {k: v.contiguous() for k, v in fn(**{k: v.clone() for k, v in inputs.items()}).items()}


def _ember_cmd() -> list[str]:
    script = Path(sys.executable).parent / "ember"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ember.runtime.cli"]


def test_corpus_replays_from_the_shell(tmp_path: Path) -> None:
    """The installed `ember` command, as a researcher runs it."""
    out = tmp_path / "out.safetensors"
    stem = CORPUS / "mutation.bn_stats"
    proc = subprocess.run(
        _ember_cmd() + ["run", str(CORPUS / "mutation.ir"), "--graph", "bn_stats",
                        "--inputs", f"{stem}.in.safetensors", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _assert_bitwise(load_file(str(out)),
                    _eager_here("mutation", "bn_stats", load_file(f"{stem}.in.safetensors")))
