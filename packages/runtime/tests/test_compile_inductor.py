"""compile() with the default backend, "inductor": inference graphs run as compiled C++ kernels
and match eager; training, and graphs the inductor cannot compile, run on the eager backend with
the reason in explain()."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import ember.runtime as er


@pytest.fixture(autouse=True, scope="module")
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("ember-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(d))
        yield d


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.ln(self.fc1(x))))


def softmax_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 2.0, dim=-1) + x.amax(0)


CASES = {
    "mlp_layernorm": (MLP, lambda g: (torch.randn(5, 8, generator=g),)),
    "softmax": (lambda: softmax_fn, lambda g: (torch.randn(3, 7, generator=g),)),
    "conv_relu": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()),
                  lambda g: (torch.randn(2, 3, 6, 5, generator=g),)),
}


def _inductor_notes(c: object) -> list[str]:
    return [n for n in er.explain(c).notes if "the inductor backend compiled it" in n]


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_backend_runs_inductor_and_matches_eager(case: str) -> None:
    make, inputs = CASES[case]
    torch.manual_seed(0)
    model = make()
    args = inputs(torch.Generator().manual_seed(1))
    c = er.compile(model)
    with torch.no_grad():
        got = c(*args)
        want = model(*args)
        again = c(*args)  # a cache hit reuses the compiled kernels
    torch.testing.assert_close(got, want)
    assert torch.equal(got, again)
    notes = _inductor_notes(c)
    assert len(notes) == 1 and "C++ kernel(s)" in notes[0], er.explain(c).notes
    assert "reference interpreter" not in notes[0]
    if case == "conv_relu":
        assert "1 extern call(s)" in notes[0]


def test_training_compiles_forward_and_backward() -> None:
    torch.manual_seed(0)
    m = MLP()
    c = er.compile(m)
    x = torch.randn(5, 8)
    c(x).sum().backward()  # the compiled backward (runtime/training.py) gives the gradients
    assert m.fc1.weight.grad is not None
    rep = er.explain(c)
    assert not rep.fallbacks, str(rep)
    assert any("its backward as" in n and "C++ kernel(s)" in n for n in rep.notes), rep.notes
    with torch.no_grad():  # grad mode is guarded: inference recompiles
        torch.testing.assert_close(c(x), m(x))
    assert len(_inductor_notes(c)) == 1


def test_graph_the_inductor_cannot_compile_falls_back() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.kthvalue(x * 3, 2, dim=1).values + 1  # no decomposition (yet)

    c = er.compile(f)
    x = torch.randn(4, 3)
    with torch.no_grad():
        torch.testing.assert_close(c(x), f(x))
    notes = er.explain(c).notes
    assert any("the inductor backend cannot compile it" in n and "aten.kthvalue" in n
               and "the eager backend ran it" in n for n in notes), notes
    assert not _inductor_notes(c)
