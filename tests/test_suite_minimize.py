"""`ember minimize` on model-sized graphs (issue 13 #9): the captured graphs of the benchmark
suites' transformers (tiny BERT: 92 aten nodes, GPT-NeoX: 231), with a bug planted in a layer
under test, shrink to a handful of nodes that hold the faulty op, and the written repro (.ir +
inputs) replays: `ember check` of it still fails, `ember run` of it runs.

The bugs: a wrong decomposition (gelu's, 0.1% off, through the prims backend) and a wrong
kernel (the C++ of prims.erf, 1% off, through the inductor backend). Measured on the 2-core
CPU machine: GPT-NeoX 231 -> 1 node in 12 backend runs for either bug (38 s through prims,
113 s through the inductor: every candidate compiles C++); tiny BERT 92 -> 1 in 13 runs. CI
minimizes BERT's wrong decomposition; the rest is marked `fuzz` (long: `python3 dev.py fuzz`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.ir import Module, parse
from ember.prims.decomp.table import DECOMPOSITIONS
from ember.runtime.cli import main
from ember.runtime.tensors import load_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
from suites import SUITES  # noqa: E402  (benchmarks/ is on the path now)

CASES = {c.name: c for c in SUITES["models"]()}
LONG = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
HANDFUL = 5


def _dumped(name: str, d: Path) -> tuple[Path, Module, list[Any]]:
    """The model's captured graph as EMBER_DUMP writes it (batch 2 x 16 tokens): the .ir, the
    module read back, its inputs."""
    fn, (ids,) = CASES[name].build()
    with torch.no_grad():
        er.compile(fn, backend="eager", options={"dump_dir": str(d)})(ids[:2, :16].contiguous())
    (ir,) = [p for p in d.glob("*.ir") if not p.name.endswith(".kernels.ir")]
    m = parse(ir.read_text())
    inputs = load_inputs(str(ir.with_name(ir.name[:-3] + ".inputs.safetensors")), m.graph(), m)
    return ir, m, inputs


def _wrong_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    right = DECOMPOSITIONS.get("aten.gelu.default")

    def wrong(ctx: Any, **kw: Any) -> Any:
        return ctx.prim("mul", right(ctx, **kw), 1.001)

    monkeypatch.setitem(DECOMPOSITIONS._fns, "aten.gelu.default", wrong)


def _wrong_erf_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.inductor.cpp import CPP_OPS

    monkeypatch.setitem(CPP_OPS, "prims.erf", {"f": "std::erf({0}) * 1.01f"})


BUGS = {"wrong decomposition": ("prims", _wrong_gelu),
        "wrong kernel": ("inductor", _wrong_erf_kernel)}


def _params() -> list[Any]:
    out = []
    for name in ("tiny BERT", "GPT-NeoX"):
        for bug in BUGS:
            long = (name, bug) != ("tiny BERT", "wrong decomposition")
            marks = [pytest.mark.fuzz, pytest.mark.skipif(
                not LONG, reason="long (a larger graph or C++ per candidate); runs with "
                "HYPOTHESIS_PROFILE=fuzz")] if long else []
            out.append(pytest.param(name, bug, marks=marks, id=f"{name}-{bug}"))
    return out


@pytest.mark.parametrize("name,bug", _params())
def test_planted_bug_shrinks_to_a_handful_and_replays(
        name: str, bug: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ir, m, inputs = _dumped(name, tmp_path)
    nodes = len(m.graph().nodes)
    assert nodes >= 80, nodes  # model-sized, not a toy
    backend, plant = BUGS[bug]
    ins = str(ir.with_name(ir.name[:-3] + ".inputs.safetensors"))
    assert main(["check", str(ir), "--backend", backend, "--inputs", ins]) == 0  # no bug yet
    plant(monkeypatch)
    assert main(["check", str(ir), "--backend", backend, "--inputs", ins]) == 1
    out = tmp_path / "repro.ir"
    capsys.readouterr()
    assert main(["minimize", str(ir), "--backend", backend, "--inputs", ins,
                 "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"from {nodes} to" in said and "it still fails" in said, said
    repro = parse(out.read_text())
    ops = [n.op for n in repro.graph().nodes]
    assert 1 <= len(ops) <= HANDFUL and "aten.gelu.default" in ops, ops
    repro_inputs = str(tmp_path / "repro.inputs.safetensors")
    assert main(["check", str(out), "--backend", backend, "--inputs", repro_inputs]) == 1
    assert main(["run", str(out), "--inputs", repro_inputs]) == 0
    monkeypatch.undo()  # the bug fixed: the repro passes
    capsys.readouterr()
    assert main(["check", str(out), "--backend", backend, "--inputs", repro_inputs]) == 0
