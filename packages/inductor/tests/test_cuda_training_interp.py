"""Training through the CUDA target, without a GPU (issue 16 item 6; the GPU twin is
packages/runtime/tests/test_training_cuda.py).

`ember.runtime.compile` trains small models with the Triton target in place of the CPU's (its
kernels run in Triton's interpreter, TRITON_INTERPRET=1) and the CUDA target's lowering rules:
torch's fused CUDA attention and its backward kernel as externs, convolution gradients as
`aten.convolution_backward`. Capture records the attention form sdpa dispatches to on a GPU
(the real choice is patched to flash, memory-efficient or cuDNN), and the CUDA kernels, which
have no CPU implementation, get CPU stand-ins in the op registry: the forward's math with a
real logsumexp laid out as each kernel lays it out; the backward's gradients from autograd of
that math, after checking that the output and logsumexp it was handed are the forward's (the
partition saved the right values). Checked against eager over SGD steps: losses, parameters.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.capture.sdpa_choice as sdpa_choice
import ember.inductor  # noqa: F401
import ember.inductor.targets.cuda as cuda
from ember.inductor.targets import FusionHooks, add_target, targets, unregister_target
from ember.inductor.targets.cuda.attention import (
    BACKWARD,
    CUDNN,
    CUDNN_BACKWARD,
    EFFICIENT,
    EFFICIENT_BACKWARD,
    FLASH,
    GRADS,
    HEADS_LAST,
    LOWERINGS,
)
from ember.ir import Graph
from ember.ir.registry import default_registry
from ember.ir.torch_ops import torch_opdef
from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.runtime.tests.training_models import (
    Block,
    gpt_neox,
    next_token_loss,
    sgd_runs,
)

pytestmark = INTERPRETER_ONLY

KERNELS = {"flash": (sdpa_choice.FLASH, FLASH), "efficient": (sdpa_choice.EFFICIENT, EFFICIENT),
           "cudnn": (sdpa_choice.CUDNN, CUDNN)}


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
          causal: bool, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention's output and logsumexp, as the fused kernels define them (top-left causal)."""
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + bias
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def _forward_stand_in(name: str) -> Any:
    real = torch_opdef(name)
    assert real is not None

    def run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
        q, k, v = args[:3]
        bias = None if name == FLASH else args[3]
        at = 4 if name == FLASH else 6
        causal = args[at] if len(args) > at else kw.get("is_causal", False)
        out, lse = _math(q, k, v, bias, causal, kw.get("scale"))
        L, S = q.shape[2], k.shape[2]
        i64 = torch.zeros((), dtype=torch.int64)
        if name == FLASH:
            return (out, lse, L, S, torch.zeros(2, dtype=torch.uint64),
                    torch.zeros((), dtype=torch.uint64), torch.zeros(0))
        if name == EFFICIENT:  # its logsumexp rows are padded to a multiple of 32
            return out, F.pad(lse, (0, -(-L // 32) * 32 - L)), i64, i64
        return out, lse.unsqueeze(-1), L, S, i64, i64.clone()
    return dataclasses.replace(real, reference=run, torch_op=None)


CALLS: list[str] = []


def _backward_stand_in(name: str) -> Any:
    real = torch_opdef(name)
    assert real is not None

    def run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
        g, q, k, v = args[:4]
        mask = [True] * 3
        if name == EFFICIENT_BACKWARD:
            bias, out, lse, mask, causal = args[4], args[5], args[6], args[10], args[11]
        elif name == CUDNN_BACKWARD:
            out, lse, bias, causal = args[4], args[5], args[8], args[14]
        else:
            out, lse, bias, causal = args[4], args[5], None, args[11]
        CALLS.append(name)
        with torch.enable_grad():
            ins = [t.detach().requires_grad_() for t in (q, k, v)]
            b = bias
            if len(mask) > 3 and mask[3]:
                b = bias.detach().requires_grad_()
                ins.append(b)
            o, lse_want = _math(*ins[:3], b, causal, kw.get("scale"))
            # what the forward saved for this call: its output and logsumexp
            torch.testing.assert_close(out, o.detach(), rtol=1e-4, atol=1e-4)
            L = lse_want.shape[-1]
            torch.testing.assert_close(lse.reshape(*lse.shape[:3])[..., :L], lse_want.detach(),
                                       rtol=1e-4, atol=1e-4)
            grads = torch.autograd.grad(o, ins, g)
        return tuple(grads)  # (as declared: no grad_bias result where none was asked)
    return dataclasses.replace(real, reference=run, torch_op=None)


@pytest.fixture
def cuda_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Triton target (interpreted) with the CUDA target's lowering rules in the CPU's
    place, CPU stand-ins for the CUDA attention kernels, all restored after."""
    reg = default_registry()
    ops = (FLASH, EFFICIENT, CUDNN, *BACKWARD)
    for op in ops:
        reg.register((_forward_stand_in if op in (FLASH, EFFICIENT, CUDNN)
                      else _backward_stand_in)(op))
    cpu = targets()["cpu"]
    unregister_target("cpu")
    add_target(dataclasses.replace(
        cpu, pipeline="inductor-cuda-interpret", loader="triton",
        lowerings={**LOWERINGS, **cuda.EXTERNS}, front=cuda.FRONT, fusion=FusionHooks(),
        description="the CUDA target's rules, Triton in the interpreter (a test)"))
    monkeypatch.setattr(sdpa_choice, "DEVICES", ("cuda", "cpu"))
    CALLS.clear()
    try:
        yield
    finally:
        unregister_target("cpu")
        add_target(cpu)
        for op in ops:
            reg.unregister(op)


def _xent(m: nn.Module, ids: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    logits = m(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))


def _train(model: nn.Module, loss: Callable[..., torch.Tensor], args: tuple[Any, ...],
           steps: int = 2) -> tuple[Any, list[torch.Tensor], nn.Module]:
    """`steps` SGD steps of ember (backend inductor) against eager's from the same weights:
    the losses and parameters must agree; returns the compiled function, losses, model."""
    import ember.runtime as er

    (_, want, me), (fn, got, mc) = sgd_runs(
        model, loss, args, steps, 0.1, lambda f: er.compile(f, backend="inductor", dynamic=False))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(list(mc.parameters()), list(me.parameters()), rtol=1e-4,
                               atol=1e-4)
    torch.testing.assert_close(list(mc.buffers()), list(me.buffers()), rtol=1e-4, atol=1e-4)
    return fn, got, mc


def _compiled(fn: Any) -> tuple[Graph, Graph]:
    """The compiled (kernels.*) @forward and @backward graphs of a training compile: one
    graph, no fallback, every loop kernel rendered as Triton."""
    from ember.runtime.training import TrainingRunner

    assert not fn.history.fallbacks, [f"{f.kind}: {f.reason}" for f in fn.history.fallbacks]
    (entry,) = fn.entries
    runner = entry.runner
    assert isinstance(runner, TrainingRunner)
    out = []
    for run in (runner.forward, runner.backward):
        m = run.__dict__["compiled"]
        assert m.kernels and {k.lang for k in m.kernels.values()} == {"triton"}
        assert not [n.op for g in m.graphs.values() for n in g.nodes
                    if n.op.startswith("loop.")]
        out.append(m.graph())
    return out[0], out[1]


def _externs(g: Graph) -> list[str]:
    return [str(n.kwargs.get("op")) for n in g.nodes if n.op == "kernels.extern"
            and n.kwargs.get("op") not in ("loop.view", "prims.reshape")]


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_attention_trains_through_its_backward_kernel(cuda_on_cpu: None,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      kernel: str) -> None:
    choice, op = KERNELS[kernel]
    monkeypatch.setattr(sdpa_choice, "real_choice", lambda *a, **k: choice)
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (2, 8))
    model = Block(vocab=32, d=32, seq=8, ff=48, bias=True, base=100)  # the GPU test's, smaller
    fn, _, _ = _train(model, _xent, (ids, torch.roll(ids, -1, 1)))
    fwd, bwd = _compiled(fn)
    # kept whole both ways: the fused kernel forward, its backward kernel backward (no score
    # matrix, no softmax); the backward's gradients of heads-last q/k/v read as they are
    assert _externs(fwd).count(HEADS_LAST) == 1
    assert _externs(bwd).count(GRADS) == 1
    (call,) = [n for n in bwd.nodes if n.kwargs.get("op") == GRADS]
    assert call.kwargs["kernel"] == op.replace(".default", "_backward.default")
    assert call.kwargs["heads_last"] == [False, False, True]  # v: a view of the qkv GEMM
    # one backward kernel call per step, the forward's output and logsumexp handed to it
    assert CALLS == [op.replace(".default", "_backward.default")] * 2


def test_mlp_cross_entropy_trains_in_triton_kernels(cuda_on_cpu: None) -> None:
    """The CE rewrite's kernels (lse(x) - x[t] forward, one pass backward) and GELU's, as
    Triton: no extern but the GEMMs and the pick of each row's target (torch's gather)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))
    fn, _, _ = _train(model, lambda m, x, t: F.cross_entropy(m(x), t),
                      (torch.randn(8, 16), torch.randint(0, 10, (8,))))
    fwd, bwd = _compiled(fn)
    assert set(_externs(fwd)) | set(_externs(bwd)) <= {"prims.matmul", "prims.gather"}


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))  # type: ignore[no-any-return]


def test_conv_batchnorm_trains_with_triton_reductions(cuda_on_cpu: None) -> None:
    """BatchNorm in training mode: its batch statistics and the backward's reductions are
    Triton kernels, the convolution gradients torch's backward kernel (an extern); the running
    statistics are written back as eager's."""
    torch.manual_seed(0)
    model = ConvBN().train()
    fn, _, mc = _train(model, lambda m, x, t: F.cross_entropy(m(x), t),
                       (torch.randn(4, 3, 6, 6), torch.randint(0, 5, (4,))))
    fwd, bwd = _compiled(fn)
    assert "aten.convolution_backward.default" in _externs(bwd)
    bn = mc.body[1]
    assert isinstance(bn, nn.BatchNorm2d) and int(bn.num_batches_tracked) == 2


def test_gpt_neox_trains_with_the_efficient_kernel(cuda_on_cpu: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-NeoX (transformers, partial rotary, parallel residual) in f32: on the H200 its sdpa
    is the memory-efficient kernel, which training used to decompose (no VJP rule)."""
    pytest.importorskip("transformers")
    monkeypatch.setattr(sdpa_choice, "real_choice", lambda *a, **k: sdpa_choice.EFFICIENT)
    torch.manual_seed(0)
    model = gpt_neox(hidden=32, layers=1, heads=2, ff=64, vocab=64, positions=16)
    ids = torch.randint(0, 64, (2, 8))
    fn, _, _ = _train(model, next_token_loss, (ids, torch.roll(ids, -1, 1)), steps=1)
    fwd, bwd = _compiled(fn)
    assert _externs(fwd).count(HEADS_LAST) == 1 and _externs(bwd).count(GRADS) == 1
    assert CALLS == [EFFICIENT_BACKWARD]


@pytest.fixture
def cuda_target() -> Iterator[None]:
    """The cuda target registered for one test (code generation only: nothing runs)."""
    had = targets().get("cuda") is not None
    cuda.register_cuda_target()
    yield
    if not had:
        unregister_target("cuda")


def test_backward_bias_rows_are_aligned_as_the_forwards(cuda_target: None) -> None:
    """The memory-efficient backward reads the bias as the forward does: rows of 7 elements
    padded to 16 (the kernel refuses unaligned rows), then sliced back; its gradient of the
    bias comes back as a plain buffer, q/k/v's of contiguous operands too."""
    from ember.ir import parse
    from ember.ir.passes import run_pipeline

    t, kv, b = "f32[1, 2, 4, 8]@cuda:0", "f32[1, 2, 7, 8]@cuda:0", "f32[1, 2, 4, 7]@cuda:0"
    text = (f"ember.ir 1.0\n\ngraph @b(%g: {t}, %q: {t}, %k: {kv}, %v: {kv}, %bias: {b}, "
            f"%o: {t}, %l: f32[1, 2, 32]@cuda:0, %s: i64[]@cuda:0, %t: i64[]@cuda:0) -> "
            f"({t}, {kv}, {kv}, {b}) {{\n"
            f"  %dq, %dk, %dv, %db = {EFFICIENT_BACKWARD}(%g, %q, %k, %v, %bias, %o, %l, %s, "
            f"%t, 0.0, [true, true, true, true], false) : ({t}, {kv}, {kv}, {b})\n"
            f"  return (%dq, %dk, %dv, %db)\n}}\n")
    m = run_pipeline(parse(text), f"{cuda.FRONT},inductor-cuda")
    nodes = [n for g in m.graphs.values() for n in g.nodes]
    (call,) = [n for n in nodes if n.kwargs.get("op") == GRADS]
    assert call.kwargs["kernel"] == EFFICIENT_BACKWARD
    assert call.kwargs["heads_last"] == [False, False, False]
    bias = call.args[4]
    assert bias.node is not None and bias.node.kwargs.get("op") == "loop.view"  # type: ignore[union-attr]
    src = bias.node.args[0]  # type: ignore[union-attr]
    assert src.type.shape[-1] == 16  # the padded rows the view slices back to 7
    assert [n.kwargs.get("op") for n in nodes if n.op == "kernels.extern"].count(GRADS) == 1
