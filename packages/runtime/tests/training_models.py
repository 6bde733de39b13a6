"""Models that the CUDA training tests train, and their SGD loop, on a GPU (packages/runtime/tests/test_training_cuda.py)
and in its interpreter twin on the CPU (packages/inductor/tests/test_cuda_training_interp.py, at
smaller sizes): a Llama-style block, and a GPT-NeoX from transformers with its next-token loss."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Embedding, RMSNorm, causal sdpa with rotary q/k, SwiGLU (`ff` wide), a vocab head; the
    SwiGLU and head Linears with `bias`, the rotary frequencies on `base`."""

    cos: torch.Tensor  # (buffers)
    sin: torch.Tensor

    def __init__(self, vocab: int = 256, d: int = 128, heads: int = 2, seq: int = 32,
                 ff: int = 344, bias: bool = False, base: float = 10000) -> None:
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ff, bias=bias), nn.Linear(d, ff, bias=bias)
        self.down, self.head = nn.Linear(ff, d, bias=bias), nn.Linear(d, vocab, bias=bias)
        f = torch.outer(torch.arange(seq).float(),
                        1.0 / base ** (torch.arange(0, self.hd, 2).float() / self.hd))
        self.register_buffer("cos", torch.cat([f, f], -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([f, f], -1).sin(), persistent=False)

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, -1)
        return x * self.cos + torch.cat([-b, a], -1) * self.sin

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        b, s, d = x.shape
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        q, k, v = self.qkv(n).view(b, s, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        x = x + self.down(F.silu(self.gate(x)) * self.up(x))
        return self.head(x)  # type: ignore[no-any-return]


def gpt_neox(hidden: int, layers: int, heads: int, ff: int, vocab: int, positions: int) -> Any:
    """transformers' GPTNeoXForCausalLM in training mode: partial rotary (a quarter of each
    head), parallel residual, GELU (the shape of benchmarks/suites.py's case)."""
    import transformers

    cfg = transformers.GPTNeoXConfig(hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=ff,
                                     vocab_size=vocab, max_position_embeddings=positions,
                                     rope_parameters={"rope_type": "default",
                                                      "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.25},
                                     use_parallel_residual=True,
                                     hidden_act="gelu")
    return transformers.GPTNeoXForCausalLM(cfg).train()


def next_token_loss(m: Any, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a causal LM's logits (in f32) against the next tokens."""
    y = m(ids).logits
    return F.cross_entropy(y.reshape(-1, y.shape[-1]).float(), targets.reshape(-1))


Run = tuple[Any, list[torch.Tensor], nn.Module]


def sgd_runs(model: nn.Module, loss: Callable[..., torch.Tensor], args: tuple[Any, ...],
             steps: int, lr: float, compile: Callable[[Any], Any]) -> tuple[Run, Run]:
    """`steps` SGD steps at `lr` of two copies of `model` from its weights, eager's and then
    with its loss function (`loss(model, *args)`) through `compile`: for each, the function,
    its losses (in f32) and the trained copy."""
    runs = []
    for make in (lambda f: f, compile):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=lr)
        fn = make(lambda *a, m=m: loss(m, *a))
        losses = []
        for _ in range(steps):
            y = fn(*args)
            y.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(y.detach().float())
        runs.append((fn, losses, m))
    return runs[0], runs[1]
