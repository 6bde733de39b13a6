"""Hardswish after a convolution (mobilenetv3's activation) folds into the convolution: torch's
hardswish_ in place inside the packed extern, or one kernel after a computed weight's
convolution; a chain that is not exactly hardswish stays as it was."""

from __future__ import annotations

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import packed
from ember.inductor.targets.cpu.epilogue import conv_epilogues
from ember.ir import parse
from ember.runtime.compile import compile as ember_compile

needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="oneDNN's packed weights need mkldnn")

HSWISH = """  %{y}3 = prims.add(%{y}, 3) : f32[2, 4, 6, 5]
  %{y}lo = prims.maximum(%{y}3, 0) : f32[2, 4, 6, 5]
  %{y}g = prims.minimum(%{y}lo, 6) : f32[2, 4, 6, 5]
  %{y}m = prims.mul(%{y}, %{y}g) : f32[2, 4, 6, 5]
  %{y}h = prims.div(%{y}m, {six}) : f32[2, 4, 6, 5]
"""


def _graph(weight: str, six: str = "6") -> str:
    """conv -> hardswish -> (conv, and a pool times it: a squeeze-excitation's two readers)."""
    w1 = "%w1" if weight == "param" else "%w1s"
    scaled = "" if weight == "param" else \
        "  %w1s = prims.mul(%w1, 2.0) : f32[4, 3, 3, 3]\n"
    return f"""ember.ir 1.0

graph @f(%x: f32[2, 3, 6, 5], %w1: f32[4, 3, 3, 3], %w2: f32[4, 4, 1, 1]) -> (f32[2, 4, 6, 5]) {{
{scaled}  %c = prims.convolution(%x, {w1}, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
{HSWISH.format(y="c", six=six)}  %c2 = prims.convolution(%ch, %w2, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
{HSWISH.format(y="c2", six="6")}  %s = prims.sum(%c2h, dims=[2, 3]) : f32[2, 4]
  %sb = prims.broadcast_in_dim(%s, shape=[2, 4, 6, 5], broadcast_dims=[0, 1]) : f32[2, 4, 6, 5]
  %o = prims.mul(%c2h, %sb) : f32[2, 4, 6, 5]
  return (%o)
}}
"""


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(s, generator=g) * 2
                 for s in ([2, 3, 6, 5], [4, 3, 3, 3], [4, 4, 1, 1]))
    x[0, 0, 0, 0] = float("nan")
    x[1, 1, 2, 2] = float("inf")
    x[1, 2, 4, 1] = -float("inf")
    return [x, w1, w2]


def _want(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> list[torch.Tensor]:
    hs = torch.nn.functional.hardswish
    h = hs(torch.conv2d(x, w1, padding=1))
    h2 = hs(torch.conv2d(h, w2))
    return [h2 * h2.sum((2, 3), keepdim=True)]


@needs_mkldnn
def test_hardswish_runs_inside_the_packed_convolution() -> None:
    """Read by a convolution, or by two kernels (pool and scale), the hardswish is torch's
    hardswish_ inside the extern: no kernel rewrites the activation; NaN and inf as eager's."""
    compiled = compile_module(parse(_graph("param")))
    externs = [n for n in compiled.graph().nodes if n.op == "kernels.extern"]
    assert [(n.kwargs["op"], n.kwargs.get("hardswish")) for n in externs] \
        == [("loop.conv2d_packed", True), ("loop.conv2d_packed", True)]
    got = compiled_runner(compiled)(None, _inputs()).outputs
    want = _want(*_inputs())
    assert want[0].isnan().any()
    # the 1x1 convolution on 60 pixels runs as addmm: another summation order
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-3)


def test_hardswish_after_a_computed_weight_is_one_kernel() -> None:
    compiled = compile_module(parse(_graph("computed")))
    ops = [n.kwargs.get("op", n.op) for n in compiled.graph().nodes]
    assert ops.count("loop.conv2d_nhwc") == 1
    x, w1, w2 = _inputs()
    got = compiled_runner(compiled)(None, [x, w1, w2]).outputs
    torch.testing.assert_close(got, _want(x, w1 * 2, w2), equal_nan=True, rtol=1e-5,
                               atol=1e-3)


def test_a_chain_that_is_not_hardswish_is_not_folded() -> None:
    """x * min(max(x + 3, 0), 6) / 5 is not hardswish: the first convolution folds nothing."""
    g = parse(_graph("param", six="5")).graphs["f"]
    epis = {n.results[0].name: e for n, e in conv_epilogues(g).items()}
    assert "c" not in epis and epis["c2"].hardswish
    compiled = compile_module(parse(_graph("param", six="5")))
    x, w1, w2 = _inputs()
    h = torch.conv2d(x, w1, padding=1)
    h = h * torch.clamp(h + 3, 0, 6) / 5
    h2 = torch.nn.functional.hardswish(torch.conv2d(h, w2))
    got = compiled_runner(compiled)(None, [x, w1, w2]).outputs
    torch.testing.assert_close(got, [h2 * h2.sum((2, 3), keepdim=True)], equal_nan=True,
                               rtol=1e-5, atol=1e-3)


def test_hardswish_flag_is_checked() -> None:
    with pytest.raises(Exception, match="hardswish"):
        packed._operands([1, 2], {"scale": False, "bias": False, "relu": False,
                                  "silu": True, "hardswish": True})


def test_conv_bn_hardswish_module_matches_eager() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
        torch.nn.Hardswish(), torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),
        torch.nn.BatchNorm2d(8), torch.nn.Hardswish(), torch.nn.Conv2d(8, 4, 1)).eval()
    for bn in (net[1], net[4]):
        assert isinstance(bn, torch.nn.BatchNorm2d)
        with torch.no_grad():
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 10, 9)
    with torch.no_grad():
        torch.testing.assert_close(ember_compile(net)(x), net(x), rtol=1e-4, atol=1e-4)
