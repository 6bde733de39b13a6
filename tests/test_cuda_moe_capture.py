"""The MoE decoders on CUDA (issue 16): on the H200, hf/mixtral and hf/qwen2-moe ran entirely
eagerly under ember while the CUDA suite reported no fallback. transformers' grouped-matmul
experts ask `torch.cuda.get_device_capability(weight.device)` on CUDA before choosing
`grouped_mm`; capture traced into it (C queries of the driver), broke the graph there, and the
model ran eagerly: explain() listed the break, but the suite's columns (fallbacks only) did not.

Without a GPU: `torch.cuda.get_device_properties` is replaced by an H200's answer (sm_90), so the
real `torch.cuda.get_device_capability` runs on this machine as it does there. Capture reads the
capability once (a fact of the machine) and the graph stays whole; and a function that did run
eagerly through a graph break shows as not compiled in benchmarks/gpu_cuda_suite.py's report
and benchmarks/cuda_checks.py's census.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import ember.runtime as er
from tests.bench_scripts import load_script


def _h200_properties(device: Any = None) -> Any:
    torch._C._get_cpu_capability()  # a C query, as the real one's (capture does not trace it)
    return types.SimpleNamespace(major=9, minor=0)


@pytest.fixture
def sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties", _h200_properties)


def _experts(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers' `_can_use_grouped_mm` on CUDA, then the chosen path."""
    if torch.cuda.get_device_capability(w.device) >= (8, 0):
        return torch.relu(x @ w) + 1
    return x - 1


def test_device_capability_is_read_at_capture_and_the_graph_stays_whole(sm90: None) -> None:
    cf = er.compile(_experts, backend="inductor")
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(cf(x, w), _experts(x, w))
    hist = cf.history
    assert len(hist.graphs) == 1 and not hist.breaks and not hist.fallbacks, er.explain(cf)
    assert any("the inductor backend compiled it" in n for n in hist.notes)


def _inner(y: torch.Tensor) -> torch.Tensor:
    if torch._C._get_cpu_capability() == "never":  # a C query capture does not trace
        return y
    return y * 2


def _untraceable(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A graph break in a nested call."""
    return _inner(torch.relu(x @ w)) + 1


def _compiled_with_a_break() -> Any:
    cf = er.compile(_untraceable, backend="inductor")
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(cf(x, w), _untraceable(x, w))
    assert cf.history.breaks
    return cf


def test_suite_reports_a_graph_break_as_not_compiled() -> None:
    suite = load_script("gpu_cuda_suite")
    got = suite.what_ran(_compiled_with_a_break())
    assert got["graph_breaks"] and "_get_cpu_capability" in got["graph_breaks"][0]
    assert got["compiled"] is False
    # and the models table's last column says so
    row = {"section": "models", "model": "m", "eager_ms": 1.0, **got}
    text = suite.markdown([row], {}, 1.0)
    line = next(ln for ln in text.splitlines() if ln.startswith("| m |"))
    assert line.rstrip(" |").endswith(" NOT COMPILED"), line


def test_checks_census_says_compiled_only_for_whole_graphs(sm90: None) -> None:
    checks = load_script("cuda_checks")
    broken = checks.census(_compiled_with_a_break())
    assert broken["compiled"] is False and broken["graph_breaks"] >= 1
    cf = er.compile(_experts, backend="inductor")
    cf(torch.randn(4, 8), torch.randn(8, 8))
    whole = checks.census(cf)
    assert whole["compiled"] is True and whole["kernels"] >= 1
    # the product is the one extern (on CPU tensors the CPU target's packed linear, since
    # `w` is a graph input)
    assert sum(whole["externs"].values()) == 1, whole["externs"]


def _only_a_break(x: torch.Tensor) -> torch.Tensor:
    torch._C._get_cpu_capability()
    return x


def test_explain_says_when_breaks_left_nothing_compiled() -> None:
    """As the MoE decoders did on the H200: graph breaks and no graph at all. explain() said
    "0 fallback(s)"; it now says that every call ran eagerly."""
    cf = er.compile(_only_a_break, backend="inductor")
    cf(torch.randn(3))
    text = str(er.explain(cf))
    assert "nothing compiled: every call ran eagerly" in text.splitlines()[1], text
    whole = er.compile(_experts_cpu, backend="inductor")
    whole(torch.randn(4, 8), torch.randn(8, 8))
    assert "nothing compiled" not in str(er.explain(whole))


def _experts_cpu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w) + 1


class _Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return _inner(self.lin(input_ids)) + 1


class _Keywords(torch.nn.Module):
    """benchmarks/zoo_models.py's Keywords: the HF model called as model(**inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _Inner()

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(("input_ids",), args)))  # type: ignore[no-any-return]


def test_a_break_under_a_kwargs_call_still_compiles_the_callee() -> None:
    """The MoE decoders' break sat under Keywords' `self.model(**inputs)` (CALL_FUNCTION_EX),
    whose callee the break did not pass through ember's compile: the whole model ran eagerly
    with no graph. The callee is compiled on its own now, as under a plain call."""
    m = _Keywords().eval()
    cf = er.compile(m, backend="inductor")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(cf(x), m(x))
    hist = cf.compiled.history
    assert hist.breaks and len(hist.graphs) >= 1, er.explain(cf)
    assert "nothing compiled" not in str(er.explain(cf))
