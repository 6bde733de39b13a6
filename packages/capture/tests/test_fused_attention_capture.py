"""The CUDA fused attention kernels are captured (found on the H200: sdpa dispatches to
`_scaled_dot_product_cudnn_attention`, whose result tuple holds Nones and ints among its tensors,
and capture broke there with "returned tuple, which a graph node cannot hold").

No GPU here: the ops are called by name on CPU tensors. Capture runs them on fake tensors (their
meta kernels), so it records the node exactly as it would for cuda ones; the captured graph is
then decomposed (the CUDA forms' decompositions, packages/prims) and run on CPU against eager
sdpa, and retyped onto cuda:0 to check that it lowers there too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ember.capture import capture
from ember.ir import Module, ScalarType, TensorType, parse, verify
from ember.ir.passes import run_pipeline

aten = torch.ops.aten
CUDNN = "aten._scaled_dot_product_cudnn_attention.default"
FLASH = "aten._scaled_dot_product_flash_attention.default"


def cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)[:2]
    return out * 2, lse


def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[:2]
    return out * 2, lse


def captured(fn: Callable[..., Any], *args: torch.Tensor) -> Module:
    with torch.no_grad():
        c = capture(fn, args, {})
    assert getattr(c, "module", None) is not None, getattr(c, "unhandled", c)
    verify(parse(str(c.module)))  # the node's types are its type inference's
    return c.module  # type: ignore[no-any-return]


def _qkv(L: int, S: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, n, 8, generator=g) for n in (L, S, S)]


def _causal_lse(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.logsumexp(s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1),
                                         -math.inf), -1)


@pytest.mark.parametrize("fn,op", [(cudnn, CUDNN), (flash, FLASH)], ids=["cudnn", "flash"])
def test_fused_cuda_attention_is_one_node(fn: Callable[..., Any], op: str) -> None:
    m = captured(fn, *_qkv(5, 5))
    nodes = [n for n in m.graph().nodes if n.op == op]
    assert len(nodes) == 1
    kinds = [type(r.type) for r in nodes[0].results]
    # output, logsumexp, then max_q and max_k (ints: scalar results), the Nones left out
    assert kinds[:4] == [TensorType, TensorType, ScalarType, ScalarType], kinds
    assert m.graph().outputs[0].node is not None  # out * 2 reads the node's first result


@pytest.mark.parametrize("fn", [cudnn, flash], ids=["cudnn", "flash"])
def test_fused_cuda_attention_matches_eager_sdpa(fn: Callable[..., Any]) -> None:
    from ember.runtime import compile as ember_compile

    q, k, v = _qkv(5, 5)
    cf = ember_compile(fn, dynamic=False)
    out, lse = cf(q, k, v)
    assert not cf.history.fallbacks, [f.reason for f in cf.history.fallbacks]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2)
    want = _causal_lse(q, k)
    torch.testing.assert_close(lse, want.unsqueeze(-1) if fn is cudnn else want)


def test_cudnn_attention_with_dynamic_lengths() -> None:
    """Sequence lengths as symbols: max_q/max_k are SymInts while capturing (scalar results)."""
    from ember.runtime import compile as ember_compile

    cf = ember_compile(cudnn, dynamic=True)
    for L in (5, 7):
        q, k, v = _qkv(L, L)
        out, lse = cf(q, k, v)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)
                                   * 2)
        torch.testing.assert_close(lse, _causal_lse(q, k).unsqueeze(-1))
    assert not cf.history.fallbacks, [f.reason for f in cf.history.fallbacks]
    m = cf._last_compiled
    assert m is not None and m.symbols, "compiled with static lengths"


_TYPE = re.compile(r"((?:f16|bf16|f32|f64|i8|i16|i32|i64|u8|u64|b8)\[[^\]]*\](?:\{[^}]*\})?)(?!@)")


def test_cudnn_attention_lowers_for_cuda() -> None:
    """The graph as the H200 captures it (typed on cuda:0) decomposes to prims and lowers with
    every value on cuda:0."""
    m = captured(cudnn, *_qkv(4, 6))
    d = run_pipeline(parse(_TYPE.sub(r"\1@cuda:0", str(m))), "decompose,cse,dce")
    assert all(n.op.startswith("prims.") for n in d.graph().nodes), \
        sorted({n.op for n in d.graph().nodes})
    lowered = run_pipeline(d, "lower-loops")
    devs = {v.type.device for g in lowered.graphs.values()
            for v in [*g.params, *(r for n in g.nodes for r in n.results)]
            if isinstance(v.type, TensorType)}
    assert devs == {"cuda:0"}, devs


def test_other_mixed_results_still_refused() -> None:
    """Only Nones and numbers may sit among the tensors: the recorder's check, directly."""
    from ember.capture.recorder import _mixed_results

    t = torch.zeros(2)
    got = _mixed_results((t, None, 3, 1.5, True, t))
    assert got is not None
    tensors, types, at = got
    assert len(tensors) == 2 and at == [0, 4] and len(types) == 5
    assert _mixed_results((t, "text")) is None
    assert _mixed_results((t, [t])) is None
    assert _mixed_results(t) is None
