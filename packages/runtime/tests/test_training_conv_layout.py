"""Convolution training on the CPU channels-last end to end: the forward saves each convolution's
output as its NHWC buffer (autograd/layout.py: no transposing copy), the backward's BatchNorm
and ReLU chains run on NHWC tensors, and the convolution gradients are
`loop.conv2d_backward_nhwc` externs on NHWC buffers (inductor/targets/cpu/conv_backward.py),
with torch's gradients."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.targets.cpu.conv_backward import BACKWARD_OP
from ember.ir import TensorType, Value, default_registry
from ember.ir.passes import run_pipeline


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4),
                                  nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(6), nn.ReLU())
        self.head = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))  # type: ignore[no-any-return]


def _plan() -> Any:
    from ember.capture import Captured, capture
    from ember.runtime.training import plan_training
    from ember.runtime.writeback import backend_module

    torch.manual_seed(0)
    m = _Net()
    x = torch.randn(4, 3, 5, 7)
    cap = capture(m, (x,), {})
    assert isinstance(cap, Captured), cap
    no_grad = {u.result for u in cap.updates if not u.grad}
    return plan_training(backend_module(cap), cap.input_examples, no_grad)


def test_convolution_outputs_are_saved_nhwc_and_the_backward_runs_nhwc() -> None:
    plan = _plan()
    fwd, bwd = plan.forward.graph(), plan.backward.graph()
    saved = fwd.outputs[len(fwd.outputs) - plan.n_saved:]
    nhwc = [v for v in saved if v.node is not None and v.node.op == "prims.permute"
            and v.node.kwargs["dims"] == [0, 2, 3, 1]
            and isinstance(v.node.args[0], Value) and v.node.args[0].node is not None
            and v.node.args[0].node.op == "prims.convolution"]
    assert len(nhwc) == 2, [str(v.type) for v in saved]
    # the backward's parameters for them are [N, H, W, C] (the images are 5 x 7)
    assert sorted(list(p.type.shape) for p in bwd.params[:plan.n_saved]
                  if isinstance(p.type, TensorType) and p.type.rank == 4
                  and p.type.shape[0] == 4 and p.type.shape[1] != 3) == [[4, 5, 7, 4], [4, 5, 7, 6]]
    # every full-size pointwise value of the backward is NHWC ([4, 5, 7, C])
    full = [n for n in bwd.nodes if n.op.startswith("prims.") and n.op != "prims.permute"
            and any(isinstance(r.type, TensorType) and r.type.rank == 4 for r in n.results)]
    assert full and all(r.type.shape[1:3] == (5, 7) for n in full for r in n.results), \
        [str(n.results[0].type) for n in full if n.results[0].type.shape[1:3] != (5, 7)]


def test_the_cpu_target_lowers_convolution_gradients_channels_last() -> None:
    plan = _plan()
    fwd = run_pipeline(plan.forward, "inductor-cpu")
    bwd = run_pipeline(plan.backward, "inductor-cpu")
    g = bwd.graph()
    calls = [n for n in g.nodes if n.kwargs.get("op") == BACKWARD_OP]
    assert sorted(str(n.kwargs["mask"]) for n in calls) == \
        ["[False, True]", "[False, True]", "[True, False]"]
    assert not [n for n in g.nodes if n.kwargs.get("op") == "aten.convolution_backward.default"]
    # the second BatchNorm+ReLU's backward writes one full-size buffer, the cotangent the
    # convolution gradients take; its masked cotangent (one full-size read plus per-channel
    # vectors) is recomputed by its readers (fuse rule 5), not written too
    full = [n for n in g.nodes if n.op == "kernels.call" and any(
        isinstance(r.type, TensorType) and list(r.type.shape) == [4, 5, 7, 6]
        for r in n.results)]
    assert len(full) == 1, [r.name for n in full for r in n.results]
    # the forward returns the convolutions' NHWC buffers as they are (no copy kernel)
    f = fwd.graph()
    saved = f.outputs[len(f.outputs) - plan.n_saved:]
    assert sum(1 for v in saved if v.node is not None
               and v.node.kwargs.get("op") == "loop.conv2d_packed") == 2


CASES = st.tuples(st.integers(1, 3), st.sampled_from([1, 2]), st.integers(1, 3),
                  st.integers(3, 7), st.integers(3, 7), st.sampled_from([1, 3]),
                  st.integers(1, 2), st.integers(0, 1), st.integers(1, 2),
                  st.sampled_from([[True, False], [False, True], [True, True]]))


@settings(max_examples=25)
@given(CASES)
def test_conv2d_backward_nhwc_is_torchs_gradient(case: tuple[Any, ...]) -> None:
    n, groups, cin, h, w, k, stride, pad, dil, mask = case
    cout = 2 * groups
    g = torch.Generator().manual_seed(h * 7 + w)
    x = torch.randn(n, cin * groups, h, w, generator=g, requires_grad=True)
    wt = torch.randn(cout, cin, k, k, generator=g, requires_grad=True)
    kw = {"stride": [stride] * 2, "padding": [pad] * 2, "dilation": [dil] * 2,
          "groups": groups}
    if (h + 2 * pad - dil * (k - 1) - 1) < 0 or (w + 2 * pad - dil * (k - 1) - 1) < 0:
        return  # no output pixel
    y = F.conv2d(x, wt, None, kw["stride"], kw["padding"], kw["dilation"], groups)
    ct = torch.randn(y.shape, generator=g)
    want = torch.autograd.grad(y, [x, wt], ct)
    op = default_registry().lookup(BACKWARD_OP)
    assert op is not None
    got = op.reference(None, [ct.permute(0, 2, 3, 1).contiguous(),  # type: ignore[arg-type]
                              x.detach().permute(0, 2, 3, 1).contiguous(), wt.detach()],
                       {**kw, "mask": mask})
    got = list(got) if isinstance(got, tuple) else [got]
    exp = [want[0].permute(0, 2, 3, 1)] if mask[0] else []
    exp += [want[1]] if mask[1] else []
    torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5)


def test_a_saved_convolution_input_is_saved_nhwc_too() -> None:
    # save-all keeps the ReLU output the second convolution reads: conv-nhwc writes it NHWC for
    # the convolution, so it is saved as that buffer's NHWC permute as well
    from ember.capture import Captured, capture
    from ember.runtime.training import plan_training
    from ember.runtime.writeback import backend_module

    torch.manual_seed(0)
    cap = capture(_Net(), (torch.randn(4, 3, 5, 7),), {})
    assert isinstance(cap, Captured), cap
    no_grad = {u.result for u in cap.updates if not u.grad}
    plan = plan_training(backend_module(cap), cap.input_examples, no_grad, partitioner="save-all")
    fwd = plan.forward.graph()
    conv_inputs = {n.args[0] for n in fwd.nodes if n.op == "prims.convolution"}
    saved = fwd.outputs[len(fwd.outputs) - plan.n_saved:]
    nhwc = {v.node.args[0] for v in saved if v.node is not None and v.node.op == "prims.permute"
            and v.node.kwargs["dims"] == [0, 2, 3, 1]}
    assert len(conv_inputs & nhwc) == 1  # the first convolution's input is the batch itself
