"""plan-buffers reuses a dead buffer's storage for a later kernel output only where holding it
until then does not raise the graph's peak: a buffer that died before a mid-graph peak is let
go, not kept across it for one small reuse at the end (a training backward held its first
[tokens, vocab] buffer to the embedding gradient at its very end: +1 MB on a Llama step)."""

from __future__ import annotations

import pytest
import torch

import ember.inductor.buffers as buffers
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Module, parse

# %a dies at the first matmul; %t1 and %t2 (16x its size) are the peak; %o could take %a's
PEAK_BETWEEN = """ember.ir 1.0

graph @f(%x: f32[8, 16], %w1: f32[16, 256], %w2: f32[256, 16]) -> (f32[8, 16]) {
  %a = prims.exp(%x) : f32[8, 16]
  %m1 = prims.matmul(%a, %w1) : f32[8, 256]
  %t1 = prims.sin(%m1) : f32[8, 256]
  %t2 = prims.cos(%m1) : f32[8, 256]
  %m2 = prims.matmul(%t1, %w2) : f32[8, 16]
  %m3 = prims.matmul(%t2, %w2) : f32[8, 16]
  %s = prims.add(%m2, %m3) : f32[8, 16]
  %o = prims.tanh(%s) : f32[8, 16]
  return (%o)
}
"""


def _reuses(m: Module) -> dict[str, list[str]]:
    return {n.results[0].name: [r.name for r in n.kwargs.get("reuse", [])]  # type: ignore[union-attr]
            for n in m.graph().nodes if n.op == "kernels.call"}


def _check(m: Module) -> None:
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(8, 16, generator=g), torch.randn(16, 256, generator=g) / 4,
                 torch.randn(256, 16, generator=g) / 16)
    m1 = torch.exp(x) @ w1
    want = torch.tanh(torch.sin(m1) @ w2 + torch.cos(m1) @ w2)
    run = compiled_runner(m)
    for _ in range(2):
        torch.testing.assert_close(run(None, [x, w1, w2]).outputs[0], want)


@pytest.fixture(autouse=True)
def _no_inplace(monkeypatch: pytest.MonkeyPatch) -> None:
    """%o's kernel reads %m2 and %m3 only at its own element, where they die: it would be
    written over %m2 (inplace=, test_cpu_inplace.py). These tests are about held buffers."""
    monkeypatch.setattr(buffers, "_operand_dying", lambda *a, **k: None)


def test_a_buffer_dead_before_the_peak_is_not_held_across_it() -> None:
    m = compile_module(parse(PEAK_BETWEEN))
    assert _reuses(m)["o"] == []
    _check(m)


def test_holding_it_is_what_the_rule_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the peak check the last kernel takes %a's storage (kept since the first
    matmul, across %t1 and %t2)."""
    monkeypatch.setattr(buffers, "_hold", lambda *a, **k: True)
    m = compile_module(parse(PEAK_BETWEEN))
    assert _reuses(m)["o"] == ["a"]
    _check(m)


def test_a_hold_below_the_peak_is_kept() -> None:
    """A reuse whose hold stays under the peak is made: the profile check is not a ban."""
    prof = [10, 40, 20, 20, 30]
    assert buffers._hold(prof, 2, 4, 8)  # 20 + 8 <= 40
    assert prof == [10, 40, 28, 28, 30]
    assert not buffers._hold(prof, 2, 5, 12)  # 30 + 12 > 40
    assert prof == [10, 40, 28, 28, 30]
