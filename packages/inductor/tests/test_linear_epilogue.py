"""The packed linear's epilogue (targets/cpu/linear_epilogue.py): the bias add and a GELU after
the product are oneDNN's bias and post-op inside `loop.linear_packed`, where nothing else
reads what they fold; every other case keeps its kernels. Results match eager."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import linear, packed
from ember.ir import parse
from ember.runtime.bench import ember_status
from ember.runtime.compile import compile as ember_compile
from packages.inductor.tests.test_linear_packed import Conv1D

needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="oneDNN's packed weights need mkldnn")

_HEAD = """ember.ir 1.0

graph @f(%x: f32[256, 64], %w: f32[96, 64], %b: f32[96], %c: f32[48]) -> ({outs}) {{
  %wt = prims.permute(%w, dims=[1, 0]) : f32[64, 96]
  %y = prims.matmul(%x, %wt) : f32[256, 96]
  %bb = prims.broadcast_in_dim(%b, shape=[256, 96], broadcast_dims=[1]) : f32[256, 96]
"""
T = "f32[256, 96]"
T3 = "f32[4, 64, 96]"
# aten.gelu's erf decomposition, on the reshaped [4, 64, 96] sum (256x64x96: 1.6M
# multiply-adds, a product large enough to take its GELU)
GELU_ERF = """  %z = prims.add(%bb, %y) : f32[256, 96]
  %u = prims.reshape(%z, shape=[4, 64, 96]) : f32[4, 64, 96]
  %g1 = prims.mul(%u, 0.7071067811865476) : f32[4, 64, 96]
  %g2 = prims.erf(%g1) : f32[4, 64, 96]
  %g3 = prims.add(1, %g2) : f32[4, 64, 96]
  %g4 = prims.mul(%u, 0.5) : f32[4, 64, 96]
  %g = prims.mul(%g4, %g3) : f32[4, 64, 96]
"""
# GPT-2's NewGELUActivation as captured (its operands in its own order)
GELU_NEW = """  %z = prims.add(%y, %bb) : f32[256, 96]
  %g0 = prims.mul(%z, 0.5) : f32[256, 96]
  %c1 = prims.mul(%z, %z) : f32[256, 96]
  %c2 = prims.mul(%c1, %z) : f32[256, 96]
  %c3 = prims.mul(%c2, 0.044715) : f32[256, 96]
  %c4 = prims.add(%z, %c3) : f32[256, 96]
  %c5 = prims.mul(%c4, 0.7978845608028654) : f32[256, 96]
  %c6 = prims.tanh(%c5) : f32[256, 96]
  %c7 = prims.add(%c6, 1.0) : f32[256, 96]
  %g = prims.mul(%g0, %c7) : f32[256, 96]
"""


def _case(body: str, outs: list[tuple[str, str]]) -> str:
    return _HEAD.format(outs=", ".join(t for _, t in outs)) + body \
        + f"  return ({', '.join('%' + v for v, _ in outs)})\n}}\n"


def _eager(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, c: torch.Tensor
           ) -> dict[str, torch.Tensor]:
    z = F.linear(x, w, b)
    return {"y": x @ w.T, "z": z, "g_erf": F.gelu(z).reshape(4, 64, 96),
            "g_new": 0.5 * z * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                                 * (z + 0.044715 * torch.pow(z, 3.0)))),
            "relu": torch.relu(z), "twice": z * 2 + (x @ w.T),
            "split": (x @ w.T).reshape(512, 48) + c}


CASES = {
    # the bias and the GELU are the extern's; no kernel is left but, where the GELU is
    # returned as [4, 64, 96], the copy of the extern's [256, 96] result into that output (as
    # for a reshaped product without a bias)
    "gelu_erf": (_case(GELU_ERF, [("g", T3)]), {"bias": True, "act": "gelu"}, 1, ["g_erf"]),
    # the tanh GELU stays a kernel (oneDNN's post-op measured no faster), the bias is folded
    "gelu_new": (_case(GELU_NEW, [("g", T)]), {"bias": True}, 1, ["g_new"]),
    # the bias alone where the sum is an output
    "bias": (_case("  %z = prims.add(%bb, %y) : f32[256, 96]\n", [("z", T)]), {"bias": True},
             0, ["z"]),
    # a ReLU stays a kernel (not an activation the extern takes), the bias is folded
    "relu": (_case("  %z = prims.add(%bb, %y) : f32[256, 96]\n"
                   "  %r = prims.maximum(%z, 0) : f32[256, 96]\n", [("r", T)]), {"bias": True},
             1, ["relu"]),
    # the product read twice: nothing folded
    "read_twice": (_case("  %z = prims.add(%bb, %y) : f32[256, 96]\n"
                         "  %z2 = prims.mul(%z, 2) : f32[256, 96]\n"
                         "  %t = prims.add(%z2, %y) : f32[256, 96]\n", [("t", T)]), {}, 1,
                   ["twice"]),
    # the GELU's input is an output too: the bias is folded, the GELU stays a kernel
    "gelu_input_out": (_case(GELU_ERF, [("g", T3), ("z", T)]), {"bias": True}, 1,
                       ["g_erf", "z"]),
    # the bias added after a reshape that keeps the rows (a matmul of a 3-d x), then the GELU
    "bias_after_reshape": (_case(
        "  %u = prims.reshape(%y, shape=[4, 64, 96]) : f32[4, 64, 96]\n"
        "  %bu = prims.broadcast_in_dim(%b, shape=[4, 64, 96], broadcast_dims=[2])"
        " : f32[4, 64, 96]\n"
        "  %z3 = prims.add(%u, %bu) : f32[4, 64, 96]\n"
        + GELU_ERF.split("\n", 2)[2].replace("%u", "%z3"), [("g", T3)]),
        {"bias": True, "act": "gelu"}, 1, ["g_erf"]),
    # a reshape that splits the rows ([256, 96] as [512, 48]): a [48] vector is no bias
    "split_rows": (_case(
        "  %u = prims.reshape(%y, shape=[512, 48]) : f32[512, 48]\n"
        "  %bu = prims.broadcast_in_dim(%c, shape=[512, 48], broadcast_dims=[1]) : f32[512, 48]\n"
        "  %z3 = prims.add(%u, %bu) : f32[512, 48]\n", [("z3", "f32[512, 48]")]), {}, 1,
        ["split"]),
    # the product itself an output: nothing folded
    "product_out": (_case(GELU_ERF, [("g", T3), ("y", T)]), {}, 1, ["g_erf", "y"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_the_packed_linear_folds(case: str) -> None:
    text, attrs, kernels, refs = CASES[case]
    compiled = compile_module(parse(text))
    nodes = compiled.graph().nodes
    ext = [n for n in nodes if n.op == "kernels.extern" and n.kwargs["op"] == linear.LINEAR_OP]
    assert len(ext) == 1
    assert {k: v for k, v in ext[0].kwargs.items() if k in ("bias", "act")} == attrs
    assert sum(n.op == "kernels.call" for n in nodes) == kernels
    g = torch.Generator().manual_seed(0)
    x, w, b, c = (torch.randn(s, generator=g) for s in ([256, 64], [96, 64], [96], [48]))
    got = compiled_runner(compiled)(None, [x, w, b, c]).outputs
    ref = _eager(x, w, b, c)
    for a, r in zip(got, refs, strict=True):
        torch.testing.assert_close(a, ref[r])


COLUMN_ADD = """ember.ir 1.0

graph @f(%x: f32[256, 64], %w: f32[96, 64], %b: f32[96]) -> (f32[256, 96]) {
  %wt = prims.permute(%w, dims=[1, 0]) : f32[64, 96]
  %y = prims.matmul(%x, %wt) : f32[256, 96]
  %bb = prims.broadcast_in_dim(%b, shape=[256, 96], broadcast_dims=[0]) : f32[256, 96]
  %z = prims.add(%bb, %y) : f32[256, 96]
  return (%z)
}
"""


def test_only_a_row_broadcast_of_a_vector_is_the_bias() -> None:
    """A vector of one value per row (broadcast_dims=[0]) is no bias: the add stays a
    kernel."""
    text = COLUMN_ADD.replace("%b: f32[96]", "%b: f32[256]")
    compiled = compile_module(parse(text))
    ext = [n for n in compiled.graph().nodes if n.op == "kernels.extern"
           and n.kwargs["op"] == linear.LINEAR_OP]
    assert len(ext) == 1 and "bias" not in ext[0].kwargs
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g) for s in ([256, 64], [96, 64], [256]))
    got = compiled_runner(compiled)(None, [x, w, b]).outputs[0]
    torch.testing.assert_close(got, x @ w.T + b[:, None])


def test_a_small_product_keeps_its_gelu_kernel() -> None:
    """Below SMALL_LINEAR the call is addmm (the bias is taken) and the GELU stays the kernel
    (eager's GELU in the call would cost a torch call)."""
    text = _case(GELU_ERF, [("g", T3)])
    for big, small in (("4, 64, 96", "2, 8, 12"), ("256", "16"), ("64", "8"), ("96", "12")):
        text = text.replace(big, small)
    compiled = compile_module(parse(text))
    nodes = compiled.graph().nodes
    ext = [n for n in nodes if n.op == "kernels.extern" and n.kwargs["op"] == linear.LINEAR_OP]
    assert [(n.kwargs.get("bias"), n.kwargs.get("act")) for n in ext] == [(True, None)]
    assert sum(n.op == "kernels.call" for n in nodes) == 1
    g = torch.Generator().manual_seed(0)
    x, w, b, c = (torch.randn(s, generator=g) for s in ([16, 8], [12, 8], [12], [48]))
    got = compiled_runner(compiled)(None, [x, w, b, c]).outputs[0]
    torch.testing.assert_close(got, F.gelu(F.linear(x, w, b)).reshape(2, 8, 12))


_ACTS = {None: lambda y: y, "gelu": F.gelu}


@needs_mkldnn
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 200), n=st.integers(1, 200),
       bias=st.booleans(), act=st.sampled_from([None, "gelu"]),
       kn=st.booleans(), scale=st.sampled_from([0.05, 1.0, 30.0]), seed=st.integers(0, 99))
def test_the_call_matches_eager(m: int, k: int, n: int, bias: bool, act: str | None, kn: bool,
                                scale: float, seed: int) -> None:
    """The bound call (oneDNN's linear with its bias and post-op on the packed weight from
    1M multiply-adds, addmm and eager's GELU below), over drawn shapes, weight scales and kn:
    its epilogue is eager's bias add and GELU on the same product (bitwise on the packed
    path; the fallback's addmm rounds the bias add into the product);
    the whole is eager's linear and GELU within the defaults where outputs are of unit
    scale (at 30x, the two GEMMs' different summation orders alone exceed atol=1e-5).
    At 1 thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # SMALL_LINEAR's rule (by thread count: test_linear_packed)
    try:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(m, k, generator=g)
        w = torch.nn.Parameter(torch.randn(n, k, generator=g) * scale / math.sqrt(k),
                               requires_grad=False)
        b = torch.randn(n, generator=g) if bias else None
        kw = {"kn": True} if kn else {}
        call = linear.bind({**kw, **({"bias": True} if bias else {}),
                            **({"act": act} if act else {})})
        wk = torch.nn.Parameter(w.detach().t().contiguous(), requires_grad=False) if kn else w
        got = call(x, wk) if b is None else call(x, wk, b)
        product = linear.bind(kw)(x, wk)
        same = _ACTS[act](product if b is None else product + b)
        big = m * k * n >= linear.SMALL_LINEAR
        if big:
            assert torch.equal(got, same)
        else:
            torch.testing.assert_close(got, same)
        if scale <= 1:
            torch.testing.assert_close(got, _ACTS[act](F.linear(x, w, b)))
        assert packed.is_cached(wk) == big
        packed._PACKS.pop(id(wk), None)
    finally:
        torch.set_num_threads(before)


@needs_mkldnn
def test_the_fallbacks_are_eager_addmm_and_gelu() -> None:
    """Where oneDNN does not serve (a small product, a non-contiguous x, a weight that is no
    Parameter), the call is torch.addmm and eager's GELU: bitwise eager's F.linear + GELU."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 128, generator=g), requires_grad=False)
    b = torch.randn(256, generator=g)
    call = linear.bind({"bias": True, "act": "gelu"})
    for x, wt in [(torch.randn(8, 128, generator=g), w),  # 0.26M multiply-adds
                  (torch.randn(128, 64, generator=g).t(), w),  # not contiguous
                  (torch.randn(64, 128, generator=g), w.detach().clone())]:  # no Parameter
        packed._PACKS.pop(id(wt), None)
        assert torch.equal(call(x, wt, b), F.gelu(F.linear(x, wt, b)))
        assert not packed.is_cached(wt)


@needs_mkldnn
def test_a_compiled_mlp_folds_and_matches_eager() -> None:
    """A BERT-like block (linear, GELU, linear, residual, LayerNorm) and GPT-2's MLP (Conv1D,
    NewGELU): each linear takes its bias, the Block's first its GELU (NewGELU's tanh form
    stays a kernel); outputs match eager, and an
    in-place weight update is picked up."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(256, 512)
            self.b = torch.nn.Linear(512, 256)
            self.ln = torch.nn.LayerNorm(256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ln(x + self.b(F.gelu(self.a(x))))

    class GPT2MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.proj = Conv1D(256, 512), Conv1D(512, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)  # NewGELUActivation
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                            * (h + 0.044715 * torch.pow(h, 3.0))))
            return self.proj(h)

    x = torch.randn(2, 64, 256)
    for net in (Block().eval(), GPT2MLP().eval()):
        f = ember_compile(net)
        with torch.no_grad():
            torch.testing.assert_close(f(x), net(x))
            status = ember_status(f)
            assert status["compiled_graphs"] == 1 and not status["fallbacks"], status["status"]
            first = next(m for m in net.modules() if hasattr(m, "bias"))
            first.bias.mul_(-1)
            first.weight.mul_(0.5)
            torch.testing.assert_close(f(x), net(x))
