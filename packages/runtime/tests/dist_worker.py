"""Two-process training runs for test_distributed.py: `python dist_worker.py GROUP PORT OUTDIR`.

Each rank trains a model for a few SGD-with-momentum steps under eager DDP/FSDP2 and under the
same wrapper with ember compiling the model, on gloo (CPU), and writes one JSON line per case to
OUTDIR/rank<r>.jsonl: the losses, the largest parameter difference from eager, and explain's
notes. Run as a script
(not imported by pytest): the processes are spawned from here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ember.runtime as er

STEPS = 5
# small buckets, so these small models are cut into several pieces
BUCKET_MB = 0.004


class Block(nn.Module):
    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.down(nn.functional.gelu(self.up(self.ln2(x))))
        return out


class Transformer(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        out: torch.Tensor = self.head(self.ln(x))
        return out


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def batch(kind: str, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    if kind == "transformer":
        ids = torch.randint(0, 64, (2, 12), generator=g)
        return ids, torch.randint(0, 64, (2, 12), generator=g)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


def make(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return Transformer() if kind == "transformer" else conv_net()


def train(model: nn.Module, kind: str, rank: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = batch(kind, step, rank)
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def local(t: torch.Tensor) -> torch.Tensor:
    """A parameter's values on this rank (FSDP2's are sharded DTensors)."""
    to_local = getattr(t, "to_local", None)
    return (to_local() if to_local is not None else t).detach().float()


def notes(m: Any) -> list[str]:
    text = str(er.explain(m))
    return [ln for ln in text.splitlines() if ln.startswith(("ember explain", "note:"))]


def ddp_cases() -> dict[str, Callable[[str], tuple[nn.Module, nn.Module, Any]]]:
    def inner(kind: str) -> tuple[nn.Module, nn.Module, Any]:
        m = DDP(er.compile(make(kind)), bucket_cap_mb=BUCKET_MB)
        return DDP(make(kind), bucket_cap_mb=BUCKET_MB), m, m.module

    def outer(kind: str) -> tuple[nn.Module, nn.Module, Any]:
        m = er.compile(DDP(make(kind), bucket_cap_mb=BUCKET_MB))
        return DDP(make(kind), bucket_cap_mb=BUCKET_MB), m, m

    return {"DDP(compile(m))": inner, "compile(DDP(m))": outer}


def fsdp_cases() -> dict[str, Callable[[str], tuple[nn.Module, nn.Module, Any]]]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def shard(m: nn.Module, how: str, mp_policy: Any = None) -> tuple[nn.Module, Any]:
        kw = {} if mp_policy is None else {"mp_policy": mp_policy}
        blocks = m.get_submodule("blocks")
        assert isinstance(blocks, nn.ModuleList)
        first = None
        for i in range(len(blocks)):
            if how == "shard, then compile":
                fully_shard(blocks[i], **kw)
                blocks[i] = er.compile(blocks[i])
            elif how == "compile, then shard":
                blocks[i] = er.compile(blocks[i])
                fully_shard(blocks[i], **kw)
            else:
                fully_shard(blocks[i], **kw)
            first = first or blocks[i]
        fully_shard(m, **kw)
        return m, first

    def case(how: str, mp_policy: Any = None) -> Callable[[str], tuple[nn.Module, nn.Module,
                                                                         Any]]:
        def build(kind: str) -> tuple[nn.Module, nn.Module, Any]:
            ref, _ = shard(make(kind), "eager", mp_policy)
            m, first = shard(make(kind), how, mp_policy)
            return ref, m, first
        return build

    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return {"shard, then compile": case("shard, then compile"),
            "compile, then shard": case("compile, then shard"),
            "shard, then compile, bf16 params": case("shard, then compile", bf16)}


def worker(rank: int, group: str, port: str, outdir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        cases = ddp_cases() if group == "ddp" else fsdp_cases()
        kinds = ("transformer", "conv") if group == "ddp" else ("transformer",)
        for kind in kinds:
            for name, build in cases.items():
                if os.environ.get("EMBER_DIST_CASE", name) != name:
                    continue
                ref_model, model, compiled = build(kind)
                ref = train(ref_model, kind, rank)
                got = train(model, kind, rank)
                diff = max((local(a) - local(b)).abs().max().item()
                           for a, b in zip(ref_model.parameters(), model.parameters(),
                                           strict=True))
                rec = {"rank": rank, "case": f"{kind}: {name}", "ref": ref, "got": got,
                       "param_diff": diff, "notes": notes(compiled)}
                with open(os.path.join(outdir, f"rank{rank}.jsonl"), "a") as f:
                    f.write(json.dumps(rec) + "\n")
        # Both ranks are past their last collective before either closes its connections;
        # the marker tells the test that what follows is gloo's teardown only.
        dist.barrier()
        with open(os.path.join(outdir, f"rank{rank}.done"), "w") as f:
            f.write("done\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2)
