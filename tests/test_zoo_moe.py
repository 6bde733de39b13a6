"""Mixture-of-experts decoders through the inductor (issue 18: the zoo's hf/mixtral and
hf/qwen2-moe). transformers' experts sort the routed tokens by expert, count them per expert with
`torch.histc` and run grouped matmuls over the counts (on the CPU in f32 a custom op of
transformers' own, `torch.ops.transformers.grouped_mm_fallback`). The whole forward must be one
compiled graph — histc decomposed to prims, no fallback to eager — and match eager."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import ember.runtime as er

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _tiny(cls: str, cfg: str, **kw: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    config = getattr(transformers, cfg)(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, vocab_size=64, max_position_embeddings=32, use_cache=False, **kw)
    return getattr(transformers, cls)(config).eval()  # type: ignore[no-any-return]


def test_router_token_counts_compile_without_fallback() -> None:
    """The router's count of tokens per expert (histc over the sorted expert ids, then the
    group offsets), as transformers' grouped_mm experts compute it."""
    def counts(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.topk(scores, 2, dim=-1).indices.reshape(-1)
        ids_sorted, perm = torch.sort(ids)
        per_expert = torch.histc(ids_sorted.float(), bins=6, min=0, max=5)
        return torch.cumsum(per_expert, dim=0, dtype=torch.int32), perm
    scores = torch.randn(40, 6)
    f = er.compile(counts, backend="inductor", dynamic=False)
    got, want = f(scores), counts(scores)
    assert torch.equal(got[0], want[0])
    assert torch.equal(ids_of(scores, got[1]), ids_of(scores, want[1]))  # ties may permute
    rep = er.explain(f)
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)


def ids_of(scores: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    return torch.topk(scores, 2, dim=-1).indices.reshape(-1)[perm]


@pytest.mark.parametrize("cls,cfg,kw", [
    ("MixtralForCausalLM", "MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ("Qwen2MoeForCausalLM", "Qwen2MoeConfig",
     {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
      "shared_expert_intermediate_size": 32}),
], ids=["mixtral", "qwen2-moe"])
def test_moe_decoder_is_one_compiled_graph(cls: str, cfg: str, kw: dict[str, Any]) -> None:
    model = _tiny(cls, cfg, **kw)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))

    def fwd(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids).logits  # type: ignore[no-any-return]
    f = er.compile(fwd, backend="inductor", dynamic=False)
    with torch.no_grad():
        want = fwd(ids)
        for _ in range(2):
            torch.testing.assert_close(f(ids), want, rtol=1e-4, atol=1e-4)
    rep = er.explain(f)
    assert rep.fallbacks == [] and rep.breaks == [] and rep.graph_count == 1, str(rep)


def test_bf16_moe_keeps_grouped_matmul_whole() -> None:
    """In bf16 transformers' experts call torch's grouped matmul (aten._grouped_mm), which has
    no decomposition: it stays one op, run through torch as an extern, instead of a fallback."""
    model = _tiny("MixtralForCausalLM", "MixtralConfig", num_local_experts=4,
                  num_experts_per_tok=2).to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))

    def fwd(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids).logits  # type: ignore[no-any-return]
    f = er.compile(fwd, backend="inductor", dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(f(ids), fwd(ids))
    rep = er.explain(f)
    assert rep.fallbacks == [] and rep.breaks == [] and rep.graph_count == 1, str(rep)
    assert "aten._grouped_mm.default" in str(rep)  # the path under test was taken
