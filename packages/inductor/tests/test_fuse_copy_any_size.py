"""GoogLeNet's max pools (issue 18). A kernel read only by a copy (every element moved once,
nothing computed) is inlined into the copy whatever its size: fusion's max_nodes does not
apply, the fused body being the producer's own. The stem's pool (3x3, stride 2, ceil_mode: nine
windows with their edge masks, ~90 computing nodes) read by a 1x1 convolution was a kernel
writing the pool NCHW, gathering the NHWC convolution output with the channels strided, then a
copy to NHWC. And a window kernel's loops are cut at its edges in both image dims, also where
the window is strided (`2*i + 2 < 112`): the middle nest then tests nothing, where g++ left a
channels-innermost loop with select on loop-invariant row tests scalar. The stem's pool: 5.7 +
0.4 ms -> 0.4 ms (torch.compile's: 0.6 ms), 1 thread."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Module, parse

STEM = """ember.ir 1.0

graph @f(%x: f32[2, 3, 28, 28], %w1: f32[8, 3, 3, 3], %w2: f32[16, 8, 1, 1]) -> (f32[2, 16, 7, 7]) {
  %c1 = aten.convolution.default(%x, %w1, none, [2, 2], [1, 1], [1, 1], false, [0, 0], 1) : f32[2, 8, 14, 14]
  %r = aten.relu.default(%c1) : f32[2, 8, 14, 14]
  %p, %i = aten.max_pool2d_with_indices.default(%r, [3, 3], [2, 2], [0, 0], [1, 1], true) : (f32[2, 8, 7, 7], i64[2, 8, 7, 7])
  %c2 = aten.convolution.default(%p, %w2, none, [1, 1], [0, 0], [1, 1], false, [0, 0], 1) : f32[2, 16, 7, 7]
  return (%c2)
}
"""


def test_a_large_pool_read_by_a_convolution_is_computed_channels_last_in_one_kernel() -> None:
    compiled = compile_module(parse(STEM))
    calls = [n for n in compiled.graph("f").nodes if n.op == "kernels.call"]
    shapes = [s for n in calls for s in n.kwargs["out_shapes"]]  # type: ignore[union-attr]
    assert [2, 8, 7, 7] not in shapes  # the pool is never written NCHW: one NHWC kernel
    assert shapes.count([2, 7, 7, 8]) == 1
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(2, 3, 28, 28, generator=g), torch.randn(8, 3, 3, 3, generator=g),
                 torch.randn(16, 8, 1, 1, generator=g))
    got = compiled_runner(compiled)(None, [x, w1, w2]).outputs[0]
    want = F.conv2d(F.max_pool2d(F.relu(F.conv2d(x, w1, stride=2, padding=1)), 3, 2,
                                 ceil_mode=True), w2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _plain_loads(m: Module) -> list[str]:
    """The window kernels' (those padding with -inf) loads with no clamp (`ember_imin`/
    `ember_imax`) in their index."""
    src = "\n".join(k.source for k in m.kernels.values() if "-INFINITY" in k.source)
    return [ln for ln in src.splitlines() if "in0[" in ln and "ember_" not in ln]


POOL_S1 = """ember.ir 1.0

graph @f(%x: f32[2, 8, 12, 12], %w: f32[16, 8, 1, 1]) -> (f32[2, 16, 12, 12]) {
  %r = aten.relu.default(%x) : f32[2, 8, 12, 12]
  %p, %i = aten.max_pool2d_with_indices.default(%r, [3, 3], [1, 1], [1, 1], [1, 1], true) : (f32[2, 8, 12, 12], i64[2, 8, 12, 12])
  %c = aten.convolution.default(%p, %w, none, [1, 1], [0, 0], [1, 1], false, [0, 0], 1) : f32[2, 16, 12, 12]
  return (%c)
}
"""


def test_window_kernels_are_cut_at_both_image_edges() -> None:
    for src in (STEM, POOL_S1):
        compiled = compile_module(parse(src))
        assert _plain_loads(compiled), src  # the middle nest loads without clamps
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 8, 12, 12, generator=g), torch.randn(16, 8, 1, 1, generator=g)
    got = compiled_runner(compiled)(None, [x, w]).outputs[0]
    torch.testing.assert_close(got, F.conv2d(F.max_pool2d(F.relu(x), 3, 1, 1, ceil_mode=True),
                                             w), rtol=1e-4, atol=1e-4)


@settings(max_examples=6, deadline=None)
@given(k=st.integers(2, 4), s=st.integers(1, 2), ceil=st.booleans(), size=st.integers(9, 14),
       special=st.sampled_from([0.0, float("nan"), float("-inf")]))
def test_pool_then_convolution_matches_eager(k: int, s: int, ceil: bool, size: int,
                                              special: float) -> None:
    g = torch.Generator().manual_seed(k * 31 + size)
    w = torch.randn(5, 6, 1, 1, generator=g)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.max_pool2d(torch.relu(x), k, s, ceil_mode=ceil), w)

    x = torch.randn(2, 6, size, size + 1, generator=g)
    x[1, 2, 3, 4] = special
    from ember.runtime import compile as ember_compile
    got = ember_compile(fn, backend="inductor")(x)
    torch.testing.assert_close(got, fn(x), equal_nan=True, rtol=1e-4, atol=1e-4)
