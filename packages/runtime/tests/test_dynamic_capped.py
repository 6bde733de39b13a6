"""dynamic=True where a dim's range is capped by a static size (a sequence no longer than a
static KV cache: its symbol takes small probe values, s1 in [2, 15]). A product of it with a
large-probe symbol (a linear's `view(b * s, k)`) is read back as `s0*s1`, and a dense result
`[b, s, 100]` needs no recorded strides (`s1 * 100` is no expression at a small probe); before,
both stayed static ints, the two probe recordings differed and the capture was specialized
(tiny Llama with a fresh StaticCache per call: input_ids [2, 5], then recompiled for [3, 7])."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ember.runtime as er
from ember.runtime.testing import tiny_hf_model


class Capped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 16:  # at most the cache's length
            raise ValueError("longer than the cache")
        return self.proj(x).relu()


def test_a_capped_dim_stays_symbolic_through_a_linear() -> None:
    m = Capped()
    cf = er.compile(m, dynamic=True, backend="eager")
    with torch.no_grad():
        for b, s in [(2, 5), (3, 7), (4, 16)]:
            x = torch.randn(b, s, 32)
            torch.testing.assert_close(cf(x), m(x))
    rep = er.explain(cf)
    assert len(rep.graphs) == 1 and not rep.recompilations, rep.recompilations
    text = rep.graphs[0].ir
    assert "%l_x: f32[s0, s1, 32]" in text and "max=16" in text, text.splitlines()[:4]
    assert "s0*s1" in text.replace(" ", "")  # the linear's flattened view


def test_hf_static_cache_per_call_is_one_symbolic_graph() -> None:
    T = pytest.importorskip("transformers")
    m, _ = tiny_hf_model("llama")
    cf = er.compile(m.forward, dynamic=True, backend="eager")
    for b, s in [(2, 5), (3, 7)]:
        ids = torch.randint(2, 100, (b, s))
        eager_cache = T.StaticCache(config=m.config, max_cache_len=16)
        cache = T.StaticCache(config=m.config, max_cache_len=16)
        with torch.no_grad():
            want = m(input_ids=ids, past_key_values=eager_cache, use_cache=True).logits
            got = cf(input_ids=ids, past_key_values=cache, use_cache=True).logits
        torch.testing.assert_close(got, want)
        for le, lc in zip(eager_cache.layers, cache.layers, strict=True):
            torch.testing.assert_close(lc.keys, le.keys)
            torch.testing.assert_close(lc.values, le.values)
    rep = er.explain(cf)
    assert len(rep.graphs) == 1 and not rep.recompilations, rep.recompilations
    assert "%l_input_ids: i64[s0, s1]" in rep.graphs[0].ir
