"""Training on a GPU through the CUDA target (issue 16 item 6): skipped without a CUDA device.

`compile(backend="inductor")` trains the shapes of benchmarks/training.py's cases (an MLP with
cross-entropy, conv + BatchNorm in training mode, a Llama-style block with causal sdpa and
rotary, a small GPT-NeoX from transformers) for three SGD steps against eager from the same
weights, in f32 and bf16: losses, parameters and buffers (BatchNorm's running statistics)
agree, one graph with no fallback, and the attention stays torch's fused kernel both ways
(one extern forward, its backward kernel one extern backward) for each kernel sdpa may pick
(flash, memory-efficient, cuDNN; forced with `sdpa_kernel`). The interpreter twin on the CPU
is packages/inductor/tests/test_cuda_training_interp.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember.runtime as er
from ember.runtime.training import TrainingRunner
from ember.testing.triton_mode import NEEDS_CUDA
from packages.runtime.tests.training_models import Block, gpt_neox, next_token_loss, sgd_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from suites import TrainConvNet  # noqa: E402  (benchmarks/ is on the path now)

pytestmark = NEEDS_CUDA

DEV = "cuda"
# bf16: eager and ember round different intermediates (ember's kernels compute in f32)
TOL = {torch.float32: 1e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]
GRADS = "loop.cuda_attention_grads"
HEADS_LAST = "loop.attention_heads_last"


def train(model: nn.Module, loss: Callable[..., torch.Tensor], args: tuple[Any, ...],
          dtype: torch.dtype, steps: int = 3, lr: float = 1e-2) -> Any:
    """`steps` SGD steps of ember and of eager from the same weights on CUDA tensors in
    `dtype`: losses, parameters and buffers must agree. Returns ember's compiled function."""
    model = model.to(DEV, dtype)
    args = tuple(a.to(DEV, dtype) if a.is_floating_point() else a.to(DEV) for a in args)
    (_, want, me), (fn, got, mc) = sgd_runs(model, loss, args, steps, lr,
                                            lambda f: er.compile(f, backend="inductor"))
    tol = TOL[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for a, b in ((mc.parameters(), me.parameters()), (mc.buffers(), me.buffers())):
        torch.testing.assert_close([x.float() for x in a], [x.float() for x in b], rtol=tol,
                                   atol=tol)
    assert not fn.history.fallbacks, [f"{f.kind}: {f.reason}" for f in fn.history.fallbacks]
    assert len(fn.entries) == 1  # one graph: no break
    return fn


def compiled_pair(fn: Any) -> tuple[Any, Any]:
    """The compiled @forward and @backward (kernels.*) modules of the one training graph."""
    (entry,) = fn.entries
    runner = entry.runner
    assert isinstance(runner, TrainingRunner)
    fwd, bwd = (r.__dict__["compiled"] for r in (runner.forward, runner.backward))
    for m in (fwd, bwd):
        assert m.kernels and {k.lang for k in m.kernels.values()} == {"triton"}
    return fwd, bwd


def externs(m: Any) -> list[str]:
    return [str(n.kwargs.get("op")) for g in m.graphs.values() for n in g.nodes
            if n.op == "kernels.extern"]


def xent(m: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    y = m(x)
    return F.cross_entropy(y.reshape(-1, y.shape[-1]).float(), t.reshape(-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mlp_cross_entropy(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                      nn.Linear(256, 10))
    train(m, xent, (torch.randn(32, 64), torch.randint(0, 10, (32,))), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_conv_batchnorm(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    fn = train(TrainConvNet().train(), xent, (torch.randn(8, 3, 16, 16),
                                             torch.randint(0, 10, (8,))), dtype)
    _, bwd = compiled_pair(fn)
    assert "aten.convolution_backward.default" in externs(bwd)


BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION"}


@pytest.mark.parametrize("kernel", list(BACKENDS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_block_keeps_the_fused_kernel_both_ways(kernel: str, dtype: torch.dtype
                                                          ) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if kernel in ("flash", "cudnn") and dtype == torch.float32:
        pytest.skip(f"{kernel} attention takes f16/bf16 only")
    backend = getattr(SDPBackend, BACKENDS[kernel])
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 32))
    with sdpa_kernel([backend]):
        fn = train(Block(), xent, (ids, torch.roll(ids, -1, 1)), dtype)
    fwd, bwd = compiled_pair(fn)
    assert externs(fwd).count(HEADS_LAST) == 1, externs(fwd)
    (call,) = [n for g in bwd.graphs.values() for n in g.nodes if n.kwargs.get("op") == GRADS]
    assert kernel in str(call.kwargs["kernel"]), call.kwargs["kernel"]


class MaskedAttention(nn.Module):
    """sdpa with a float mask (a padding mask, or a learned bias that needs its gradient)."""

    def __init__(self, learned: bool, d: int = 64, heads: int = 2, seq: int = 24) -> None:
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.bias = nn.Parameter(torch.randn(heads, seq, seq) * 0.1, requires_grad=learned)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.expand(b, -1, -1, -1))
        return self.o(a.transpose(1, 2).reshape(b, s, d))  # type: ignore[no-any-return]


@pytest.mark.parametrize("learned", [False, True])
def test_memory_efficient_attention_with_a_mask(learned: bool) -> None:
    """Rows of 24 elements: the bias is padded to aligned rows for the forward and backward
    kernels; a learned bias gets the kernel's own gradient (grad_input_mask's last entry)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        train(MaskedAttention(learned), lambda m, x: m(x).square().mean(),
              (torch.randn(2, 24, 64),), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpt_neox(dtype: torch.dtype) -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = gpt_neox(hidden=128, layers=2, heads=4, ff=512, vocab=256, positions=64)
    ids = torch.randint(0, 256, (2, 32))
    train(model, next_token_loss, (ids, torch.roll(ids, -1, 1)), dtype)
