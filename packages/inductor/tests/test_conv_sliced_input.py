"""A value a convolution reads through a channel slice, and other nodes read whole (EdgeNeXt's
split transposed attention block: a depthwise convolution on the first channel chunk of the
block's input, which its LayerNorm and residual read too), is computed channels-last
(targets/cpu/conv.py `_roots` walks through slices)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu.conv import conv_nhwc
from ember.ir import Interpreter, parse, verify


def _split_block(c: int, h: int, part: int) -> str:
    """y = conv(x) * r (read by a channel slice's depthwise convolution, the other slice and
    the residual at the end); the convolved chunk concatenated with the rest, plus y."""
    t = f"f32[2, {c}, {h}, {h}]"
    rest = c - part
    return f"""ember.ir 1.0

graph @f(%x: {t}, %r: {t}, %w0: f32[{c}, {c}, 1, 1], %w1: f32[{part}, 1, 3, 3]) -> ({t}) {{
  %a = prims.convolution(%x, %w0, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : {t}
  %y = prims.mul(%a, %r) : {t}
  %s0 = prims.slice(%y, start=[0, 0, 0, 0], limit=[2, {part}, {h}, {h}]) : f32[2, {part}, {h}, {h}]
  %s1 = prims.slice(%y, start=[0, {part}, 0, 0], limit=[2, {c}, {h}, {h}]) : f32[2, {rest}, {h}, {h}]
  %d = prims.convolution(%s0, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups={part}) : f32[2, {part}, {h}, {h}]
  %k = prims.concatenate([%d, %s1], dim=1) : {t}
  %o = prims.add(%k, %y) : {t}
  return (%o)
}}
"""


def _check(c: int, h: int, part: int) -> None:
    m = parse(_split_block(c, h, part))
    verify(m)
    made = {r.name: n for n in conv_nhwc(m).graphs["f"].nodes for r in n.results}
    assert made["y"].op == "prims.permute", "the sliced value is computed channels-last"
    add = made["y"].args[0].node  # type: ignore[union-attr]
    assert add is not None and add.op == "prims.mul"
    assert [int(d) for d in add.results[0].type.shape] == [2, h, h, c]  # type: ignore[union-attr]
    compiled = compile_module(m)
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*[int(d) for d in p.type.shape], generator=gen)  # type: ignore
              for p in m.graphs["f"].params]
    inputs[1][0, 0, 1, 1] = float("nan")
    inputs[1][1, c - 1, 0, h - 1] = float("-inf")
    want = Interpreter(m).run(inputs).outputs
    got = compiled_runner(compiled)(None, inputs).outputs
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-4)


def test_a_value_convolved_through_a_channel_slice_is_channels_last() -> None:
    _check(8, 5, 3)


@settings(max_examples=4, deadline=None)
@given(c=st.sampled_from([4, 6, 12]), h=st.integers(2, 7), part=st.integers(1, 3))
def test_the_sliced_channels_last_value_matches_the_reference(c: int, h: int, part: int) -> None:
    _check(c, h, part)
