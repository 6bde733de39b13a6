"""The training suite's harness (benchmarks/training.py) on a tiny MLP, eager + ember only:
every contender is timed, ember's first steps are checked against eager's, a mismatch is
reported, ember's forward and backward kernels are counted, peak step memory is measured and
rendered. Speed is never asserted."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.runtime.bench import Contender, eager_contender, ember_contender

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from training import (  # noqa: E402
    TrainCase,
    memory_section,
    peak_step_bytes,
    run_training_case,
)


def _mlp() -> tuple[nn.Module, object, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return m, lambda m, x, t: F.cross_entropy(m(x), t), (torch.randn(6, 8),
                                                          torch.randint(0, 4, (6,)))


def test_training_case_times_checks_and_measures() -> None:
    case = TrainCase("tiny mlp", "training", _mlp, "a tiny MLP")  # type: ignore[arg-type]
    r = run_training_case(case, [eager_contender(), ember_contender()], reps=2)
    assert set(r.timings) == {"eager", "ember"} and not r.error
    em = r.timings["ember"]
    assert em.check == "ok", em.check
    assert "training: forward" in em.info["status"] and em.info["fallbacks"] == []
    assert em.info["kernels"] > 0
    assert all(t.info["peak_step_bytes"] > 0 for t in r.timings.values())
    text = memory_section([r], ["eager", "ember"])
    assert "| tiny mlp |" in text and "ember / eager" in text


def test_a_wrong_compiler_is_reported() -> None:
    def wrong(fn: object) -> object:
        return lambda *a: fn(*a) * 1.5  # type: ignore[operator]

    case = TrainCase("tiny mlp", "training", _mlp)  # type: ignore[arg-type]
    r = run_training_case(case, [eager_contender(), Contender("bad", wrong, check=True)],
                          reps=1)
    assert r.timings["bad"].check is not None and r.timings["bad"].check.startswith("MISMATCH")


def test_peak_counts_a_steps_allocations() -> None:
    assert peak_step_bytes(lambda: torch.ones(1 << 20)) >= 4 << 20


def test_the_script_finds_every_training_case() -> None:
    """Run as a script, training.py is `__main__`, and suites.py's cases are instances of the
    module `training`'s TrainCase: the script must still select them (it once ran none)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "training.py"), "--list"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    names = out.stdout.split("\n")
    assert {"MLP train", "conv+BN train", "GPT-NeoX train", "Llama block train"} <= set(names)


def test_cache_directories_are_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cold compiles point the caches at temporary directories removed after; the process's
    # settings come back, set or unset, also when a contender fails (bench.caches_kept)
    monkeypatch.setenv("EMBER_CACHE_DIR", "/tmp/kept-ember-cache")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)

    def cold(d: Path) -> None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)

    def boom(fn: object) -> object:
        raise RuntimeError("no")
    case = TrainCase("tiny mlp", "training", _mlp)  # type: ignore[arg-type]
    r = run_training_case(case, [eager_contender(), ember_contender(),
                                 Contender("broken", boom, cold=cold)], reps=1)
    assert "broken" in r.error and "ember" in r.timings
    assert os.environ["EMBER_CACHE_DIR"] == "/tmp/kept-ember-cache"
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
