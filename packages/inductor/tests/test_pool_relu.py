"""A max pool of a ReLU (GoogLeNet's stem: conv -> BN -> ReLU -> max pool): `window-reduce`
(targets/cpu/pool.py) takes the ReLU once per output, max(0, max_k y_k), instead of at each of
the window's K loads, where every window reaches an element of the ReLU's input; results match
eager (NaN, infinities, padding, ceil_mode), and a window of padding only keeps its -inf."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Interpreter, Module, parse
from ember.ir.passes import run_pipeline
from ember.runtime import compile as ember_compile

# conv -> ReLU -> 3x3/2 ceil-mode max pool (the pool pads the bottom and right by -inf)
CONV_RELU_POOL = """ember.ir 1.0

graph @f(%x: f32[2, 3, 10, 10], %w: f32[4, 3, 3, 3]) -> (f32[2, 4, 5, 5]) {
  %c = aten.convolution.default(%x, %w, none, [1, 1], [1, 1], [1, 1], false, [0, 0], 1) : f32[2, 4, 10, 10]
  %r = aten.relu.default(%c) : f32[2, 4, 10, 10]
  %y, %i = aten.max_pool2d_with_indices.default(%r, [3, 3], [2, 2], [0, 0], [1, 1], true) : (f32[2, 4, 5, 5], i64[2, 4, 5, 5])
  return (%y)
}
"""


def _ops(m: Module) -> list[str]:
    return [n.op for n in m.graph("f").nodes]


def test_the_relu_under_a_max_pool_is_taken_once() -> None:
    """The ReLU node is gone: the pool's pad reads the convolution, the chain starts from
    maximum(window 0, 0) (9 maximums for a 3x3 window), so conv-nhwc folds no ReLU into the
    convolution; compiled, NaN and infinities in the input give eager's result."""
    m = run_pipeline(parse(CONV_RELU_POOL), "decompose,cse,dce,window-reduce", verify_each=True)
    g = m.graph("f")
    pad = next(n for n in g.nodes if n.op == "prims.pad")
    assert pad.args[0].node.op == "prims.convolution"  # type: ignore[union-attr]
    assert _ops(m).count("prims.maximum") == 9
    first = next(n for n in g.nodes if n.op == "prims.maximum")
    assert first.args[1] == 0 and first.args[0].node.op == "prims.slice"  # type: ignore[union-attr]
    conv = run_pipeline(m, "conv-nhwc").graph("f")
    assert [n.kwargs["relu"] for n in conv.nodes if n.op == "loop.conv2d"] == [False]
    compiled = compile_module(parse(CONV_RELU_POOL))
    g0 = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 10, 10, generator=g0), torch.randn(4, 3, 3, 3, generator=g0)
    x[0, 0, 2, 2] = float("nan")
    x[1, 1, 5, 5] = float("inf")
    x[1, 2, 9, 9] = -float("inf")
    got = compiled_runner(compiled)(None, [x, w]).outputs[0]
    want = F.max_pool2d(torch.relu(F.conv2d(x, w, padding=1)), 3, 2, ceil_mode=True)
    assert want.isnan().any()
    torch.testing.assert_close(got, want, equal_nan=True)


@settings(max_examples=5, deadline=None)
@given(k=st.integers(2, 4), s=st.integers(1, 3), pad=st.integers(0, 2), ceil=st.booleans(),
       special=st.sampled_from([-0.0, float("nan"), float("inf"), -float("inf")]))
def test_pools_of_a_relu_match_eager(k: int, s: int, pad: int, ceil: bool,
                                     special: float) -> None:
    pad = min(pad, k // 2)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(x * 2), k, s, pad, ceil_mode=ceil)
    x = torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(k * 7 + s))
    x[0, 0, 3, 3] = special
    x[0, 1, 0, 0] = special
    got = ember_compile(fn, backend="inductor")(x)
    torch.testing.assert_close(got, fn(x), equal_nan=True)


# a 1x2 window, stride 2, over a ReLU padded by 4 -inf columns: windows 2 and 3 are all padding
PADDING_ONLY = """ember.ir 1.0

graph @f(%x: f32[1, 4]) -> ({outs}) {{
  %r = prims.maximum(%x, 0) : f32[1, 4]
  %p = prims.pad(%r, -inf, config=[[0, 0, 0], [0, {hi}, 0]]) : f32[1, {w}]
  %s0 = prims.slice(%p, start=[0, 0], limit=[1, 7], step=[1, 2]) : f32[1, 4]
  %s1 = prims.slice(%p, start=[0, 1], limit=[1, 8], step=[1, 2]) : f32[1, 4]
  %u0 = prims.unsqueeze(%s0, dims=[2]) : f32[1, 4, 1]
  %u1 = prims.unsqueeze(%s1, dims=[2]) : f32[1, 4, 1]
  %c = prims.concatenate([%u0, %u1], dim=2) : f32[1, 4, 2]
  %m = prims.amax(%c, dims=[2]) : f32[1, 4]
  return ({rets})
}}
"""


def test_a_window_of_padding_only_or_a_relu_read_elsewhere_keeps_the_relu() -> None:
    """A window holding no element of the ReLU gives -inf (a ReLU taken after the max would
    give 0): the chain keeps its ReLU. So does a ReLU that something else reads too."""
    x = torch.tensor([[-1.0, 2.0, -3.0, 4.0]])
    cases = [(PADDING_ONLY.format(hi=4, w=8, outs="f32[1, 4]", rets="%m"), 1),
             (PADDING_ONLY.format(hi=4, w=8, outs="f32[1, 4], f32[1, 4]", rets="%m, %r"), 2)]
    for text, outs in cases:
        m = run_pipeline(parse(text), "window-reduce", verify_each=True)
        r = next(n for n in m.graph("f").nodes if n.results[0].name == "r")
        assert r.op == "prims.maximum" and _ops(m).count("prims.maximum") == 2
        got = compiled_runner(compile_module(parse(text)))(None, [x]).outputs
        want = Interpreter(parse(text)).run([x]).outputs
        assert len(got) == outs
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        assert got[0][0, 2:].eq(-float("inf")).all()
    # the same windows over an unpadded ReLU of 8 elements reach it everywhere: taken once
    text = PADDING_ONLY.format(hi=4, w=8, outs="f32[1, 4]", rets="%m").replace(
        "%x: f32[1, 4]", "%x: f32[1, 8]").replace(
        "%r = prims.maximum(%x, 0) : f32[1, 4]", "%r = prims.maximum(%x, 0) : f32[1, 8]").replace(
        "config=[[0, 0, 0], [0, 4, 0]]", "config=[[0, 0, 0], [0, 0, 0]]")
    m = run_pipeline(parse(text), "window-reduce", verify_each=True)
    assert all(n.results[0].name != "r" for n in m.graph("f").nodes)
    x8 = torch.tensor([[-1.0, 2.0, -3.0, -4.0, float("nan"), 1.0, -2.0, -0.5]])
    got = compiled_runner(compile_module(parse(text)))(None, [x8]).outputs[0]
    torch.testing.assert_close(got, F.max_pool1d(torch.relu(x8)[None], 2, 2)[0],
                               equal_nan=True)
