"""Issue 17's generate() bullet at its stated length: greedy generate() of 40 new tokens through a
compiled forward with a DynamicCache (the cache grows every step) captures at most 3 graphs (no
fallback, no break) and returns eager's tokens. The eager backend keeps it fast: the captures are
the same for every backend, and test_generate.py runs the inductor's C++ on the three model
families (16 tokens, DynamicCache and static cache), test_compiled_model_methods.py the compiled
whole model (45 tokens, both caches). A static cache has one decode shape whatever the length."""

from __future__ import annotations

import pytest
import torch

import ember.runtime as er
from ember.runtime.testing import generate_with, tiny_hf_model

pytest.importorskip("transformers")


def test_generate_40_tokens_through_a_compiled_forward() -> None:
    model, _ = tiny_hf_model("gpt2")
    model.generation_config.eos_token_id = None  # (random weights: run all 40 tokens)
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(5))
    cf = er.compile(model.forward, backend="eager")
    want, got = generate_with(model, cf, ids, max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert got.shape == (2, 45) and torch.equal(got, want)
    rep = er.explain(cf)
    assert rep.calls == 40 and rep.graph_count <= 3, rep.recompilations
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)
