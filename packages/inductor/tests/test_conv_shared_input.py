"""A value several convolutions read (a ShuffleNet block's two branches on its shuffled input)
is copied to NHWC once, a channel concatenation convolutions read through views (the channel
shuffle) is computed channels-last, and a 1x1 convolution of up to SMALL_MATMUL multiply-adds is a matrix
product on the NHWC rows (targets/cpu/conv.py `_share_nhwc`, `_viewed_cats`; packed.py `_matmul`)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import packed
from ember.inductor.targets.cpu.conv import conv_nhwc
from ember.ir import Interpreter, parse, verify


def _shuffle(c: int, groups: int, stride: int, h: int) -> str:
    """conv(x) concatenated with y, channel-shuffled (reshape, transpose, reshape), then read
    by a depthwise convolution and a 1x1 convolution (ShuffleNet's downsampling block)."""
    half, t = c // 2, f"f32[2, {c}, {h}, {h}]"
    o = (h + 2 - 3) // stride + 1
    return f"""ember.ir 1.0

graph @f(%x: f32[2, {half}, {h}, {h}], %y: f32[2, {half}, {h}, {h}], %w0: f32[{half}, {half}, 1, 1], %w1: f32[{c}, 1, 3, 3], %w2: f32[{c}, {c // groups}, 1, 1]) -> (f32[2, {c}, {o}, {o}], f32[2, {c}, {h}, {h}]) {{
  %a = prims.convolution(%x, %w0, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, {half}, {h}, {h}]
  %k = prims.concatenate([%a, %y], dim=1) : {t}
  %r1 = prims.reshape(%k, shape=[2, 2, {half}, {h}, {h}]) : f32[2, 2, {half}, {h}, {h}]
  %p = prims.permute(%r1, dims=[0, 2, 1, 3, 4]) : f32[2, {half}, 2, {h}, {h}]
  %s = prims.reshape(%p, shape=[2, {c}, {h}, {h}]) : {t}
  %c1 = prims.convolution(%s, %w1, stride=[{stride}, {stride}], padding=[1, 1], dilation=[1, 1], groups={c}) : f32[2, {c}, {o}, {o}]
  %c2 = prims.convolution(%s, %w2, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups={groups}) : {t}
  return (%c1, %c2)
}}
"""


def _check(c: int, groups: int, stride: int, h: int) -> None:
    m = parse(_shuffle(c, groups, stride, h))
    verify(m)
    made = {r.name: n for n in conv_nhwc(m).graphs["f"].nodes for r in n.results}
    assert made["k"].op == "prims.permute", "the shuffled concatenation is channels-last"
    cat = made["k"].args[0].node  # type: ignore[union-attr]
    assert cat is not None and cat.op == "prims.concatenate" and cat.kwargs["dim"] == 3
    compiled = compile_module(m)
    nodes = compiled.graph().nodes
    externs = [n for n in nodes if n.op == "kernels.extern"
               and n.kwargs.get("op") == "loop.conv2d_packed"]
    assert externs[1].args[0] is externs[2].args[0], "one NHWC copy of %s, both read it"
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*[int(d) for d in p.type.shape], generator=gen)  # type: ignore
              for p in m.graphs["f"].params]
    inputs[1][0, 1, 2, 2] = float("nan")
    inputs[0][1, 0, 1, 1] = float("inf")
    want = Interpreter(m).run(inputs).outputs
    got = compiled_runner(compiled)(None, inputs).outputs
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-4)


def test_a_shuffled_value_two_convolutions_read_is_copied_to_nhwc_once() -> None:
    _check(8, 1, 2, 6)


@settings(max_examples=4, deadline=None)
@given(c=st.sampled_from([4, 6, 12]), groups=st.sampled_from([1, 2]),
       stride=st.sampled_from([1, 2]), h=st.integers(3, 7))
def test_the_shared_nhwc_copy_matches_eager(c: int, groups: int, stride: int, h: int) -> None:
    _check(c, groups, stride, h)


def test_a_1x1_convolution_up_to_the_threshold_is_a_matrix_product() -> None:
    """A 1x1 convolution of up to 1.5M multiply-adds (58 channels at 7x7, batch 2: 0.33M;
    addmm took ~0.4x oneDNN's time) runs as addmm, with the result eager's within f32
    tolerance; ShuffleNet's 116 channels at 14x14 (5.3M) and GhostNet's 16->8 at 112x112
    (3.2M) are oneDNN's (~0.6x and ~0.3x addmm's time)."""
    kw = {"scale": True, "bias": True, "relu": True, "stride": [1, 1], "padding": [0, 0],
          "dilation": [1, 1], "groups": 1}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 7, 58, generator=g)  # NHWC
    w = torch.nn.Parameter(torch.randn(58, 58, 1, 1, generator=g))
    a, b = torch.rand(58, generator=g) + 0.5, torch.randn(58, generator=g)
    x[0, 3, 4, 5] = float("nan")
    assert packed._matmul(x, w, kw)
    assert not packed._matmul(torch.randn(2, 14, 14, 116), torch.randn(116, 116, 1, 1), kw)
    assert not packed._matmul(torch.randn(2, 112, 112, 16), torch.randn(8, 16, 1, 1), kw)
    with torch.no_grad():
        want = torch.relu(torch.conv2d(x.permute(0, 3, 1, 2), w * a[:, None, None, None], b))
        got = packed._run(None, [x, w, a, b], kw)  # type: ignore[arg-type]
    torch.testing.assert_close(got, want.permute(0, 2, 3, 1), equal_nan=True, rtol=1e-4,
                               atol=1e-4)
