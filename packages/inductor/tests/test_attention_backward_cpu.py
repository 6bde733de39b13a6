"""The CPU target lowers torch's fused attention backward (training's extern) so that its
gradients are read where the kernel writes them: [B, L, H, E] buffers
(`loop.attention_grads_heads_last`, targets/cpu/attention.py) seen through permuted views, with
no transposing copy; a layer's gradients through compile() match eager's."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.runtime as er
from ember.inductor.targets.cpu.attention import GRADS_HEADS_LAST


def _layer(x: torch.Tensor, w: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    b, n, d = x.shape
    q, k, v = (x @ w).view(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return (a.transpose(1, 2).reshape(b, n, d) ** 2).sum()


def _grads(fn: object, x: torch.Tensor, w: torch.Tensor, heads: int,
           causal: bool) -> list[torch.Tensor]:
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    fn(xs, ws, heads, causal).backward()  # type: ignore[operator]
    assert xs.grad is not None and ws.grad is not None
    return [xs.grad, ws.grad]


def test_backward_gradients_are_heads_last_buffers(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, 16, generator=g), torch.randn(16, 48, generator=g) / 4
    f = er.compile(_layer, backend="inductor", options={"dump_dir": str(tmp_path)})
    torch.testing.assert_close(_grads(f, x, w, 4, True), _grads(_layer, x, w, 4, True))
    text = "\n".join(p.read_text() for p in tmp_path.glob("*.backward.kernels.ir"))
    assert f'op="{GRADS_HEADS_LAST}"' in text, text[:2000]
    # the gradients reach the next kernel as views, not through copy kernels of their own
    assert ".heads_last" in text


@settings(max_examples=6, deadline=None)
@given(b=st.integers(1, 2), n=st.integers(1, 9), heads=st.integers(1, 3),
       e=st.sampled_from([2, 8]), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_layer_gradients_match_eager(b: int, n: int, heads: int, e: int,
                                               causal: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    d = heads * e
    x, w = torch.randn(b, n, d, generator=g), torch.randn(d, 3 * d, generator=g) / 4
    f = er.compile(_layer, backend="inductor")
    torch.testing.assert_close(_grads(f, x, w, heads, causal), _grads(_layer, x, w, heads, causal),
                               rtol=1e-4, atol=1e-5)
