"""benchmarks/cuda_host_profile.py without a GPU: its cProfile table and ember's call in parts
(guards, the graph's runner, the epilogue) on a model compiled for the CPU, the host timer
swapped for a plain wall-clock one (the script's synchronizes the GPU)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember.runtime
from tests.bench_scripts import load_script


def _wall_us(fn: Callable[[], Any], n: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def test_parts_and_top_functions_of_a_compiled_call(monkeypatch: pytest.MonkeyPatch) -> None:
    prof = load_script("cuda_host_profile")
    monkeypatch.setattr(prof.suite, "host_us", _wall_us)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(2, 8)
    with torch.no_grad():
        cf = ember.runtime.compile(model, dynamic=False)
        want = model(x)
        torch.testing.assert_close(cf(x), want)
        parts = prof.parts(cf, (x,), 20)
        rows = prof.top(lambda: cf(x), 10, 8)
    assert set(parts) == {"guards_us", "runner_us", "epilogue_us"}
    assert all(v > 0 for v in parts.values())
    assert len(rows) == 8 and rows == sorted(rows, key=lambda r: -r["own_us"])
    # the generated call is among the functions the call spends its own time in, once per call
    wrapper = [r for r in rows if "ember wrapper" in r["fn"]]
    assert wrapper and wrapper[0]["ncalls_per_call"] == 1.0
