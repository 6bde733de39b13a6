"""Whole small models through the CUDA target (issue 16), tested without a GPU.

`ember.runtime.compile` with the Triton target in place of the CPU's (the kernels run in
Triton's interpreter, TRITON_INTERPRET=1): an MLP, a small conv net (convolution as an extern,
BatchNorm and ReLU as Triton kernels) and a one-layer Hugging Face decoder built from a config.
Each must compile whole: no graph break, no fallback to eager, every loop kernel rendered as
Triton (none left to the reference interpreter), and match eager. The same models run on the
H200 with real launches in benchmarks/gpu_cuda_suite.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor
import ember.inductor.targets.cuda  # noqa: F401  (the inductor-cuda pipeline)
from ember.capture import capture
from ember.inductor.targets import Target
from ember.ir import Graph, Module, parse, verify
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY


def compiled_whole(model: Callable[..., Any], *args: torch.Tensor, tol: float = 1e-4
                   ) -> Module:
    """model compiled by ember.runtime.compile: one graph, no eager fallback, every loop
    kernel a Triton kernel; outputs equal eager's. Returns the compiled module."""
    from ember.runtime import compile as ember_compile

    cf = ember_compile(model, dynamic=False)
    cf = getattr(cf, "compiled", cf)  # a module's compiled forward
    with torch.no_grad():
        got, want = cf(*args), model(*args)
    assert not cf.history.fallbacks, [f"{f.kind}: {f.reason}" for f in cf.history.fallbacks]
    m = cf._last_compiled
    assert m is not None
    left = {name: g.attrs["triton_fallback"] for name, g in m.items.items()
            if isinstance(g, Graph) and "triton_fallback" in g.attrs}
    assert not left, left
    loops = [n.op for g in m.graphs.values() for n in g.nodes if n.op.startswith("loop.")]
    assert not loops, loops
    assert m.kernels and {k.lang for k in m.kernels.values()} == {"triton"}
    flat_got = got if isinstance(got, (tuple, list)) else [got]
    flat_want = want if isinstance(want, (tuple, list)) else [want]
    for a, b in zip(flat_got, flat_want, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    return m


def test_mlp(triton_on_cpu: Target) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16),
                          nn.Linear(16, 4), nn.Softmax(-1)).eval()
    compiled_whole(model, torch.randn(3, 16))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_conv_net(triton_on_cpu: Target) -> None:
    torch.manual_seed(0)
    model = ConvNet().eval()
    m = compiled_whole(model, torch.randn(2, 3, 8, 8))
    externs = [str(n.kwargs.get("op")) for g in m.graphs.values() for n in g.nodes
               if n.op == "kernels.extern"]
    assert any("convolution" in op for op in externs), externs


def test_hf_decoder_from_a_config(triton_on_cpu: Target) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                                   max_position_embeddings=32, use_cache=False)
    model = transformers.LlamaForCausalLM(cfg).eval()

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids).logits  # type: ignore[no-any-return]
    compiled_whole(logits, torch.randint(0, 64, (1, 6)))


# ---- the same models typed for cuda: code generation only (no GPU here) ----------------------

_TYPE = re.compile(r"((?:f16|bf16|f32|f64|i8|i16|i32|i64|u8|b8)\[[^\]]*\](?:\{[^}]*\})?)(?!@)")


def for_cuda(fn: Callable[..., Any], *args: torch.Tensor) -> Module:
    """fn captured here, its IR retyped onto cuda:0, compiled by `inductor-cuda` (Triton
    source only: nothing runs). Every loop kernel must be rendered as Triton."""
    with torch.no_grad():
        c = capture(fn, args, {})
    assert c.module is not None
    text = _TYPE.sub(r"\1@cuda:0", str(c.module))
    m = run_pipeline(parse(text), "decompose,cse,dce,inductor-cuda")
    left = [n.op for g in m.graphs.values() for n in g.nodes if n.op.startswith("loop.")]
    assert not left, [g.attrs.get("triton_fallback") for g in m.graphs.values()]
    assert m.kernels and {k.lang for k in m.kernels.values()} == {"triton"}
    assert all(n.kwargs.get("device") == "cuda:0" for g in m.graphs.values() for n in g.nodes
               if n.op == "kernels.call")
    verify(parse(str(m)))  # the dump replays
    return m


def test_models_render_for_cuda() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16)).eval()
    for_cuda(mlp, torch.randn(3, 16))
    for_cuda(ConvNet().eval(), torch.randn(2, 3, 8, 8))


def test_max_pool_and_cat_render_for_cuda() -> None:
    # concatenate's bounds (loop.index) carry the kernel's device (on the H200 they were typed
    # cpu and prims.where refused them: max_pool2d_with_indices and cat fell back to eager)
    for_cuda(lambda x: torch.cat([F.max_pool2d(x, 2), x[:, :, :4, :4]], 1),
             torch.randn(2, 3, 8, 8))
