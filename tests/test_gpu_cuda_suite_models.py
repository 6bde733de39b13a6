"""benchmarks/gpu_cuda_suite.py's models section (issue 16 item 6): its model list comes from the
zoo (benchmarks/zoo_models.py), `--models zoo30` is 30 torchvision, timm and HF models, each
model runs under a timeout, and a failed or timed-out model is a row of the report. No GPU: the
parts that decide what runs and how it reports."""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.bench_scripts import load_script


@pytest.fixture(scope="module")
def suite() -> ModuleType:
    return load_script("gpu_cuda_suite")


def test_zoo30_is_thirty_zoo_models_of_every_family(suite: ModuleType) -> None:
    zoo_models = suite._zoo_models()
    names = suite.model_names("zoo30")
    assert len(names) == len(set(names)) == 30
    assert all(n in zoo_models.BY_NAME for n in names)
    assert {zoo_models.BY_NAME[n].family for n in names} == {"torchvision", "timm", "hf"}
    default = suite.model_names(suite.DEFAULT_MODELS)
    assert default[:2] == ["mlp", "convnet"] and default[2:] == names
    # the earlier 12 come first, so old and new runs compare
    assert suite.model_names("base") == default[:12]


def test_model_names_expand_sets_keep_order_and_exclude(suite: ModuleType) -> None:
    assert suite.model_names("hf/bart,mlp,hf/bart") == ["hf/bart", "mlp"]
    rest = suite.model_names("zoo30", exclude="base")
    assert len(rest) == 20 and "hf/llama" not in rest and rest[0] == "tv/resnet50"
    assert suite.model_names("mlp,convnet", exclude="convnet") == ["mlp"]


def test_builders_run_on_cpu_and_unknown_names_fail_as_rows(
        suite: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(suite, "OUT", tmp_path)
    rows = suite.check_builders("mlp,convnet,no/such-model")
    assert [r["model"] for r in rows] == ["mlp", "convnet", "no/such-model"]
    assert rows[0]["ok"] and rows[0]["shape"] == [64, 1024]
    assert rows[1]["ok"] and rows[1]["shape"] == [2, 10]
    assert not rows[2]["ok"] and "no model 'no/such-model'" in rows[2]["error"]
    assert (tmp_path / "suite.jsonl").read_text().count('"section": "builders"') == 3


def test_timeout_interrupts_and_escapes_broad_excepts(suite: ModuleType) -> None:
    def swallowing() -> None:  # a compiler that falls back on any Exception
        try:
            time.sleep(5)
        except Exception:  # noqa: BLE001
            pass
    t0 = time.perf_counter()
    with pytest.raises(suite.ModelTimeout, match="timed out after 1 s"):
        suite.with_timeout(1.0, swallowing)
    assert time.perf_counter() - t0 < 4
    assert suite.with_timeout(5.0, lambda: 7) == 7  # the alarm is cleared after a normal return
    time.sleep(0.01)


def test_report_lists_failed_models_and_geomeans_the_rest(suite: ModuleType) -> None:
    rows = [
        {"section": "models", "model": "a", "eager_ms": 2.0, "tc_ms": 1.0, "ember_ms": 1.0,
         "tc_speedup": 2.0, "ember_speedup": 2.0, "ember_correct": True, "tc_correct": True},
        {"section": "models", "model": "b", "eager_ms": 2.0, "tc_ms": 1.0, "tc_speedup": 2.0,
         "ember_error": "RuntimeError: no"},
        {"section": "models", "model": "c", "error": "timeout: timed out after 90 s"},
        {"section": "models", "model": "d", "eager_ms": 1.0, "tc_ms": 0.5, "ember_ms": 2.0,
         "tc_speedup": 2.0, "ember_speedup": 0.5, "error": "timeout: timed out after 90 s",
         "ember_correct": True, "tc_correct": True},
        # timed but wrong: left out of the geomean
        {"section": "models", "model": "e", "eager_ms": 2.0, "tc_ms": 1.0, "ember_ms": 0.1,
         "tc_speedup": 2.0, "ember_speedup": 20.0, "ember_correct": False, "tc_correct": True},
    ]
    md = suite.markdown(rows, {"gpu": "none"}, 4.0)
    assert "| c | error: timeout: timed out after 90 s |" in md
    assert "RuntimeError: no" in md
    line_d = next(ln for ln in md.splitlines() if ln.startswith("| d |"))
    assert "timed out" in line_d and line_d.count("|") == 16
    assert ("(2 of 5 models, those both compilers ran and got right): torch.compile 2.00x, "
            "ember 1.00x") in md


def test_a_tc_row_that_compiled_nothing_is_flagged_and_left_out(suite: ModuleType) -> None:
    # hf/bloom, gemma, bart, deberta-v2 in the 2026-12-02 run: torch.compile ran them eagerly
    rows = [
        {"section": "models", "model": "a", "eager_ms": 2.0, "tc_ms": 1.0, "ember_ms": 1.0,
         "tc_speedup": 2.0, "ember_speedup": 2.0, "ember_correct": True, "tc_correct": True,
         "tc_compiled": True, "tc_compile_s": 5.0, "ember_compile_s": 1.0},
        {"section": "models", "model": "b", "eager_ms": 2.0, "tc_ms": 2.0, "ember_ms": 0.5,
         "tc_speedup": 1.0, "ember_speedup": 4.0, "ember_correct": True, "tc_correct": True,
         "tc_compiled": False, "tc_compile_s": 0.01, "ember_compile_s": 2.0},
    ]
    md = suite.markdown(rows, {"gpu": "none"}, 4.0)
    line_b = next(ln for ln in md.splitlines() if ln.startswith("| b |"))
    assert "| yes / NOT COMPILED |" in line_b
    assert "(1 of 2 models, those both compilers ran and got right): torch.compile 2.00x" in md
    assert "torch.compile compiled no graph of: b" in md
    assert "ember at or below torch.compile on 1 of 1 models" in md


def test_each_torch_compile_starts_cold(suite: ModuleType) -> None:
    # the same code compiled again, as transformers' shared forward code is by the next HF
    # model: without the reset, dynamo's cache serves it and no graph is compiled
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin()

    x = torch.randn(4)
    n0 = suite.dynamo_graphs()
    suite.fresh_torch_compile(f, backend="eager")(x)
    n1 = suite.dynamo_graphs()
    suite.fresh_torch_compile(f, backend="eager")(x)
    assert n1 - n0 == 1 and suite.dynamo_graphs() - n1 == 1
    torch.compile(f, backend="eager")(x)  # no reset: a cache hit, nothing compiled
    assert suite.dynamo_graphs() - n1 == 1
    torch._dynamo.reset()
