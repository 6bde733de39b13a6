"""Pooling without a window buffer (issue 18 #5): `window-reduce` (targets/cpu/pool.py) turns
the decompositions' amax/sum over a stack of shifted views into an elementwise chain, so a max
pool is one pointwise kernel with K loads per output instead of a [N, C, H, W, K] buffer written
and reduced. Checked on the IR (no concatenate, no rank-5 kernel output) and against eager
(NaN, infinities, padding, ceil_mode, avg pooling)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline

POOL = """ember.ir 1.0

graph @f(%x: f32[2, 3, 9, 9]) -> (f32[2, 3, 5, 5]) {
  %y, %i = aten.max_pool2d_with_indices.default(%x, [3, 3], [2, 2], [1, 1]) : (f32[2, 3, 5, 5], i64[2, 3, 5, 5])
  return (%y)
}
"""


def _ops(m: Module) -> list[str]:
    return [n.op for n in m.graph("f").nodes]


def test_max_pool_is_a_maximum_chain_and_one_kernel() -> None:
    prims = run_pipeline(parse(POOL), "decompose,cse,dce")
    assert "prims.concatenate" in _ops(prims) and "prims.amax" in _ops(prims)
    chained = run_pipeline(prims, "window-reduce", verify_each=True)
    ops = _ops(chained)
    assert "prims.amax" not in ops and ops.count("prims.maximum") == 8
    compiled = compile_module(parse(POOL))
    calls = [n for n in compiled.graph("f").nodes if n.op == "kernels.call"]
    assert len(calls) == 1
    out_shapes = calls[0].kwargs["out_shapes"]
    assert isinstance(out_shapes, list) and out_shapes == [[2, 3, 5, 5]]
    x = torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(0))
    x[0, 1, 4, 4] = float("nan")
    x[1, 2, 0, 0] = float("inf")
    got = compiled_runner(compiled)(None, [x]).outputs[0]
    torch.testing.assert_close(got, F.max_pool2d(x, 3, 2, 1), equal_nan=True)


def test_a_stack_read_elsewhere_is_left_alone() -> None:
    src = """ember.ir 1.0

graph @f(%a: f32[4], %b: f32[4]) -> (f32[4], f32[4, 2]) {
  %ua = prims.unsqueeze(%a, dims=[1]) : f32[4, 1]
  %ub = prims.unsqueeze(%b, dims=[1]) : f32[4, 1]
  %c = prims.concatenate([%ua, %ub], dim=1) : f32[4, 2]
  %m = prims.amax(%c, dims=[1]) : f32[4]
  return (%m, %c)
}
"""
    assert "prims.amax" in _ops(run_pipeline(parse(src), "window-reduce"))


@settings(max_examples=5, deadline=None)
@given(k=st.integers(2, 4), s=st.integers(1, 3), pad=st.integers(0, 1), ceil=st.booleans(),
       avg=st.booleans(), special=st.sampled_from([0.0, float("nan"), float("-inf")]))
def test_pools_match_eager(k: int, s: int, pad: int, ceil: bool, avg: bool,
                           special: float) -> None:
    pad = min(pad, k // 2)
    if avg:
        def fn(x: torch.Tensor) -> torch.Tensor:
            return F.avg_pool2d(x, k, s, pad, ceil_mode=ceil)
    else:
        def fn(x: torch.Tensor) -> torch.Tensor:
            return F.max_pool2d(x, k, s, pad, ceil_mode=ceil)
    x = torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(k * 7 + s))
    x[0, 0, 3, 3] = special
    from ember.runtime import compile as ember_compile
    got = ember_compile(fn, backend="inductor")(x)
    torch.testing.assert_close(got, fn(x), equal_nan=True, rtol=1e-5, atol=1e-6)


# ---- layout choice: a convolution's multi-reader input is computed channels-last ----------------

class _Residual(torch.nn.Module):
    """conv -> relu -> max pool, whose result feeds both a convolution and a residual add (the
    ResNet stem and block shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.c0 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c1 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.relu(self.c0(x)), 3, 2, 1)
        z = torch.relu(self.c1(y) + y)
        return self.c2(z) + z


def test_multi_reader_conv_inputs_are_written_channels_last() -> None:
    """The pool's and the residual's results are written NHWC once (no NCHW buffer copied to
    NHWC for the next convolution), and the net matches eager."""
    from ember.inductor.targets.cpu import conv

    torch.manual_seed(0)
    net = _Residual().eval()
    x = torch.randn(2, 3, 12, 12)
    from ember.runtime import compile as ember_compile
    with torch.no_grad():
        torch.testing.assert_close(ember_compile(net, backend="inductor")(x), net(x),
                                   rtol=1e-4, atol=1e-4)
    src = """ember.ir 1.0

graph @f(%x: f32[1, 4, 6, 6], %w: f32[4, 4, 3, 3], %b: f32[1, 4, 6, 6]) -> (f32[1, 4, 6, 6], f32[1, 4, 6, 6]) {
  %y = prims.add(%x, %b) : f32[1, 4, 6, 6]
  %c = prims.convolution(%y, %w, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[1, 4, 6, 6]
  %z = prims.mul(%y, %b) : f32[1, 4, 6, 6]
  return (%c, %z)
}
"""
    m = run_pipeline(parse(src), "conv-nhwc", verify_each=True)
    g = m.graph("f")
    y = next(r for n in g.nodes for r in n.results if r.name == "y")
    assert y.node is not None and y.node.op == "prims.permute"
    assert y.node.kwargs["dims"] == conv.TO_NCHW
    compiled = compile_module(parse(src))
    copies = [n for n in compiled.graph("f").nodes
              if n.op == "kernels.call" and any(r.name.endswith(".nhwc") for r in n.results)]
    assert copies == []
    ins = [torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3), torch.randn(1, 4, 6, 6)]
    got = compiled_runner(compiled)(None, ins).outputs
    want = _reference(parse(src), ins)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _reference(m: Module, ins: list[torch.Tensor]) -> list[torch.Tensor]:
    from ember.ir import Interpreter
    return list(Interpreter(m).run(ins).outputs)
