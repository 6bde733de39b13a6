"""Corpus, part 2: nn.Modules and torch APIs, compiled with backend="eager" and compared with
eager on outputs, module state and gradients. Every case must capture one graph, no fallback."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.runtime.testing import check_against_eager


class MLP(nn.Module):
    def __init__(self, sizes=(4, 8, 3), act=nn.ReLU):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.act = act()

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.conv(x))))


class Residual(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.scale = 0.5

    def forward(self, x):
        return x + self.scale * self.ff(self.norm(x))


class Attention(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        if mask is not None:
            att = att.masked_fill(mask, float("-inf"))
        y = att.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class SDPA(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.proj = nn.Linear(d, 3 * d)

    def forward(self, x):
        q, k, v = self.proj(x).unsqueeze(1).chunk(3, -1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.register_buffer("pos", torch.arange(5.0).unsqueeze(-1))

    def forward(self, ids):
        return self.emb(ids) + self.pos[: ids.shape[-1]]


class TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        y = self.drop(self.lin(x))
        if self.training:
            return y * 2
        return y - 1


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({f"head_{i}": nn.Linear(4, 2) for i in range(3)})

    def forward(self, x):
        return {name: self.heads[f"head_{i}"](x) for i, name in enumerate(["a", "b", "c"])}


class DirectParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.bias = nn.Parameter(torch.zeros(4))
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(2)])

    def forward(self, x):
        y = x @ self.weight.t() + self.bias
        for p in self.plist:
            y = y * p
        return y + self.plist[0]


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return self.lin(x) * scale


class Derived(Base):
    def forward(self, x, scale=2.0, *, shift=0.0):
        return super().forward(x, scale=scale) + shift


class WithKwargs(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Derived()

    def forward(self, x, **opts):
        return self.inner(x, **opts), self.inner(x, shift=1.0)


@dataclasses.dataclass
class ModelOut:
    logits: torch.Tensor
    hidden: tuple[torch.Tensor, ...]


class ReturnsDataclass(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 2)

    def forward(self, x):
        h = self.a(x).tanh()
        return ModelOut(self.b(h), (x, h))


class PropertyModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @property
    def out_features(self):
        return self.lin.out_features

    def forward(self, x):
        return self.lin(x).view(-1, self.out_features)


class NoGradInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.frozen = nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            target = self.frozen(x)
        return F.mse_loss(self.lin(x), target)


class LoopRNN(nn.Module):
    """A GRU-like cell unrolled over time in Python."""

    def __init__(self, d_in=4, d_h=5):
        super().__init__()
        self.d_h = d_h
        self.x2h = nn.Linear(d_in, 3 * d_h)
        self.h2h = nn.Linear(d_h, 3 * d_h)

    def forward(self, x, h=None):
        if h is None:
            h = x.new_zeros(x.shape[0], self.d_h)
        outs = []
        for t in range(x.shape[1]):
            xr, xz, xn = self.x2h(x[:, t]).chunk(3, -1)
            hr, hz, hn = self.h2h(h).chunk(3, -1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            h = (1 - z) * torch.tanh(xn + r * hn) + z * h
            outs.append(h)
        return torch.stack(outs, 1), h


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.SiLU(), nn.AvgPool2d(2),
            nn.Conv2d(4, 4, 1), nn.Flatten(), nn.Linear(4 * 3 * 3, 5))
        self.loss = nn.CrossEntropyLoss(label_smoothing=0.1)

    def forward(self, x, y):
        logits = self.features(x)
        return logits, self.loss(logits, y)


@dataclasses.dataclass
class GPTConfig:
    vocab: int = 11
    d: int = 8
    heads: int = 2
    layers: int = 2
    ctx: int = 6
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d, 3 * cfg.d)
        self.proj = nn.Linear(cfg.d, cfg.d)
        self.drop = nn.Dropout(cfg.dropout)
        self.register_buffer("mask", torch.tril(torch.ones(cfg.ctx, cfg.ctx)).bool())

    def forward(self, x):
        b, t, d = x.size()
        h = self.cfg.heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = [z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v)]
        att = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d), nn.LayerNorm(cfg.d)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.ModuleDict(dict(fc=nn.Linear(cfg.d, 4 * cfg.d),
                                      proj=nn.Linear(4 * cfg.d, cfg.d), act=nn.GELU("tanh")))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        m = self.mlp
        return x + m.proj(m.act(m.fc(self.ln2(x))))


class MiniGPT(nn.Module):
    def __init__(self, cfg: GPTConfig | None = None):
        super().__init__()
        cfg = cfg or GPTConfig()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d)
        self.wpe = nn.Embedding(cfg.ctx, cfg.d)
        self.blocks = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)

    def forward(self, idx, targets=None):
        b, t = idx.shape
        assert t <= self.cfg.ctx, f"sequence {t} longer than {self.cfg.ctx}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


class TrainDropoutZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        y = self.drop(self.lin(x))
        y += 1  # an in-place update of a temporary
        return F.relu(y, inplace=True)


def functional_on_module(m, x):
    return m(x) + m.lin.weight.sum()


GLOBAL_MODEL = nn.Linear(3, 2)


def uses_global_module(x):
    return GLOBAL_MODEL(x).relu()


def pass_module(x):
    return functional_on_module(PROP, x)


PROP = PropertyModule()

CASES: list[tuple[str, Any, Callable[[], tuple[Any, ...]], dict[str, Any]]] = [
    ("mlp", MLP(), lambda: (torch.randn(5, 4),), {"grad": True}),
    ("mlp_tanh", MLP((3, 6, 6, 2), nn.Tanh), lambda: (torch.randn(2, 3),), {"grad": True}),
    ("conv_bn_eval", ConvBN().eval(), lambda: (torch.randn(2, 3, 8, 8),), {"grad": True}),
    ("residual", Residual(), lambda: (torch.randn(2, 5, 8),), {"grad": True}),
    ("attention", Attention(), lambda: (torch.randn(2, 4, 8),), {"grad": True}),
    ("attention_mask", Attention(), lambda: (torch.randn(1, 3, 8),
                                            torch.tensor([[False, True, True]] * 3)), {}),
    ("sdpa", SDPA(), lambda: (torch.randn(2, 4, 8),), {"grad": True}),
    ("embedding_buffer", Embedder(), lambda: (torch.randint(0, 10, (2, 5)),), {"grad": True}),
    ("training_branch_eval", TrainingBranch().eval(), lambda: (torch.randn(2, 3),), {}),
    ("module_dict_fstring", Heads(), lambda: (torch.randn(2, 4),), {"grad": True}),
    ("direct_params", DirectParams(), lambda: (torch.randn(3, 4),), {"grad": True}),
    ("tied_weights", Tied(), lambda: (torch.randint(0, 6, (2, 3)),), {"grad": True}),
    ("super_forward", Derived(), lambda: (torch.randn(2, 4),), {"grad": True}),
    ("forward_kwargs", WithKwargs(), lambda: (torch.randn(2, 4),), {"grad": True}),
    ("returns_dataclass", ReturnsDataclass(), lambda: (torch.randn(2, 3),), {"grad": True}),
    ("property_module", PropertyModule(), lambda: (torch.randn(2, 3),), {}),
    ("no_grad_inside", NoGradInside(), lambda: (torch.randn(4, 3),), {"grad": True}),
    ("loop_rnn", LoopRNN(), lambda: (torch.randn(2, 3, 4),), {"grad": True}),
    ("convnet_loss", ConvNet(), lambda: (torch.randn(2, 1, 8, 8), torch.tensor([1, 4])),
     {"grad": True}),
    ("sequential", nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Identity(), nn.Linear(4, 1)),
     lambda: (torch.randn(6, 3),), {"grad": True}),
    ("layer_norm_fn", nn.LayerNorm([2, 3], elementwise_affine=False),
     lambda: (torch.randn(4, 2, 3),), {}),
    ("mha", nn.MultiheadAttention(8, 2, batch_first=True).eval(),
     lambda: (torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(2, 3, 8)), {}),
    ("transformer_layer", nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                     batch_first=True).train(),
     lambda: (torch.randn(2, 3, 8),), {"grad": True}),
    ("global_module_fn", uses_global_module, lambda: (torch.randn(2, 3),), {}),
    ("module_as_argument", functional_on_module, lambda: (PROP, torch.randn(2, 3)), {"calls": 1}),
    ("module_in_function", pass_module, lambda: (torch.randn(2, 3),), {}),
    ("upsample_pad", nn.Sequential(nn.Upsample(scale_factor=2), nn.ZeroPad2d(1), nn.Conv2d(2, 2, 3)),
     lambda: (torch.randn(1, 2, 3, 3),), {"grad": True}),
    ("mini_gpt", MiniGPT(), lambda: (torch.randint(0, 11, (2, 5)),), {"grad": True}),
    ("mini_gpt_loss", MiniGPT(), lambda: (torch.randint(0, 11, (2, 6)),
                                           torch.randint(0, 11, (2, 6))), {"grad": True}),
    ("train_dropout_inplace", TrainDropoutZero().train(), lambda: (torch.randn(3, 4),),
     {"grad": True}),
    ("bn_train", nn.BatchNorm1d(3, track_running_stats=False), lambda: (torch.randn(5, 3),),
     {"grad": True}),
]


@pytest.mark.parametrize("name,target,make,opts", CASES, ids=[c[0] for c in CASES])
def test_module_corpus(name: str, target: Any, make: Callable[[], tuple[Any, ...]],
                       opts: dict[str, Any]) -> None:
    torch.manual_seed(0)
    check_against_eager(target, *make(), **{"calls": 2, **opts})
