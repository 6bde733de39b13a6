"""Helpers for testing compiled code against eager PyTorch (used by ember's own tests).

`check_against_eager(fn, *args)` runs `fn` eagerly and through `ember.runtime.compile` on
separate copies of the arguments (and of the module, for nn.Modules), then compares outputs,
module state, the arguments afterwards and, with `grad=True`, gradients. It returns the compiled
function's history so a test can also assert that a graph was captured (without that, a silent
fallback to eager would pass any comparison).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ember.ir import check, parse
from ember.runtime.compile import compile, compiled_function_of
from ember.runtime.history import History

# Ops whose meta kernel (the verifier's type rule) disagrees with what the real kernel returns,
# which fake tensors (and so capture) report faithfully: native_batch_norm in eval mode returns
# empty save_mean/save_invstd on CPU, its meta kernel says [C].
META_DISAGREES = ("aten.native_batch_norm.default",)


def clone_tree(x: Any) -> Any:
    """A deep copy in which tensors are cloned (leaves stay leaves with the same requires_grad)."""
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        if isinstance(x, nn.Parameter):
            return nn.Parameter(c, requires_grad=x.requires_grad)
        return c.requires_grad_(x.requires_grad)
    if isinstance(x, nn.Module):
        return copy.deepcopy(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[clone_tree(i) for i in x])
    if isinstance(x, tuple | list):
        return type(x)(clone_tree(i) for i in x)
    if isinstance(x, dict):
        return type(x)((k, clone_tree(v)) for k, v in x.items())
    return x


def assert_same(expected: Any, actual: Any, where: str = "result") -> None:
    """Equal structure and values; tensors with torch.testing.assert_close (dtype included)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: expected a tensor, got {actual!r}"
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype} vs {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape} vs {expected.shape}"
        assert actual.device == expected.device, f"{where}: device"
        assert actual.requires_grad == expected.requires_grad, f"{where}: requires_grad"
        torch.testing.assert_close(actual.detach(), expected.detach(), equal_nan=True,
                                   msg=lambda m: f"{where}: {m}")
        return
    assert type(actual) is type(expected), \
        f"{where}: type {type(actual).__name__} vs {type(expected).__name__}"
    if isinstance(expected, nn.Module):
        assert_same(dict(expected.state_dict()), dict(actual.state_dict()), f"{where} state")
    elif isinstance(expected, tuple | list):
        assert len(actual) == len(expected), f"{where}: length {len(actual)} vs {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)} vs {list(expected)}"
        for k in expected:
            assert_same(expected[k], actual[k], f"{where}[{k!r}]")
    elif dataclasses.is_dataclass(expected) or hasattr(expected, "__dict__") and not callable(
            expected) and not isinstance(expected, nn.Module | type):
        assert_same(vars(expected), vars(actual), f"{where}.__dict__")
    elif isinstance(expected, float) and expected != expected:
        assert actual != actual, f"{where}: expected nan"
    else:
        assert actual == expected, f"{where}: {actual!r} vs {expected!r}"


def _tensor_leaves(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, tuple | list):
        return [t for i in x for t in _tensor_leaves(i)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensor_leaves(v)]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [t for v in vars(x).values() for t in _tensor_leaves(v)]
    return []


def _grads(x: Any) -> list[torch.Tensor | None]:
    return [t.grad for t in _tensor_leaves(x) if t.requires_grad and t.is_leaf]


def _backward(out: Any) -> None:
    ts = [t for t in _tensor_leaves(out) if t.requires_grad and t.dtype.is_floating_point]
    if ts:
        sum(t.float().sum() for t in ts).backward()  # type: ignore[union-attr]


def check_against_eager(fn: Callable[..., Any], *args: Any, grad: bool = False,
                        expect_graphs: int | None = 1, expect_fallback: str | None = None,
                        backend: str = "eager", calls: int = 1, **kwargs: Any) -> History:
    """Compare `fn(*args, **kwargs)` eager vs compiled; return the compiled history.

    By default exactly one graph must be captured and no fallback recorded; with
    `expect_fallback`, a fallback whose reason contains that text must be recorded.
    `calls` repeats the call (later calls must hit the cache).
    """
    eager_fn = fn
    comp_target = clone_tree(fn) if isinstance(fn, nn.Module) else fn
    compiled = compile(comp_target, backend=backend)
    for _ in range(calls):
        e_args, e_kwargs = clone_tree(args), clone_tree(kwargs)
        c_args, c_kwargs = clone_tree(args), clone_tree(kwargs)
        expected = eager_fn(*e_args, **e_kwargs)
        actual = compiled(*c_args, **c_kwargs)
        assert_same(expected, actual)
        assert_same(e_args, c_args, "arguments after the call")
        if isinstance(fn, nn.Module):
            assert isinstance(comp_target, nn.Module)
            assert_same(dict(fn.state_dict()), dict(comp_target.state_dict()), "module state")
        if grad:
            _backward(expected)
            _backward(actual)
            assert_same(_grads(e_args), _grads(c_args), "argument gradients")
            if isinstance(fn, nn.Module):
                assert isinstance(comp_target, nn.Module)
                eg = [p.grad for p in fn.parameters()]
                cg = [p.grad for p in comp_target.parameters()]
                assert_same(eg, cg, "parameter gradients")
                fn.zero_grad()
                comp_target.zero_grad()
    cf = compiled_function_of(compiled)
    assert cf is not None
    h = cf.history
    for g in h.graphs:  # every captured graph is valid ir-v1 that reads back as printed
        m = parse(g.ir)
        errors = [e for e in check(m) if not any(op in e.message for op in META_DISAGREES)]
        assert not errors, f"the captured graph does not verify: {errors[0]}"
        assert str(m) == g.ir, "the captured graph does not print back identically"
    if expect_fallback is None:
        assert not h.fallbacks, f"unexpected fallback: {h.fallbacks[0]}"
        if expect_graphs is not None:
            assert len(h.graphs) == expect_graphs, f"{len(h.graphs)} graphs captured"
    else:
        assert any(expect_fallback in f.reason for f in h.fallbacks), \
            f"no fallback mentioning {expect_fallback!r}: {h.fallbacks}"
    return h


TINY_HF_MODELS = ("gpt2", "llama", "bert", "t5", "neox")


def tiny_hf_model(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """A Hugging Face model of `name` (TINY_HF_MODELS) from a tiny config, random weights (seed
    0), in eval mode, with the extra forward keyword arguments it needs (T5: decoder_input_ids).
    Vocabulary 100, 2 layers, hidden 32, 4 heads; Llama with 2 key/value heads (GQA). Needs
    transformers; nothing downloads."""
    import transformers as T

    torch.manual_seed(0)
    small: dict[str, Any] = dict(num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, vocab_size=100, max_position_embeddings=64)
    kw: dict[str, Any] = {}
    m: nn.Module
    if name == "gpt2":
        m = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100,
                                           n_positions=64, bos_token_id=0, eos_token_id=1))
    elif name == "llama":
        m = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=32, num_key_value_heads=2, **small))
    elif name == "bert":
        m = T.BertModel(T.BertConfig(hidden_size=32, **small))
    elif name == "t5":
        t5: dict[str, Any] = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                  vocab_size=100, decoder_start_token_id=0)
        m = T.T5ForConditionalGeneration(T.T5Config(**t5))
        kw["decoder_input_ids"] = torch.randint(2, 100, (2, 5))
    elif name == "neox":
        m = T.GPTNeoXForCausalLM(T.GPTNeoXConfig(hidden_size=32, **small))
    else:
        raise ValueError(f"no tiny config for {name!r}; known: {', '.join(TINY_HF_MODELS)}")
    return m.eval(), kw


def generate_with(model: Any, forward: Callable[..., Any], ids: torch.Tensor,
                  **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(eager's tokens, the tokens with `forward` in model.forward's place) of `model.generate(
    ids, **kwargs)` under no_grad; model.forward is its own again after, whatever happens."""
    with torch.no_grad():
        want = model.generate(ids, **kwargs)
        model.forward = forward
        try:
            got = model.generate(ids, **kwargs)
        finally:
            del model.forward
    return want, got
