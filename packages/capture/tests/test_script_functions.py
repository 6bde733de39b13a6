"""A torch.jit.script function called from captured code is traced through its Python original
(`_torchdynamo_inline`, which torch.jit.script keeps for compilers). Found on the H200: the
device's transformers 4 DeBERTa-v2 calls three scripted helpers (`c2p_dynamic_expand`, ...),
and each call was a graph break ("calling torch.jit.ScriptFunction object")."""

from __future__ import annotations

import torch

from ember.capture import capture
from ember.runtime import compile as ember_compile


@torch.jit.script
def expand_like(pos: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = pos.expand([q.size(0), q.size(1), pos.size(-1)])
    return out


def attn_bias(q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = q.sum(-1, keepdim=True) + expand_like(pos, q) * 2
    return out


def test_a_script_function_is_one_graph_with_its_caller() -> None:
    q, pos = torch.randn(2, 3, 4), torch.randn(1, 1, 5)
    with torch.no_grad():
        c = capture(attn_bias, (q, pos), {})
    assert getattr(c, "module", None) is not None, c  # captured whole: no break
    cf = ember_compile(attn_bias, dynamic=False)
    torch.testing.assert_close(cf(q, pos), attn_bias(q, pos))
    assert not cf.history.breaks and not cf.history.fallbacks
