"""Every model of the benchmark suites dumps every stage, and the dumps pass `ember check` and
replay unmodified (issue 13 #7, #8), through the CLI as a user runs it:

    compile(model, options={"dump_dir": D, "dump_each": True})(*inputs)
    ember check D/NAME.ir --inputs D/NAME.inputs.safetensors --backend inductor   (and prims)
    ember run D/NAME.stageNN.PASS.ir --inputs ... --allow-kernels    (each stage, the kernels)

The models are benchmarks/suites.py's, built as the benchmark builds them, with a smaller batch
(CPU CI has 2 cores): the `models` suite in inference; the `training` suite's models (forward +
loss, as benchmarks/training.py compiles them) both with gradients recorded (the captured
graph's dump is checked) and in inference (every stage). A replayed stage must give the dumped outputs within `ember check`'s whole-graph tolerances (it is the
same graph, lowered further: sums may be reordered). CI runs the `models` suite but GPT-NeoX,
and the MLP training case; the others are marked `fuzz` (long: `python3 dev.py fuzz`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import ember.runtime as er
from ember.runtime.check import compare_one
from ember.runtime.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
from suites import SUITES  # noqa: E402  (benchmarks/ is on the path now)
from training import TrainCase  # noqa: E402

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
CASES = {c.name: c for s in ("models", "training") for c in SUITES[s]()}
CI_TRAINING = ("MLP train",)
# 4 layers x 256 at 70 s here (test_check_minimize.py checks a tiny GPT-NeoX's dump in CI)
LONG_MODELS = ("GPT-NeoX",)


def _shrink(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A batch of 2 (16 tokens, 16x16 images); class targets follow their inputs."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() >= 1:
            a = a[:2]
            if a.dim() == 2 and not a.is_floating_point():  # token ids / next-token targets
                a = a[:, :16]
            elif a.dim() == 4:
                a = a[..., :16, :16]
            a = a.contiguous()
        out.append(a)
    return tuple(out)


def _target(name: str) -> tuple[Callable[..., Any], tuple[Any, ...], bool]:
    """(what the benchmark compiles, its inputs, whether gradients are recorded)."""
    case = CASES[name]
    if isinstance(case, TrainCase):
        model, loss, args = case.build()
        return (lambda *xs: loss(model, *xs)), _shrink(args), True
    fn, args = case.build()
    return fn, _shrink(args), False


def _params() -> list[Any]:
    out = []
    for name, case in CASES.items():
        long = isinstance(case, TrainCase) and name not in CI_TRAINING or name in LONG_MODELS
        marks = [pytest.mark.fuzz, pytest.mark.skipif(
            not LONG, reason="long (a larger model); runs with HYPOTHESIS_PROFILE=fuzz")] \
            if long else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def _check(ir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ember check` of an unmodified dump with its inputs: ok with both lowering backends."""
    inputs = str(ir.with_name(ir.name.removesuffix(".ir") + ".inputs.safetensors"))
    for backend in ("inductor", "prims"):
        rc = main(["check", str(ir), "--inputs", inputs, "--backend", backend])
        out = capsys.readouterr()
        assert rc == 0, (ir.name, backend, out.err[-2000:])
        assert out.out.startswith("ok: ") and "rtol 1e-4" in out.out


def _dump(fn: Callable[..., Any], args: tuple[Any, ...], grad: bool, d: Path,
          dump_each: bool) -> list[Path]:
    """Compile with dumps into `d`, run once; the captured graphs' dumps (STEM.ir)."""
    c = er.compile(fn, options={"dump_dir": str(d), "dump_each": dump_each})
    with warnings.catch_warnings():
        warnings.simplefilter("error", er.FallbackWarning)  # the dumps are of compiled graphs
        with torch.set_grad_enabled(grad):
            c(*args)
    rep = er.explain(c)
    assert rep.graph_count >= 1 and not rep.fallbacks, str(rep)
    # STEM.ir alone: not its stages, kernels, or a training compile's STEM.forward.ir and such
    dumps = sorted(p for p in d.glob("*.ir") if p.name.count(".") == 1)
    assert len(dumps) == rep.graph_count, [p.name for p in dumps]
    return dumps


@pytest.mark.parametrize("name", _params())
def test_suite_model_dumps_check_and_replay(name: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    fn, args, grad = _target(name)
    if grad:  # the graph the training benchmark compiles (gradients recorded): its dump checks
        (tmp_path / "grad").mkdir()
        for ir in _dump(fn, args, True, tmp_path / "grad", dump_each=False):
            _check(ir, capsys)
    # every stage: an inference compile (a training compile's stages, its forward and backward
    # graphs', replay too: packages/runtime/tests/test_training_dumps.py)
    capsys.readouterr()
    for ir in _dump(fn, args, False, tmp_path, dump_each=True):
        _check(ir, capsys)
        stem = ir.name.removesuffix(".ir")
        inputs = str(tmp_path / f"{stem}.inputs.safetensors")
        want = load_file(tmp_path / f"{stem}.outputs.safetensors")
        stages = sorted(tmp_path.glob(f"{stem}.stage*.ir")) + [tmp_path / f"{stem}.kernels.ir"]
        names = {p.name.split(".")[2] for p in stages[:-1]}
        assert {"decompose", "lower-loops", "fuse", "codegen-cpp"} <= names, names
        for stage in [ir, *stages]:
            got_path = tmp_path / "replay.safetensors"
            rc = main(["run", str(stage), "--inputs", inputs, "--out", str(got_path),
                       "--allow-kernels"])
            assert rc == 0, (stage.name, capsys.readouterr().err[-2000:])
            got = load_file(got_path)
            assert got.keys() == want.keys(), stage.name
            for k in want:
                d = compare_one(k, want[k], got[k])
                assert d.ok, f"{stage.name}: {d.describe()}"
        capsys.readouterr()


def test_every_suite_model_is_covered() -> None:
    assert {"MLP", "GPT-NeoX", "conv net", "tiny BERT", "MLP train", "conv+BN train",
            "GPT-NeoX train", "Llama block train"} <= set(CASES)
    assert [p.values[0] for p in _params()] == list(CASES)
