"""A kernel writing its result in place over a dead buffer of another shape (a linear's [M, N]
product that a ReLU writes as [B, L, N]) keeps that buffer's tensor as it is, without a
`.view()`, where only pointer-ABI kernels and reshapes read the result and it is no graph
output (wrapper.py `shape_free`); the reshape back to [M, N] for the next linear is then the
tensor itself. A result that an extern reads as a tensor, or that the graph returns, still
gets its own shape."""

from __future__ import annotations

import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, Module
from packages.inductor.tests.wrapper_checks import compiled_once, same

TEXT = """ember.ir 1.0

graph @ffn(%x: f32[2, 3, 8], %w1: f32[16, 8], %b1: f32[16], %w2: f32[8, 16], %b2: f32[8]) -> (f32[2, 3, 8]) {
  %h = aten.linear.default(%x, %w1, %b1) : f32[2, 3, 16]
  %r = aten.relu.default(%h) : f32[2, 3, 16]
  %y = aten.linear.default(%r, %w2, %b2) : f32[2, 3, 8]
  return (%y)
}

graph @ffn_out(%x: f32[2, 3, 8], %w1: f32[16, 8], %b1: f32[16], %w2: f32[8, 16], %b2: f32[8]) -> (f32[2, 3, 8], f32[2, 3, 16]) {
  %h = aten.linear.default(%x, %w1, %b1) : f32[2, 3, 16]
  %r = aten.relu.default(%h) : f32[2, 3, 16]
  %y = aten.linear.default(%r, %w2, %b2) : f32[2, 3, 8]
  return (%y, %r)
}

graph @gelu(%x: f32[2, 64, 64], %w1: f32[256, 64], %b1: f32[256], %w2: f32[64, 256], %b2: f32[64]) -> (f32[2, 64, 64]) {
  %h = aten.linear.default(%x, %w1, %b1) : f32[2, 64, 256]
  %g = aten.gelu.default(%h) : f32[2, 64, 256]
  %y = aten.linear.default(%g, %w2, %b2) : f32[2, 64, 64]
  return (%y)
}
"""
_BUFFER_VIEW = re.compile(r"= v\d+_\d+\.(view|reshape)\(")


def compiled() -> Module:
    return compiled_once(TEXT)


def test_no_view_of_the_reused_buffer() -> None:
    m = compiled()
    # the ReLU over the first product and the reshape back: no call; the second product's
    # bias add, written as the [2, 3, 8] graph output, keeps its view (the input's reshape,
    # p0.reshape, is no buffer's)
    src = generate(m, "ffn").source
    assert len(_BUFFER_VIEW.findall(src)) == 1, src
    # returned, the ReLU's result is a [2, 3, 16] tensor: its view and reshape stay
    out = generate(m, "ffn_out").source
    assert len(_BUFFER_VIEW.findall(out)) == 3, out
    # the first product's GELU is oneDNN's post-op (2.1M multiply-adds): its [128, 256] result
    # goes to the second product as it is
    gelu = generate(m, "gelu").source
    assert ".reshape((128, 256))" not in gelu, gelu


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_shape_free_matches_eager(seed: int) -> None:
    m = compiled()
    g = torch.Generator().manual_seed(seed)
    args = [torch.randn(2, 3, 8, generator=g), torch.randn(16, 8, generator=g),
            torch.randn(16, generator=g), torch.randn(8, 16, generator=g),
            torch.randn(8, generator=g)]
    x, w1, b1, w2, b2 = args
    r = torch.relu(torch.nn.functional.linear(x, w1, b1))
    y = torch.nn.functional.linear(r, w2, b2)
    for name, want in (("ffn", [y]), ("ffn_out", [y, r])):
        got = generate(m, name).call(list(args)).outputs
        same(got, Interpreter(m).run(list(args), name).outputs)
        assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in want]
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
    x, w1, b1, w2, b2 = args = [torch.randn(2, 64, 64, generator=g),
                                torch.randn(256, 64, generator=g) * 0.1,
                                torch.randn(256, generator=g),
                                torch.randn(64, 256, generator=g) * 0.1,
                                torch.randn(64, generator=g)]
    want = torch.nn.functional.linear(
        torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1)), w2, b2)
    got = generate(m, "gelu").call(list(args)).outputs
    same(got, Interpreter(m).run(list(args), "gelu").outputs)
    assert tuple(got[0].shape) == (2, 64, 64)
    torch.testing.assert_close(got[0], want)
