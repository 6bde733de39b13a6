"""The benchmark cases: `micro` (single ops and short chains) and `models` (small networks).

Every case builds fresh inputs from a fixed seed; models are in eval mode, run under no_grad,
with random weights (HF models from configs, HF_HUB_OFFLINE=1: nothing downloads).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.runtime.bench import Case

os.environ.setdefault("HF_HUB_OFFLINE", "1")

Built = tuple[Callable[..., Any], tuple[Any, ...]]


def _seeded(make: Callable[[], Built]) -> Callable[[], Built]:
    def build() -> Built:
        torch.manual_seed(0)
        return make()
    return build


# ---- micro -------------------------------------------------------------------------------------


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    """11 pointwise ops."""
    y = torch.sin(x) * 1.5 + 0.25
    y = torch.cos(y) * torch.exp(y * 0.1)
    y = torch.tanh(y - 0.5) * 2.0
    return torch.sigmoid(y) + x


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def layernorm_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1)


def col_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=0)


def row_var(x: torch.Tensor) -> torch.Tensor:
    return x.var(dim=-1)


def _micro() -> list[Case]:
    big = (4096, 4096)
    return [
        Case("pointwise chain", "micro",
             _seeded(lambda: (pointwise_chain, (torch.randn(4 * 2**20),))),
             "11 pointwise ops (sin, mul, add, cos, mul, exp, mul, sub, tanh, mul, sigmoid, "
             "add: one fused loop) on 4M f32"),
        Case("softmax", "micro", _seeded(lambda: (softmax, (torch.randn(*big),))),
             "softmax over the last dim of 4096×4096 f32"),
        Case("layernorm+gelu", "micro",
             _seeded(lambda: (layernorm_gelu, (torch.randn(4096, 1024), torch.randn(1024),
                                               torch.randn(1024)))),
             "F.gelu(F.layer_norm(x)) on 4096×1024 f32 with weight and bias"),
        Case("sum rows", "micro", _seeded(lambda: (row_sum, (torch.randn(*big),))),
             "x.sum(-1) on 4096×4096 f32", rtol=1e-4, atol=1e-3),
        Case("mean cols", "micro", _seeded(lambda: (col_mean, (torch.randn(*big),))),
             "x.mean(0) on 4096×4096 f32"),
        Case("var rows", "micro", _seeded(lambda: (row_var, (torch.randn(*big),))),
             "x.var(-1) on 4096×4096 f32"),
        Case("call overhead", "micro",
             _seeded(lambda: (nn.Sequential(*[nn.Linear(8, 8) for _ in range(5)]).eval(),
                              (torch.randn(2, 8),))),
             "5 × nn.Linear(8, 8) on 2×8: the per-call cost (guards, launch) dominates"),
    ]


# ---- models ------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(1024, 4096), nn.Linear(4096, 1024), \
            nn.LayerNorm(1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(F.gelu(self.up(x))))  # type: ignore[no-any-return]


class ConvNet(nn.Module):
    """3 blocks of conv 3×3 + BatchNorm + ReLU."""

    def __init__(self) -> None:
        super().__init__()
        chans = [3, 32, 64, 64]
        self.body = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b),
                          nn.ReLU()) for a, b in zip(chans, chans[1:], strict=False)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


def convnet() -> Built:
    m = ConvNet().eval()
    for mod in m.modules():  # non-trivial running statistics, so BN is not the identity
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m, (torch.randn(32, 3, 64, 64),)


def neox_config(layers: int = 4, hidden: int = 256) -> Any:
    """dolly-v2's architecture (GPT-NeoX with parallel residual, rotary on a quarter of each
    head), small."""
    from transformers import GPTNeoXConfig
    return GPTNeoXConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                         intermediate_size=4 * hidden, vocab_size=1024,
                         max_position_embeddings=512, rotary_pct=0.25,
                         use_parallel_residual=True, hidden_act="gelu")


def gpt_neox() -> Built:
    from transformers import GPTNeoXForCausalLM
    m = GPTNeoXForCausalLM(neox_config()).eval()
    return m, (torch.randint(0, 1024, (4, 128)),)


def tiny_bert() -> Built:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=512, vocab_size=1024, max_position_embeddings=256)
    m = BertModel(cfg).eval()
    return m, (torch.randint(0, 1024, (4, 128)),)


def _models() -> list[Case]:
    tol = {"rtol": 1e-3, "atol": 1e-3}
    return [
        Case("MLP", "models", _seeded(lambda: (MLP().eval(), (torch.randn(64, 1024),))),
             "Linear 1024→4096, GELU, Linear 4096→1024, residual, LayerNorm; batch 64", **tol),
        Case("GPT-NeoX", "models", _seeded(gpt_neox),
             "transformers GPTNeoXForCausalLM, 4 layers × 256 hidden, 4 heads, rotary_pct 0.25, "
             "parallel residual, vocab 1024; batch 4 × seq 128", **tol),
        Case("conv net", "models", _seeded(convnet),
             "3 × (conv 3×3, BatchNorm, ReLU), 3→32→64→64 channels, on 32×3×64×64", **tol),
        Case("tiny BERT", "models", _seeded(tiny_bert),
             "transformers BertModel, 2 layers × 128 hidden, 2 heads; batch 4 × seq 128", **tol),
    ]


SUITES: dict[str, Callable[[], list[Case]]] = {"micro": _micro, "models": _models}
