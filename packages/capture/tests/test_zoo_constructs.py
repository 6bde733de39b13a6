"""Constructs seen breaking on a held-out model zoo (torchvision, timm, HF; issue 18): each
captures and matches eager, with no graph break where none is expected."""

from __future__ import annotations

import functools
import importlib
from typing import Any, Optional

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.runtime.testing import check_against_eager


def _no_break(fn: Any, *args: Any, **kw: Any) -> Any:
    h = check_against_eager(fn, *args, calls=2, **kw)
    assert not h.breaks, h.breaks
    assert not h.recompilations, h.recompilations
    return h


# -- yield from (GET_YIELD_FROM_ITER, SEND) -----------------------------------------------------
def _inner(x: torch.Tensor) -> Any:
    yield x + 1
    yield x * 2
    return 3


def _outer(x: torch.Tensor) -> Any:
    k = yield from _inner(x)
    yield from [x - k, x.relu()]
    yield x.sum() * k


def test_yield_from_generator_and_list() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.stack(list(_outer(x))[:4]).sum(0) + list(_outer(x))[4]

    _no_break(f, torch.randn(3, 4))


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def features(self, x: torch.Tensor) -> Any:
        for layer in self.layers:
            x = layer(x)
            yield x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def all_feats() -> Any:
            yield from self.features(x)

        return sum(all_feats())


def test_yield_from_in_a_module_forward() -> None:
    _no_break(_Blocks(), torch.randn(2, 4))


# -- dicts keyed by typing forms -----------------------------------------------------------------
_TABLE = {Optional[int]: 1.5, list[int]: 2.0, int: 3.0, torch.float16: 4.0}  # noqa: UP045


def test_dict_keyed_by_typing_forms() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * _TABLE[Optional[int]] + _TABLE[list[int]] - _TABLE[torch.float16]  # noqa: UP045

    _no_break(f, torch.randn(3))


# -- lru_cache inside try/except -----------------------------------------------------------------
@functools.lru_cache(maxsize=128)
def _cached_scale(n: int) -> float:
    return n * 0.5


@functools.cache
def _cached_pair(a: int, b: int) -> tuple[int, int]:
    return (a + b, a * b)


def test_lru_cache_call_inside_try() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        try:
            k = _cached_scale(3)
            s, p = _cached_pair(2, 3)
        except KeyError:
            k, s, p = 0.0, 0, 0
        return x * k + s - p

    _no_break(f, torch.randn(3))


# -- in-place metadata mutation ----------------------------------------------------------------
def test_metadata_mutation_of_locals() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.t_()
        y.unsqueeze_(0)
        y.squeeze_(0)
        y.transpose_(0, 1)
        y.unsqueeze_(-1)
        y.squeeze_()
        return y * 2

    _no_break(f, torch.randn(3, 4))


def test_write_after_metadata_mutation_reaches_the_input() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        v = x[1:]
        v.t_()
        v[0].mul_(2)  # column 0 of x[1:]
        return v + 1

    _no_break(f, torch.randn(3, 4))


def test_as_strided_in_place() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.as_strided_((2, 2), (1, 2))
        return y + 1

    _no_break(f, torch.randn(3, 4))


def test_metadata_mutation_of_an_input_breaks_with_reason() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.t_()
        return x + 1

    h = check_against_eager(f, torch.randn(3, 4), expect_graphs=None)
    assert any("aten.t_.default on an input" in b.reason for b in h.breaks)


@given(st.lists(st.sampled_from(["t", "u0", "u1", "s", "tr"]), max_size=5))
def test_metadata_mutation_sequences(ops: list[str]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        for op in ops:
            if op == "t" and y.dim() == 2:
                y.t_()
            elif op == "u0":
                y.unsqueeze_(0)
            elif op == "u1":
                y.unsqueeze_(1)
            elif op == "s":
                y.squeeze_()
            elif op == "tr" and y.dim() >= 2:
                y.transpose_(0, -1)
        y.add_(1)
        return y

    check_against_eager(f, torch.randn(2, 3))


# -- an nn.Module made inside forward -------------------------------------------------------------
class _LocalModules(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = nn.ReLU()
        drop = nn.Dropout(0.0)
        return drop(act(x)) + nn.Softmax(dim=-1)(x)


def test_parameterless_module_made_in_forward() -> None:
    _no_break(_LocalModules(), torch.randn(2, 4))


class _LocalLinear(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.Linear(4, 3)(x).relu()


def test_module_with_parameters_made_in_forward_does_not_recompile() -> None:
    m = _LocalLinear()
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 4)
    for seed in range(4):
        torch.manual_seed(seed)
        a = c(x)
        torch.manual_seed(seed)
        torch.testing.assert_close(a, m(x), rtol=0, atol=0)
    r = er.explain(c)
    assert not r.recompilations and not r.fallbacks, (r.recompilations, r.fallbacks)
    assert [b.reason.split(":")[0] for b in r.breaks] == [
        "creating module Linear inside a compiled function"]


# -- torchvision's constructs (zoo run 2026-12-01: vit_b_16, efficientnet_b0, convnext_tiny) ----
def _log_usage(obj: Any) -> None:
    # torchvision.utils._log_api_usage_once: a function's class, read to name the API
    name = obj.__class__.__name__
    if isinstance(obj, type(_log_usage)):
        name = obj.__name__
    torch._C._log_api_usage_once(f"{obj.__module__}.{name}")


def _depth_drop(x: torch.Tensor, p: float) -> torch.Tensor:
    _log_usage(_depth_drop)
    return x * (1 - p)


def test_class_of_a_function_and_api_usage_logging() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        g = _depth_drop
        assert (lambda: 0).__class__ is type(g) and g.__class__.__name__ == "function"
        return _depth_drop(x, 0.25) + len([1].__class__.__name__)

    _no_break(f, torch.randn(3))


def test_multihead_attention_takes_its_decomposable_path() -> None:
    # eval + no_grad would take MHA's fused fast path (torch._native_multi_head_attention);
    # TorchDynamo reports make_fx tracing there, as capture does, so the composite path runs
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()

    def f(x: torch.Tensor) -> torch.Tensor:
        return mha(x, x, x, need_weights=False)[0]

    with torch.no_grad():
        h = _no_break(f, torch.randn(2, 5, 8))
    assert "_native_multi_head_attention" not in str(h.graphs[0])


class _FastPathEncoder(nn.Module):
    """TransformerEncoderLayer behind the dispatch-mode test of torch 2.11's fast path (the
    16-core zoo run: vit_b_16 broke at torch._C._len_torch_dispatch_stack)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        y = self.layer(x)
        return y if _get_current_dispatch_mode() is None else y * 2


def test_dispatch_mode_stack_query_is_a_guarded_constant() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    m = _FastPathEncoder().eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        _no_break(m, x)
        cm = er.compile(m)
        cm(x)
        with Passthrough():  # the guard fails: not the graph captured without a mode
            torch.testing.assert_close(cm(x), m(x))
            torch.testing.assert_close(cm(x), m.layer(x) * 2)
        torch.testing.assert_close(cm(x), m(x))


def test_transformer_encoder_inference_takes_the_composite_path() -> None:
    # eval + no_grad would run torch._transformer_encoder_layer_fwd (and nested tensors in
    # TransformerEncoder), opaque kernels the compiler has no decomposition for
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2).eval()
    with torch.no_grad():
        h = _no_break(enc, torch.randn(2, 5, 8))
    graph = str(h.graphs[0])
    assert "_transformer_encoder_layer_fwd" not in graph and "native_multi_head" not in graph


# -- torch.autograd.Function.apply (transformers' Bloom GELU; zoo run 2026-12-01) --------------
class _TanhGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.scale = 0.5
        return x * ctx.scale * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(1.702 * x)  # a custom backward: not forward's derivative


class _Scale(torch.autograd.Function):  # the new style: forward without ctx, setup_context
    @staticmethod
    def forward(x: torch.Tensor, k: float) -> torch.Tensor:
        return x * k

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return g * ctx.k, None


def test_autograd_function_apply_without_gradients_is_inlined() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return _Scale.apply(_TanhGelu.apply(x), 3.0) + 1

    with torch.no_grad():
        _no_break(f, torch.randn(4, 3))
    _no_break(f, torch.randn(4, 3))  # grad mode on, no input requiring grad: nothing to record


def test_autograd_function_apply_with_gradients_breaks_and_keeps_its_backward() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return _TanhGelu.apply(x * 2).sum()

    x = torch.randn(5, requires_grad=True)
    c = er.compile(f, backend="eager")
    c(x).backward()
    want = torch.autograd.grad(f(x), x)[0]
    torch.testing.assert_close(x.grad, want)
    assert any("custom backward" in b.reason for b in er.explain(c).breaks)


# -- a function its library marks constant (transformers' install probes; zoo: hf/wav2vec2) -----
def _installed(name: str) -> bool:
    try:  # vars() on a module inside try/except: capture can neither trace it nor break here
        return vars(importlib.import_module(name))["__name__"] == name
    except ImportError:
        return False


_installed._dynamo_marked_constant = True  # type: ignore[attr-defined]
_probe = functools.lru_cache(_installed)  # marked under the cache, as transformers does


def test_function_marked_constant_is_called_at_capture() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if _probe("math") and not _probe("no_such_module_zz") else x

    _no_break(f, torch.randn(3))
