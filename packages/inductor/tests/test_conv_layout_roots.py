"""A value read by several convolution-bound chains (DenseNet: the stem's max pool, read through
each dense layer's concatenation, BatchNorm and ReLU) is computed channels-last: the kernels
that loop channels-last to feed the convolutions read it contiguously, not with the channels
strided by the image size (densenet121 at 1 thread: 352 -> 245 ms, eager 247)."""

from __future__ import annotations

import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu.conv import conv_nhwc
from ember.ir import Interpreter, parse, verify

T = "f32[2, 4, 6, 5]"
DENSE = f"""ember.ir 1.0

graph @f(%x: {T}, %y: {T}, %w1: f32[3, 4, 1, 1], %w2: f32[3, 8, 1, 1]) -> (f32[2, 3, 6, 5], f32[2, 3, 6, 5]) {{
  %p = prims.maximum(%x, %y) : {T}
  %a = prims.mul(%p, 0.5) : {T}
  %r = prims.maximum(%a, 0.0) : {T}
  %c1 = prims.convolution(%r, %w1, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, 3, 6, 5]
  %k = prims.concatenate([%p, %x], dim=1) : f32[2, 8, 6, 5]
  %b = prims.add(%k, 1.0) : f32[2, 8, 6, 5]
  %s = prims.maximum(%b, 0.0) : f32[2, 8, 6, 5]
  %c2 = prims.convolution(%s, %w2, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, 3, 6, 5]
  return (%c1, %c2)
}}
"""


def test_a_root_read_by_two_convolution_chains_is_computed_channels_last() -> None:
    m = parse(DENSE)
    verify(m)
    g = conv_nhwc(m).graphs["f"]
    made = {r.name: n for n in g.nodes for r in n.results}
    # %p is now the NCHW permute of a channels-last maximum
    assert made["p"].op == "prims.permute"
    root = made["p"].args[0]
    assert root.node is not None and root.node.op == "prims.maximum"
    assert list(root.type.shape) == [2, 6, 5, 4]
    compiled = compile_module(m)
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*[int(d) for d in p.type.shape], generator=gen)  # type: ignore
              for p in m.graphs["f"].params]
    inputs[0][0, 1, 2, 3] = float("nan")
    want = Interpreter(m).run(inputs).outputs
    got = compiled_runner(compiled)(None, inputs).outputs
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
