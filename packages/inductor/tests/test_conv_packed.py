"""`loop.conv2d_packed` (targets/cpu/packed.py): convolutions on oneDNN's packed weights, cached
on the weight and repacked whenever the weight or the folded BatchNorm scale changes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import packed
from ember.ir import Module, Node, OpTypeError, parse
from ember.runtime.bench import ember_status
from ember.runtime.compile import compile as ember_compile

KW = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}
needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="oneDNN's packed weights need mkldnn")


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, padding=1, groups=2))
    with torch.no_grad():
        bn = net[1]
        assert isinstance(bn, torch.nn.BatchNorm2d)
        assert bn.running_mean is not None and bn.running_var is not None
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return net.eval()


@needs_mkldnn
def test_the_packed_weight_is_cached_and_repacked_when_it_changes() -> None:
    w = torch.nn.Parameter(torch.randn(8, 3, 3, 3))
    a = torch.rand(8) + 0.5
    size = [2, 3, 6, 6]
    first = packed.packed_weight(w, a, size, KW)
    assert packed.packed_weight(w, a.clone(), size, KW) is first  # equal scale: reused
    other = packed.packed_weight(w, a + 1, size, KW)
    assert other is not first
    with torch.no_grad():
        w.mul_(2)  # an in-place update bumps the version: repacked
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    again = packed.packed_weight(w, a, size, KW)
    assert again is not first
    got = torch.ops.mkldnn._convolution_pointwise(x, again, None, [1, 1], [1, 1], [1, 1], 1,
                                                  "none", [], "")
    torch.testing.assert_close(got, torch.conv2d(x, w.detach() * a[:, None, None, None],
                                                 padding=1))
    plain = torch.randn(8, 3, 3, 3)  # not a Parameter: packed per call, never cached
    assert packed.packed_weight(plain, None, size, KW) is not \
        packed.packed_weight(plain, None, size, KW)
    assert not packed.is_cached(plain)
    assert packed.is_cached(w)


def test_bad_operands_are_refused_in_one_line() -> None:
    with pytest.raises(Exception, match="scale=true"):
        packed._operands([1, 2, 3], {"scale": False, "bias": False})


@needs_mkldnn
def test_compiled_conv_bn_relu_follows_weight_and_statistics_updates() -> None:
    """A compiled conv -> BN -> ReLU -> conv runs on packed weights (the ReLU in the extern:
    only a convolution reads it) and matches eager after in-place updates of the weights
    and running statistics, and keeps NaN through the ReLU as torch.relu does."""
    net = _net()
    x = torch.randn(2, 3, 6, 6)
    f = ember_compile(net)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        conv0 = net[0]
        bn = net[1]
        assert isinstance(conv0, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d)
        assert bn.running_mean is not None and bn.running_var is not None
        status = ember_status(f)
        assert status["compiled_graphs"] == 1 and not status["fallbacks"], status["status"]
        assert packed.is_cached(conv0.weight)  # the packed path ran, and cached
        conv0.weight.add_(0.5)
        torch.testing.assert_close(f(x), net(x))
        bn.running_var.mul_(3)  # the folded scale changes: repacked
        bn.running_mean.add_(1)
        torch.testing.assert_close(f(x), net(x))
        bn.running_var[0] = -1.0  # rsqrt of a negative variance: NaN through ReLU
        want = net(x)
        assert want.isnan().any()
        torch.testing.assert_close(f(x), want, equal_nan=True)


def _two_convs(text: str, scale: float = 1.0, infs: bool = False
               ) -> tuple[Module, list[Node], list[torch.Tensor]]:
    """`text` (a graph of x [2, 3, 6, 5], w1 [4, 3, 3, 3], w2 [4, 4, 1, 1]) compiled, its
    extern calls, and random inputs (times `scale`), x NaN at one element (and, with `infs`,
    +inf and -inf at two more)."""
    compiled = compile_module(parse(text))
    externs = [n for n in compiled.graph().nodes if n.op == "kernels.extern"]
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(s, generator=g) * scale
                 for s in ([2, 3, 6, 5], [4, 3, 3, 3], [4, 4, 1, 1]))
    x[0, 0, 0, 0] = float("nan")
    if infs:
        x[1, 1, 2, 2] = float("inf")
        x[1, 2, 4, 1] = -float("inf")
    return compiled, externs, [x, w1, w2]


CONV_RELU_CONV = """ember.ir 1.0

graph @f(%x: f32[2, 3, 6, 5], %w1: f32[4, 3, 3, 3], %w2: f32[4, 4, 1, 1]) -> (f32[2, 4, 6, 5]) {
  %c1 = prims.convolution(%x, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %r = prims.maximum(%c1, 0.0) : f32[2, 4, 6, 5]
  %c2 = prims.convolution(%r, %w2, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  return (%c2)
}
"""


def test_relu_read_only_by_a_convolution_runs_inside_the_extern() -> None:
    """No kernel would fuse that ReLU (the next convolution reads the NHWC buffer as it is):
    the extern applies torch's relu_ in place, NaN kept."""
    compiled, externs, (x, w1, w2) = _two_convs(CONV_RELU_CONV)
    assert [(n.kwargs["op"], n.kwargs["relu"]) for n in externs] \
        == [("loop.conv2d_packed", True), ("loop.conv2d_packed", False)]
    want = torch.conv2d(torch.relu(torch.conv2d(x, w1, padding=1)), w2)
    got = compiled_runner(compiled)(None, [x, w1, w2]).outputs[0]
    torch.testing.assert_close(got, want, equal_nan=True)


@needs_mkldnn
def test_a_weight_whose_data_is_reassigned_is_repacked() -> None:
    # `.data =` keeps the version counter; the cache's data-pointer check must not meet a new
    # storage at a freed storage's address (two reassignments between calls free the packed
    # one, and the allocator hands its address out again)
    w = torch.nn.Parameter(torch.randn(8, 3, 3, 3))
    size = [2, 3, 6, 6]
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    for _ in range(10):
        got = torch.ops.mkldnn._convolution_pointwise(
            x, packed.packed_weight(w, None, size, KW), None, [1, 1], [1, 1], [1, 1], 1,
            "none", [], "")
        torch.testing.assert_close(got, torch.conv2d(x, w.detach(), padding=1))
        # the packed-from storage is held, so no new storage can take its address
        pinned = packed._PACKS[id(w)].source
        assert pinned.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
        w.data = w.data * 2
        w.data = w.data * 1.5


CONV_RELU6_CONV = """ember.ir 1.0

graph @f(%x: f32[2, 3, 6, 5], %w1: f32[4, 3, 3, 3], %w2: f32[4, 4, 1, 1]) -> (f32[2, 4, 6, 5], f32[2, 4, 6, 5]) {
  %c1 = prims.convolution(%x, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %r = prims.maximum(%c1, 0.0) : f32[2, 4, 6, 5]
  %r6 = prims.minimum(%r, 6.0) : f32[2, 4, 6, 5]
  %c2 = prims.convolution(%r6, %w2, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %s = prims.maximum(%c2, 0.0) : f32[2, 4, 6, 5]
  %s6 = prims.minimum(6.0, %s) : f32[2, 4, 6, 5]
  %o = prims.add(%s6, 1.0) : f32[2, 4, 6, 5]
  return (%c2, %o)
}
"""


def test_relu6_folds_into_the_convolution_and_keeps_nan() -> None:
    """max(., 0) then min(., 6) after a convolution (ReLU6) is one clamp: inside the extern
    (torch.clamp_, in place) where only a convolution reads it, else a max/min kernel; NaN,
    +inf and -inf come out as eager's clamp gives them."""
    compiled, externs, (x, w1, w2) = _two_convs(CONV_RELU6_CONV, 4, infs=True)
    assert [(n.kwargs["op"], n.kwargs["relu"], n.kwargs.get("relu_max")) for n in externs] \
        == [("loop.conv2d_packed", True, 6.0), ("loop.conv2d_packed", False, None)]
    h = torch.clamp(torch.conv2d(x, w1, padding=1), 0, 6)
    c2 = torch.conv2d(h, w2)
    want = [c2, torch.clamp(c2, 0, 6) + 1]
    got = compiled_runner(compiled)(None, [x, w1, w2]).outputs
    assert want[1].isnan().any() and (want[1] == 7).any()
    torch.testing.assert_close(got, want, equal_nan=True)


def test_relu_max_needs_relu_and_a_bound() -> None:
    with pytest.raises(Exception, match="relu_max"):
        packed._operands([1, 2], {"scale": False, "bias": False, "relu": False,
                                  "relu_max": 6.0})


CONV_SILU_CONV = """ember.ir 1.0

graph @f(%x: f32[2, 3, 6, 5], %w1: f32[4, 3, 3, 3], %w2: f32[4, 4, 1, 1]) -> (f32[2, 4, 6, 5]) {
  %c1 = prims.convolution(%x, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %n = prims.neg(%c1) : f32[2, 4, 6, 5]
  %e = prims.exp(%n) : f32[2, 4, 6, 5]
  %d = prims.add(1.0, %e) : f32[2, 4, 6, 5]
  %s = prims.div(%c1, %d) : f32[2, 4, 6, 5]
  %c2 = prims.convolution(%s, %w2, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %p = prims.add(%c2, 1.0) : f32[2, 4, 6, 5]
  %q = prims.mul(%p, 0.5) : f32[2, 4, 6, 5]
  %o = prims.add(%q, %p) : f32[2, 4, 6, 5]
  return (%o)
}
"""


def test_silu_folds_into_the_convolution_and_dead_conv_outputs_are_reused() -> None:
    """SiLU as prims write it (y / (1 + exp(-y))) after a convolution read only by another
    convolution runs inside the extern (torch's silu_, eager's kernel): no kernel writes a
    new activation. plan-buffers hands a dead convolution output's storage to a later kernel."""
    compiled, externs, (x, w1, w2) = _two_convs(CONV_SILU_CONV, 4, infs=True)
    assert [(n.kwargs["op"], n.kwargs.get("silu")) for n in externs] \
        == [("loop.conv2d_packed", True), ("loop.conv2d_packed", None)]
    conv_out = {n.results[0] for n in externs}
    reuse = [n.kwargs.get("reuse") for n in compiled.graph().nodes if n.op == "kernels.call"]
    reused = [v for r in reuse if isinstance(r, list) for v in r]
    assert conv_out & set(reused), "a dead convolution output is reused"
    p = torch.conv2d(torch.nn.functional.silu(torch.conv2d(x, w1, padding=1)), w2) + 1
    got = compiled_runner(compiled)(None, [x, w1, w2]).outputs[0]
    # the 1x1 convolution on 60 pixels runs as addmm: another summation order than eager's
    # convolution, on values up to ~50
    torch.testing.assert_close(got, p * 0.5 + p, equal_nan=True, rtol=1e-5, atol=1e-4)


def test_a_1x1_convolution_on_few_pixels_runs_as_a_cached_matrix_product() -> None:
    """A squeeze-excitation's 1x1 convolution on [N, C, 1, 1] is addmm on the NHWC rows
    (oneDNN's per-call setup costs 5-10x the product); its [I, O] matrix, scaled, is cached
    on the weight and remade when the weight changes; relu/silu apply as before."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 5, 1, 1, generator=g))
    a, b = torch.rand(6, generator=g) + 0.5, torch.randn(6, generator=g)
    x = torch.randn(3, 1, 1, 5, generator=g)  # NHWC
    kw = {"scale": True, "bias": True, "relu": False, "silu": True, "stride": [1, 1],
          "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    assert packed._matmul(x, w, kw)
    with torch.no_grad():
        for _ in range(2):
            want = torch.nn.functional.silu(torch.conv2d(
                x.permute(0, 3, 1, 2), w * a[:, None, None, None], b)).permute(0, 2, 3, 1)
            got = packed._run(None, [x, w, a, b], kw)  # type: ignore[arg-type]
            torch.testing.assert_close(got, want)
            assert got.is_contiguous() and packed.is_cached(w)
            w.mul_(-2)  # a new version: the matrix is remade
    big = torch.randn(2, 64, 64, 5)
    assert not packed._matmul(big, torch.randn(600, 5, 1, 1), kw)  # many pixels: oneDNN
    assert not packed._matmul(x, w, {**kw, "stride": [2, 2]})


CONV_RESIDUAL = """ember.ir 1.0

graph @f(%x: f32[2, 4, 6, 5], %w1: f32[4, 4, 3, 3], %w2: f32[4, 4, 3, 3], %w3: f32[4, 4, 1, 1]) -> (f32[2, 4, 6, 5]) {
  %c1 = prims.convolution(%x, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %s1 = prims.add(%c1, %x) : f32[2, 4, 6, 5]
  %r1 = prims.maximum(%s1, 0.0) : f32[2, 4, 6, 5]
  %c2 = prims.convolution(%r1, %w2, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %c3 = prims.convolution(%r1, %w3, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %s2 = prims.add(%c2, %c3) : f32[2, 4, 6, 5]
  return (%s2)
}
"""


def test_a_residual_add_is_the_convolutions_post_op() -> None:
    """conv + residual (then ReLU) is one extern (oneDNN's binary add post-op): no kernel
    reads the convolution's result again. Where two convolutions meet in one add (a ResNet's
    downsample and main branch), one of them takes the add and the other's result is its
    residual. NaN in the residual comes through."""
    compiled = compile_module(parse(CONV_RESIDUAL))
    externs = [n for n in compiled.graph().nodes if n.op == "kernels.extern"]
    assert [bool(n.kwargs.get("residual")) for n in externs].count(True) == 2
    # the only kernels: x to NHWC (once, the input and the residual) and the output to NCHW
    copies = [n for n in compiled.graph().nodes if n.op == "kernels.call"]
    assert [len(n.results) for n in copies] == [1, 1]
    g = torch.Generator().manual_seed(0)
    x, w1, w2, w3 = (torch.randn(s, generator=g)
                     for s in ([2, 4, 6, 5], [4, 4, 3, 3], [4, 4, 3, 3], [4, 4, 1, 1]))
    x[1, 2, 3, 3] = float("nan")
    r1 = torch.relu(torch.conv2d(x, w1, padding=1) + x)
    want = torch.conv2d(r1, w2, padding=1) + torch.conv2d(r1, w3)
    got = compiled_runner(compiled)(None, [x, w1, w2, w3]).outputs[0]
    assert want.isnan().any()
    torch.testing.assert_close(got, want, equal_nan=True)


CONV_COMPUTED_WEIGHT = """ember.ir 1.0

graph @f(%x: f32[2, 4, 6, 5], %w1: f32[4, 4, 3, 3]) -> (f32[2, 4, 6, 5]) {
  %w = prims.mul(%w1, 2.0) : f32[4, 4, 3, 3]
  %c1 = prims.convolution(%x, %w, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %s1 = prims.add(%x, %c1) : f32[2, 4, 6, 5]
  %r1 = prims.maximum(%s1, 0.0) : f32[2, 4, 6, 5]
  %r2 = prims.minimum(%r1, 6.0) : f32[2, 4, 6, 5]
  return (%r2)
}
"""


def test_residual_and_relu6_on_a_computed_weight_are_one_kernel() -> None:
    """A weight computed in the graph is not packed (loop.conv2d_nhwc): the residual add and
    ReLU6 then run as one kernel after the convolution, NaN kept."""
    compiled = compile_module(parse(CONV_COMPUTED_WEIGHT))
    ops = [n.kwargs.get("op", n.op) for n in compiled.graph().nodes]
    assert ops.count("loop.conv2d_nhwc") == 1 and ops.count("kernels.call") == 3
    g = torch.Generator().manual_seed(0)
    x, w1 = torch.randn(2, 4, 6, 5, generator=g), torch.randn(4, 4, 3, 3, generator=g)
    x[0, 1, 2, 2] = float("nan")
    want = torch.clamp(torch.conv2d(x, w1 * 2, padding=1) + x, 0, 6)
    got = compiled_runner(compiled)(None, [x, w1]).outputs[0]
    torch.testing.assert_close(got, want, equal_nan=True)


@needs_mkldnn
def test_the_wrapper_calls_each_convolution_bound_once_not_the_reference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The generated wrapper binds each packed convolution's attributes when it is made
    (packed.bind via wrapper.register_binder): a call runs the bound function, never the op's
    reference with its per-call attribute checks, and matches eager on every path (oneDNN
    with a ReLU, the small 1x1 matrix product, the residual post-op)."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.c2 = torch.nn.Conv2d(8, 8, 1)
            self.c3 = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn(self.c1(x)))
            out: torch.Tensor = self.c3(self.c2(y)) + y
            return out

    net = Net().eval()
    var = net.bn.running_var
    assert var is not None
    with torch.no_grad():
        var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 6, 6)

    checks = [0]
    operands = packed._operands

    def counted(*a: Any) -> Any:
        checks[0] += 1
        return operands(*a)
    monkeypatch.setattr(packed, "_operands", counted)  # the reference checks on every call
    f = ember_compile(net)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        bound = checks[0]  # type rules, and each convolution bound as the wrapper was made
        torch.testing.assert_close(f(x), net(x))
        assert checks[0] == bound
        status = ember_status(f)
        assert status["compiled_graphs"] == 1 and not status["fallbacks"], status["status"]
    assert [packed.is_cached(c.weight) for c in (net.c1, net.c2, net.c3)] == [True] * 3


def test_bind_refuses_bad_attributes_when_bound() -> None:
    with pytest.raises(OpTypeError, match="scale"):
        packed.bind({**KW, "scale": 1, "bias": False})
    with pytest.raises(OpTypeError, match="silu"):
        packed.bind({**KW, "relu": True, "silu": True})


# CONV_RELU_CONV whose ReLU a kernel also reads: o = c2 + 2 * r
CONV_RELU_CONV_AND_ADD = CONV_RELU_CONV.replace("  return (%c2)", """\
  %s = prims.mul(%r, 2.0) : f32[2, 4, 6, 5]
  %o = prims.add(%c2, %s) : f32[2, 4, 6, 5]
  return (%o)""")


def test_relu_read_by_a_convolution_and_a_kernel_runs_inside_the_extern() -> None:
    """A ReLU a convolution reads is a whole NHWC buffer whoever else reads it (GhostNet's
    primary convolution: its cheap convolution and its concatenation): torch's relu_ in place
    in the extern (NaN kept), and the kernel reads that buffer; no ReLU kernel writes a
    second one."""
    compiled, externs, (x, w1, w2) = _two_convs(CONV_RELU_CONV_AND_ADD)
    assert [(n.kwargs["op"], n.kwargs["relu"]) for n in externs] \
        == [("loop.conv2d_packed", True), ("loop.conv2d_packed", False)]
    r = torch.relu(torch.conv2d(x, w1, padding=1))
    got = compiled_runner(compiled)(None, [x, w1, w2]).outputs[0]
    torch.testing.assert_close(got, torch.conv2d(r, w2) + r * 2, equal_nan=True)
