"""The default backend ("inductor": decompose, loop IR, fusion, C++) end to end on what capture
covers: programs with graph breaks and Python side effects, mutating programs, and the small
Hugging Face models. Each must match eager AND have really run as compiled C++ (no graph left to
the eager backend with a note), so a lowering gap cannot hide behind the fallback."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.testing import tiny_hf_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _all_compiled(fn: Any, graphs: int | None = None) -> None:
    rep = er.explain(fn)
    assert rep.fallbacks == [], str(rep)
    assert not any("eager backend ran it" in n for n in rep.notes), rep.notes
    compiled = [n for n in rep.notes if "the inductor backend compiled it" in n]
    assert compiled, rep.notes
    if graphs is not None:
        assert rep.graph_count == graphs, str(rep)


def test_graph_breaks_and_side_effects_on_inductor(capsys: pytest.CaptureFixture[str]) -> None:
    log: list[float] = []

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x @ w, dim=-1)
        s = y.sum().item()  # a number Python uses: a break
        log.append(s)
        print("sum", round(s, 3))
        if y.mean() > 0.1:  # data-dependent branch: a break with two resume paths
            z = torch.nn.functional.layer_norm(y * 2, (y.shape[-1],))
        else:
            z = y - 1
        return torch.relu(z) + s

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    want = f(x, w)
    want_out = capsys.readouterr().out
    log.clear()
    c = er.compile(f)
    got = c(x, w)
    assert capsys.readouterr().out == want_out
    torch.testing.assert_close(got, want)
    assert len(log) == 1
    rep = er.explain(c)
    assert rep.break_count >= 2, str(rep)
    _all_compiled(c)


def test_mutating_module_on_inductor() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("ema", torch.zeros(8))
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.steps += 1
            self.ema.mul_(0.9).add_(x.mean(0) * 0.1)
            x[:, 0] = 0.0  # a write through a view of the caller's tensor
            return self.lin(x) + self.ema

    torch.manual_seed(0)
    m_eager, m = M(), M()
    m.load_state_dict(m_eager.state_dict())
    c = er.compile(m)
    x = torch.randn(4, 8)
    x_eager, x_ember = x.clone(), x.clone()
    with torch.no_grad():
        for _ in range(2):
            want = m_eager(x_eager)
            got = c(x_ember)
            torch.testing.assert_close(got, want)
    torch.testing.assert_close(x_ember, x_eager)
    for k, v in m_eager.state_dict().items():
        torch.testing.assert_close(m.state_dict()[k], v, msg=k)
    _all_compiled(c, graphs=1)


def _hf(name: str) -> tuple[Any, dict[str, Any]]:
    pytest.importorskip("transformers")
    return tiny_hf_model(name)


@pytest.mark.parametrize("name", ["gpt2", "bert", "t5", "neox"])
def test_hf_forward_on_inductor(name: str) -> None:
    """(Llama is in test_hf_models.py.) Sequence 8 is shorter than the position tables, so
    slices of buffers feed gathers (BERT's token types), as in real use."""
    model, kw = _hf(name)
    ids = torch.randint(2, 100, (2, 8))
    with torch.no_grad():
        want = model(ids, use_cache=False, **kw) if name != "bert" else model(ids)
        c = er.compile(model)
        got = c(ids, use_cache=False, **kw) if name != "bert" else c(ids)
    key = "last_hidden_state" if name == "bert" else "logits"
    torch.testing.assert_close(got[key], want[key])
    _all_compiled(c, graphs=1)
