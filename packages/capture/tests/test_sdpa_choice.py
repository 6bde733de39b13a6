"""The sdpa kernel capture records is the one real tensors get (capture/sdpa_choice.py).

Found on the H200: for hf/vit's attention (no mask, not causal) sdpa's backend choice said math
under FakeTensorMode where real tensors get cuDNN, so the capture recorded math's decomposition.
The tracer now asks the choice of real tensors of the operands' layout and calls the fused
kernel itself. No GPU here: the CPU is admitted as a device of the rule and the real choice is
set, so the recorded node, its arguments and the decomposed graph's values against eager sdpa
are checked on CPU tensors (the fused CUDA ops run on fake tensors by their meta kernels).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ember.capture.sdpa_choice as sc
from ember.capture import capture
from ember.ir.passes import run_pipeline

CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
OPS = {sc.CUDNN: "aten._scaled_dot_product_cudnn_attention.default",
       sc.EFFICIENT: "aten._scaled_dot_product_efficient_attention.default",
       sc.FLASH: "aten._scaled_dot_product_flash_attention.default"}


def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=0.3) * 2


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True) + 1


def by_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = torch.ops.aten.scaled_dot_product_attention(q, k, v, scale=0.3)
    return out * 2


def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool))


def _captured(fn: Any, args: tuple[torch.Tensor, ...]) -> Any:
    with torch.no_grad():
        c = capture(fn, args, {})
    assert getattr(c, "module", None) is not None, c
    return c.module  # type: ignore[union-attr]


def _ops(m: Any) -> list[str]:
    return [n.op for g in m.graphs.values() for n in g.nodes]


def _qkv() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    # views of [B, L, H, E], as the HF attentions hand them over
    return tuple(torch.randn(2, 16, 4, 8, generator=g).transpose(1, 2) for _ in range(3))


@pytest.fixture
def cpu_as_cuda(monkeypatch: Any) -> dict[str, int]:
    """The rule applies to CPU operands, with the real choice set by the test."""
    want = {"choice": sc.CUDNN}
    monkeypatch.setattr(sc, "DEVICES", ("cpu",))
    monkeypatch.setattr(sc, "real_choice", lambda *a: want["choice"])
    return want


@pytest.mark.parametrize("choice", [sc.CUDNN, sc.EFFICIENT, sc.FLASH],
                         ids=["cudnn", "efficient", "flash"])
@pytest.mark.parametrize("fn", [attn, causal, by_op], ids=["plain", "causal", "aten-op"])
def test_the_real_choice_is_recorded_and_computes_sdpa(cpu_as_cuda: dict[str, int], choice: int,
                                                        fn: Any) -> None:
    cpu_as_cuda["choice"] = choice
    args = _qkv()
    m = _captured(fn, args)
    ops = _ops(m)
    assert OPS[choice] in ops and CPU_FLASH not in ops, ops
    node = next(n for g in m.graphs.values() for n in g.nodes if n.op == OPS[choice])
    given = [a for a in [*node.args, *node.kwargs.values()] if a is True]
    assert given == ([True] if fn is causal else []), node  # is_causal as given, no lse
    # the CUDA form's decomposition (packages/prims) computes what eager's sdpa does
    from ember.ir import Interpreter
    run = Interpreter(run_pipeline(m, "decompose,cse,dce")).run(list(args))
    torch.testing.assert_close(run.outputs[0], attn(*args) if fn is by_op else fn(*args))


def test_a_math_choice_or_a_mask_leaves_sdpa_as_it_was(cpu_as_cuda: dict[str, int]) -> None:
    cpu_as_cuda["choice"] = 0  # math
    assert CPU_FLASH in _ops(_captured(attn, _qkv()))
    cpu_as_cuda["choice"] = sc.CUDNN
    assert not any(op in _ops(_captured(masked, _qkv())) for op in OPS.values())


def test_cpu_operands_keep_the_fake_choice() -> None:
    assert sc.as_real_choice(sc.SDPA, _qkv(), {}) is sc.SDPA
    assert CPU_FLASH in _ops(_captured(attn, _qkv()))
