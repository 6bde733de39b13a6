"""Hugging Face modeling code through ember.runtime.compile: GPT-2, Llama (GQA), BERT, T5
(encoder-decoder) and GPT-NeoX from tiny configs, random weights, nothing downloaded.

Each forward must capture as one graph with no fallback or graph break and match eager, output
object included (ModelOutput dataclasses, the DynamicCache / EncoderDecoderCache objects made
during the call and their tensors); greedy generate() must give eager's tokens. The first tests
cover the Python constructs that HF code needs, on small stand-ins, so they fail on their own when
one of them stops working."""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import inspect
import os
from collections import OrderedDict
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.testing import generate_with, tiny_hf_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _single_graph(fn: Any) -> None:
    rep = er.explain(fn)
    assert rep.fallbacks == [], str(rep)
    assert rep.breaks == [], str(rep)
    assert rep.graph_count == 1, str(rep)


def _same(want: Any, got: Any, path: str = "out") -> int:
    """Deep comparison of eager's result with the compiled one; the number of tensors seen."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        torch.testing.assert_close(got, want, msg=path)
        return 1
    assert type(want) is type(got), (path, type(want), type(got))
    n = 0
    if isinstance(want, list | tuple):
        assert len(want) == len(got), path
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            n += _same(a, b, f"{path}[{i}]")
        return n
    if isinstance(want, dict):
        assert list(want) == list(got), (path, list(want), list(got))
        for k in want:
            n += _same(want[k], got[k], f"{path}[{k!r}]")
    if hasattr(want, "__dict__") and type(want).__module__.startswith(("transformers",
                                                                         __name__)):
        n += _same(vars(want), vars(got), f"{path}.__dict__")
    elif not isinstance(want, dict | type):
        assert want == got or want is got, (path, want, got)
    return n


# -- the constructs, on stand-ins --------------------------------------------------------------
@dataclasses.dataclass
class Output(OrderedDict[str, Any]):
    """Like transformers' ModelOutput: a dict subclass and a dataclass whose set fields are also
    its dict entries, written through dict's own __setitem__ via super()."""

    logits: torch.Tensor | None = None
    extra: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = self.__dict__.get(f.name)
            if v is not None:
                self[f.name] = v

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self[k] for k in self.keys())


def test_dict_subclass_dataclass_built_and_returned() -> None:
    def f(x: torch.Tensor) -> Output:
        out = Output(logits=x * 2)
        assert "extra" not in out and len(out) == 1
        return out

    cf = er.compile(f, backend="eager")
    x = torch.randn(3)
    got = cf(x)
    assert isinstance(got, Output) and list(got) == ["logits"] and got.extra is None
    torch.testing.assert_close(got.logits, x * 2)
    torch.testing.assert_close(got["logits"], x * 2)
    _single_graph(cf)


def test_model_output_passed_in_is_read() -> None:
    def f(o: Output) -> torch.Tensor:
        return o.to_tuple()[0] + len(o)

    cf = er.compile(f, backend="eager")
    o = Output(logits=torch.randn(3))
    torch.testing.assert_close(cf(o), o.logits + 1)
    _single_graph(cf)


_CV: contextvars.ContextVar[Any] = contextvars.ContextVar("ember_test_cv", default=None)


def test_contextvar_set_get_reset() -> None:
    def inner(x: torch.Tensor) -> torch.Tensor:
        scale = _CV.get()
        return x * scale["k"]

    def f(x: torch.Tensor) -> torch.Tensor:
        token = _CV.set({"k": 3})
        try:
            return inner(x)
        finally:
            _CV.reset(token)

    cf = er.compile(f, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(cf(x), x * 3)
    assert _CV.get() is None
    _single_graph(cf)


class Config:
    """Like transformers' configs: aliases mapped in __getattribute__/__setattr__."""

    attribute_map = {"n_layer": "num_layers"}

    def __init__(self) -> None:
        self.num_layers = 2
        self.scale = 0.5

    def __getattribute__(self, key: str) -> Any:
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key: str, value: Any) -> None:
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)


def test_getattribute_alias_and_deepcopy_of_outside_object() -> None:
    cfg = Config()

    def f(x: torch.Tensor) -> torch.Tensor:
        c = copy.deepcopy(cfg)
        c.n_layer = 5  # changes the copy only
        delattr(c, "scale")
        return x * cfg.n_layer + c.num_layers + (1 if hasattr(c, "scale") else 0)

    cf = er.compile(f, backend="eager")
    x = torch.randn(2)
    torch.testing.assert_close(cf(x), x * 2 + 5)
    assert cfg.num_layers == 2 and cfg.scale == 0.5
    _single_graph(cf)
    cfg.num_layers = 3  # the copy's source is guarded: a recompilation, not a stale graph
    torch.testing.assert_close(cf(x), x * 3 + 5)


class Registry(dict[str, Any]):
    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower()) or default


_REGISTRY = Registry(a=2, b=3)


def test_is_autocast_enabled_reads_the_symbolic_state() -> None:
    # transformers (>= 5.1x) decides `maybe_autocast` for RoPE by torch.is_autocast_enabled(dev)
    def f(x: torch.Tensor) -> torch.Tensor:
        a = torch.is_autocast_enabled("cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")
            y = x @ x
        return y.float() + (1.0 if a else 0.0) + (2.0 if b else 0.0)

    c = er.compile(f, backend="eager")
    x = torch.randn(4, 4)
    torch.testing.assert_close(c(x), f(x))
    _single_graph(c)


def test_dict_subclass_registry_read_by_key() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * _REGISTRY.get("A") + len(inspect.signature(f).parameters)

    cf = er.compile(f, backend="eager")
    x = torch.randn(2)
    torch.testing.assert_close(cf(x), x * 2 + 1)
    _single_graph(cf)
    _REGISTRY["c"] = 4  # another key: the graph still holds
    torch.testing.assert_close(cf(x), x * 2 + 1)
    assert er.explain(cf).recompilations == []
    _REGISTRY["a"] = 5
    torch.testing.assert_close(cf(x), x * 5 + 1)


# -- the models ----------------------------------------------------------------------------------
def _model(name: str) -> tuple[Any, dict[str, Any]]:
    return tiny_hf_model(name)


MODELS = ["gpt2", "llama", "bert", "t5", "neox"]


@pytest.mark.parametrize("use_cache", [False, None], ids=["no_cache", "default_cache"])
@pytest.mark.parametrize("name", MODELS)
def test_forward_one_graph(name: str, use_cache: bool | None) -> None:
    model, kw = _model(name)
    if use_cache is not None:
        if name == "bert":
            pytest.skip("BertModel (an encoder) has no cache")
        kw["use_cache"] = use_cache
    ids = torch.randint(2, 100, (2, 8))
    with torch.no_grad():
        want = model(ids, **kw)
        cm = er.compile(model, backend="eager")
        got = cm(ids, **kw)
        again = cm(ids, **kw)
    n = _same(want, got)
    assert n >= (1 if use_cache is False or name == "bert" else 5)  # logits, cache tensors
    if use_cache is None and name != "bert":
        assert type(got.past_key_values).__name__ in ("DynamicCache", "EncoderDecoderCache")
    _same(want, again)
    _single_graph(cm)


def test_llama_gqa_inductor() -> None:
    """The default backend (decompose, loop IR, C++) on GQA attention."""
    model, _ = _model("llama")
    ids = torch.randint(2, 100, (2, 8))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        cm = er.compile(model)
        got = cm(ids, use_cache=False).logits
    torch.testing.assert_close(got, want)
    rep = er.explain(cm)
    assert rep.fallbacks == [] and rep.graph_count == 1
    assert not any("cannot compile" in n for n in rep.notes), rep.notes


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "neox"])
def test_greedy_generate(name: str) -> None:
    """forward compiled, generate() eager around it: eager's tokens. Every decode step has new
    shapes (the cache grows), so each step is one graph (static shapes: a recompilation)."""
    model, _ = _model(name)
    ids = torch.randint(2, 100, (2, 5))
    cf = er.compile(model.forward, backend="eager")
    want, got = generate_with(model, cf, ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    rep = er.explain(cf)
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)
    assert rep.calls == 3 and rep.graph_count == 3
