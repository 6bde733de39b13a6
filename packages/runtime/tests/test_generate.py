"""Hugging Face generate() with the forward compiled: a bounded number of compiles (issue 17 #4).

A greedy decode calls forward once for the prompt (the prefill) and once per new token, with a
KV cache one token longer each step. Automatic dynamic shapes (`dynamic=None`, the default)
keep that at three captures whatever the number of new tokens: the prefill (static), the first
decode step (static: its new-token dim is 1, and the cache length has not changed yet), and one
decode graph whose cache length is a size symbol, compiled once into size-generic C++. A static
cache (`cache_implementation="static"`) has the same shapes every step: two captures. Before
dynamic shapes every decode step was a recompilation until the cache limit, then eager.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.testing import generate_with, tiny_hf_model

pytest.importorskip("transformers")

MODELS = ("neox", "llama", "gpt2")
NEW_TOKENS = 16
_CACHE = ("cache.layers[", "past_key_values.layers[")  # the argument's name by version


def _generate(name: str, backend: str = "inductor", dynamic: bool | None = None,
              new: int = NEW_TOKENS, **opts: Any) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """(the compiled forward, eager's tokens, the tokens with the forward compiled)."""
    model, _ = tiny_hf_model(name)
    torch.manual_seed(1)
    ids = torch.randint(2, 100, (2, 5))
    cf = er.compile(model.forward, backend=backend, dynamic=dynamic)
    want, got = generate_with(model, cf, ids, max_new_tokens=new, do_sample=False,
                              pad_token_id=0, **opts)
    return cf, want, got


@pytest.mark.parametrize("name", MODELS)
def test_generate_dynamic_cache_three_compiles(name: str) -> None:
    cf, want, got = _generate(name)
    assert got.shape == (2, 5 + NEW_TOKENS)
    assert torch.equal(got, want)
    rep = er.explain(cf)
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)
    assert rep.calls == NEW_TOKENS
    assert rep.graph_count == 3, rep.recompilations
    # why each recompilation happened: the new-token dim (5 -> 1), then the cache length
    assert "input_ids: shape [2, 1], expected [2, 5]" in rep.recompilations[0]
    # (transformers 5.17 calls the cache `past_key_values` and guards the mask first)
    assert any(k in rep.recompilations[1] for k in ("cache.layers[0].keys", "attention_mask",
                                                     "past_key_values.layers[0].keys"))
    # the last graph's cache length is one symbol, shared by every layer's keys and values
    decode = rep.graphs[2]
    cache_inputs = [g for g in decode.guards if g.startswith(_CACHE)
                    and ": tensor" in g]
    assert len(cache_inputs) == 4, cache_inputs  # 2 layers x (keys, values)
    assert all("s0" in g for g in cache_inputs), cache_inputs
    assert not any("s1" in g for g in cache_inputs), cache_inputs


def test_generate_more_tokens_same_three_graphs() -> None:
    """The symbolic decode graph serves every later step: 3 graphs for 8 or 30 tokens."""
    for n in (8, 30):
        cf, want, got = _generate("gpt2", backend="eager", new=n)
        assert torch.equal(got, want)
        rep = er.explain(cf)
        assert rep.calls == n and rep.graph_count == 3 and rep.fallbacks == [], str(rep)


def test_generate_without_dynamic_shapes_recompiles_each_step() -> None:
    """dynamic=False is the old behaviour: a capture per step up to the cache limit (8), then
    eager (a `cache limit` fallback); the tokens are still eager's."""
    cf, want, got = _generate("gpt2", backend="eager", dynamic=False)
    assert torch.equal(got, want)
    rep = er.explain(cf)
    assert rep.graph_count == 8
    assert [f.kind for f in rep.fallbacks] == ["cache limit"], str(rep)


@pytest.mark.parametrize("name", MODELS)
def test_generate_static_cache_two_compiles(name: str) -> None:
    """A static cache has one shape for every decode step: prefill + one decode graph (the
    second capture is for the attention mask generate() passes from the first decode on)."""
    cf, want, got = _generate(name, cache_implementation="static")
    assert torch.equal(got, want)
    rep = er.explain(cf)
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)
    assert rep.calls == NEW_TOKENS
    assert rep.graph_count == 2, rep.recompilations


@pytest.mark.parametrize("name", MODELS)
def test_generate_dynamic_true_two_compiles(name: str) -> None:
    """dynamic=True: a symbolic prefill and one symbolic decode graph. The rotary table (a
    buffer) stays static, and each cache tensor's static head dims are learnt in one restart."""
    cf, want, got = _generate(name, backend="eager", dynamic=True)
    assert torch.equal(got, want)
    rep = er.explain(cf)
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)
    assert rep.graph_count == 2, rep.recompilations
    decode = rep.graphs[1]
    keys = next(g for g in decode.guards if g.startswith(tuple(f"{c}1].values: tensor"
                                                               for c in _CACHE)))
    # the head dim is static; the length a symbol (`s1 - 1` where the mask's length, lifted
    # first on transformers 5.17, is tied to it: docs/capture.md, "Tied sizes")
    assert re.search(r", s[01]( - 1)?, 8\] ", keys), keys
    assert "s2" not in keys, keys


def test_module_buffers_stay_static_under_dynamic_true() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.arange(6.0), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.table[:3].sum() + self.table.shape[0]

    m = M()
    cm = er.compile(m, backend="eager", dynamic=True)
    for n in (4, 7):
        x = torch.randn(n)
        torch.testing.assert_close(cm(x), m(x))
    rep = er.explain(cm)
    assert rep.graph_count == 1, rep.recompilations
    guards = rep.graphs[0].guards
    assert any(g.startswith("x: tensor float32[s0]") for g in guards), guards
    table = [g for g in guards if "table" in g and "tensor" in g]
    assert table and all("float32[6]" in g for g in table), table

