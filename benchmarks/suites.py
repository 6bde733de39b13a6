"""The benchmark cases: `micro` (single ops and short chains), `models` (small networks) and
`training` (forward + backward + SGD steps, run by benchmarks/training.py).

Every case builds fresh inputs from a fixed seed; inference models are in eval mode, run under
no_grad, with random weights (HF models from configs, HF_HUB_OFFLINE=1: nothing downloads).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from training import TrainBuilt, TrainCase  # (benchmarks/ is on the path)

from ember.runtime.bench import Case

os.environ.setdefault("HF_HUB_OFFLINE", "1")

Built = tuple[Callable[..., Any], tuple[Any, ...]]
_B = TypeVar("_B")


def _seeded(make: Callable[[], _B]) -> Callable[[], _B]:
    def build() -> _B:
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


# ---- training ----------------------------------------------------------------------------------
# One step = compiled (forward + loss), backward, SGD step (benchmarks/training.py). Small sizes:
# the CPU machine has 2 cores.


def _xent(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def train_mlp() -> TrainBuilt:
    m = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                      nn.Linear(1024, 10))
    return (m, lambda m, x, t: F.cross_entropy(m(x), t),
            (torch.randn(64, 256), torch.randint(0, 10, (64,))))


class TrainConvNet(nn.Module):
    """2 × (conv 3×3, BatchNorm in training mode, ReLU), global average pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))  # type: ignore[no-any-return]


def train_convnet() -> TrainBuilt:
    return (TrainConvNet().train(), lambda m, x, t: F.cross_entropy(m(x), t),
            (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))))


def train_neox() -> TrainBuilt:
    from transformers import GPTNeoXForCausalLM
    m = GPTNeoXForCausalLM(neox_config(layers=2, hidden=128)).train()
    ids = torch.randint(0, 1024, (4, 64))
    # next-token loss on the logits (dropout probabilities are 0 in the config)
    return (m, lambda m, i, t: _xent(m(i).logits, t), (ids, torch.roll(ids, -1, 1)))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.w, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


class LlamaBlock(nn.Module):
    """Pre-norm RMSNorm, causal attention with rotary embeddings, RMSNorm, SwiGLU MLP."""

    def __init__(self, d: int = 256, heads: int = 4, ff: int = 688, seq: int = 64) -> None:
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)
        inv = 1.0 / 10000 ** (torch.arange(0, self.hd, 2).float() / self.hd)
        f = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat([f, f], -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        cos, sin = self.cos[:s], self.sin[:s]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))  # type: ignore[no-any-return]


class TinyLlama(nn.Module):
    def __init__(self, vocab: int = 1024, d: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([LlamaBlock(d) for _ in range(layers)])
        self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


def train_llama() -> TrainBuilt:
    ids = torch.randint(0, 1024, (4, 64))
    return (TinyLlama(), lambda m, i, t: _xent(m(i), t), (ids, torch.roll(ids, -1, 1)))


def _training() -> list[Case | TrainCase]:
    return [
        TrainCase("MLP train", "training", _seeded(train_mlp),
                  "Linear 256→1024→1024→10 with GELU, cross-entropy; batch 64"),
        TrainCase("conv+BN train", "training", _seeded(train_convnet),
                  "2 × (conv 3×3, BatchNorm (training), ReLU), 3→16→32, mean pool, linear, "
                  "cross-entropy; 16×3×32×32"),
        TrainCase("GPT-NeoX train", "training", _seeded(train_neox),
                  "transformers GPTNeoXForCausalLM, 2 layers × 128 hidden, 4 heads, rotary_pct "
                  "0.25, vocab 1024, next-token cross-entropy; batch 4 × seq 64"),
        TrainCase("Llama block train", "training", _seeded(train_llama),
                  "2 Llama-style blocks (RMSNorm, causal SDPA with rotary, SwiGLU 256→688), "
                  "embedding and head, vocab 1024, cross-entropy; batch 4 × seq 64"),
    ]


SUITES: dict[str, Callable[[], list[Any]]] = {"micro": _micro, "models": _models,
                                              "training": _training}
