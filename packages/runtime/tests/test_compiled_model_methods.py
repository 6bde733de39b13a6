"""The article's example as written (issue 17 #5): `model = compile(model)`, then
`model.generate(ids, max_length=50)` and `pipeline("text-generation", model=model, tokenizer=tok)`
run the compiled forward. The compiled module is an instance of the model's own class (and of
CompiledModule), so the model's methods run with it as `self` and `self(...)` is compiled."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.testing import tiny_hf_model


class Scaled(torch.nn.Module):
    scale = 1.0  # a class default the instance overrides

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale

    def twice(self, x: torch.Tensor) -> torch.Tensor:
        return self(self(x))


def test_methods_of_a_compiled_module_reach_the_compiled_forward() -> None:
    m = Scaled()
    cm = er.compile(m, backend="eager")
    assert isinstance(cm, Scaled) and isinstance(cm, er.CompiledModule)
    assert type(cm).__name__ == "Scaled"
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(cm.twice(x), m.twice(x))
    rep = er.explain(cm)
    assert rep.calls == 2 and rep.graph_count == 1, str(rep)
    assert cm.scale == 2.0  # the instance's value, not the class default
    cm.scale = 3.0  # writes go to the original: the two never disagree
    assert m.scale == 3.0 and cm.scale == 3.0
    cm.eval()
    assert not cm.training and not m.training
    assert set(dict(cm.named_parameters())) == {"_orig_mod.lin.weight", "_orig_mod.lin.bias"}


def _tokenizer() -> Any:
    """A word-level tokenizer built here (nothing downloads): w0 .. w99 are the ids 0 .. 99."""
    import transformers as T
    from tokenizers import Tokenizer, models, pre_tokenizers
    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(100)}, unk_token="w2"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return T.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w2", pad_token="w0")


@pytest.mark.parametrize("name", ["gpt2"])
def test_compiled_model_generate_and_pipeline(name: str) -> None:
    pytest.importorskip("transformers")
    import transformers as T
    model, _ = tiny_hf_model(name)
    model.generation_config.eos_token_id = None  # (random weights: run all 50 tokens)
    ids = torch.randint(2, 100, (1, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model.generate(ids, max_length=50, do_sample=False, pad_token_id=0)
    model = er.compile(model)  # the article's example, as written
    assert type(model).__name__ == type(model._orig_mod).__name__
    with torch.no_grad():
        got = model.generate(ids, max_length=50, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    rep = er.explain(model)
    assert rep.calls == 45 and rep.graph_count <= 3, str(rep)
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)

    errors: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: errors.append(r.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("transformers.pipelines.base")
    log.addHandler(handler)
    try:
        tok = _tokenizer()
        pipe = T.pipeline("text-generation", model=model, tokenizer=tok)
        out = pipe("w5 w7 w9 w11", max_new_tokens=8, do_sample=False, return_tensors=True)
        eager = T.pipeline("text-generation", model=model._orig_mod, tokenizer=tok)
        ref = eager("w5 w7 w9 w11", max_new_tokens=8, do_sample=False, return_tensors=True)
    finally:
        log.removeHandler(handler)
    assert not [e for e in errors if "is not supported" in e], errors
    assert out[0]["generated_token_ids"] == ref[0]["generated_token_ids"]
    assert len(out[0]["generated_token_ids"]) == 4 + 8
    after = er.explain(model)
    assert after.calls == 45 + 8 and after.fallbacks == [], str(after)


def test_compiled_model_generate_static_cache_at_most_3_graphs() -> None:
    """Issue 17 #4 through the compiled whole model with a static cache: 45 new tokens,
    eager's tokens, <= 3 captures (the DynamicCache case is the test above)."""
    pytest.importorskip("transformers")
    model, _ = tiny_hf_model("gpt2")
    model.generation_config.eos_token_id = None
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(4))
    kw: dict[str, Any] = dict(max_length=50, do_sample=False, pad_token_id=0,
                              cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
        cm = er.compile(model, backend="eager")
        got = cm.generate(ids, **kw)
    assert torch.equal(got, want) and got.shape == (2, 50)
    rep = er.explain(cm)
    assert rep.calls == 45 and rep.graph_count <= 3, str(rep)
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)
