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


def test_strided_operands_give_the_contiguous_gradients() -> None:
    """torch's CPU backward kernel reads a head's features as contiguous: given a q or an out
    whose last stride is not 1 it returned wrong gradients (q by ~30 on unit-scale data). The
    extern's op hands it contiguous copies of such operands."""
    from ember.ir import Module
    from ember.ir.interpreter import Interpreter
    from ember.ir.registry import default_registry

    g = torch.Generator().manual_seed(0)
    q, k, v, go = (torch.randn(2, 3, 16, 8, generator=g) for _ in range(4))
    fw = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    out, lse = fw(q, k, v, 0.0, False)
    op = default_registry().lookup(GRADS_HEADS_LAST)
    assert op is not None
    interp = Interpreter(Module())
    kw = {"kernel": "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}
    want = op.reference(interp, [go, q, k, v, out, lse, 0.0, False], kw)

    def strided(t: torch.Tensor) -> torch.Tensor:  # same values, last stride L
        return t.transpose(2, 3).contiguous().transpose(2, 3)

    for i in (1, 2, 3, 4):  # q, k, v, out
        args: list[object] = [go, q, k, v, out, lse, 0.0, False]
        args[i] = strided(args[i])  # type: ignore[arg-type]
        got = op.reference(interp, args, kw)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
