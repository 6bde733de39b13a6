"""The generated wrapper's call of the CPU attention extern (loop.attention_heads_last_cpu)
through its binder (attention.py `_bind_forward`, wrapper.register_binder): one call of
flash's heads-last forward with the node's constants bound once and the mask passed as a
keyword, not the op's reference through the interpreter with an argument list and dict built
per call; results equal to eager's, ember's kernel or torch's (too few rows) serving."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module
from ember.inductor.targets.cpu import attention, flash
from ember.inductor.wrapper import generate
from ember.ir import parse

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _ir(b: int, n: int, h: int, e: int, causal: bool, mask: bool) -> str:
    """q, k, v split from one projection [B, L, 3*H*E] (heads inside its rows: H > 1, the
    heads-last extern however few rows), attention
    (with an additive mask input where `mask`), output and logsumexp returned."""
    m = f", %m: f32[{b}, 1, {n}, {n}]" if mask else ""
    mk = ", attn_mask=%m" if mask else ""
    return f"""ember.ir 1.0

graph @f(%x: f32[{b}, {n}, {3 * h * e}]{m}) -> (f32[{b}, {h}, {n}, {e}], f32[{b}, {h}, {n}]) {{
  %x4 = aten.view.default(%x, [{b}, {n}, {3 * h}, {e}]) : f32[{b}, {n}, {3 * h}, {e}]
  %q = aten.slice.Tensor(%x4, 2, 0, {h}) : f32[{b}, {n}, {h}, {e}]
  %k = aten.slice.Tensor(%x4, 2, {h}, {2 * h}) : f32[{b}, {n}, {h}, {e}]
  %v = aten.slice.Tensor(%x4, 2, {2 * h}, {3 * h}) : f32[{b}, {n}, {h}, {e}]
  %qt = aten.transpose.int(%q, 1, 2) : f32[{b}, {h}, {n}, {e}]
  %kt = aten.transpose.int(%k, 1, 2) : f32[{b}, {h}, {n}, {e}]
  %vt = aten.transpose.int(%v, 1, 2) : f32[{b}, {h}, {n}, {e}]
  %o, %l = aten._scaled_dot_product_flash_attention_for_cpu.default(%qt, %kt, %vt, 0.0, {str(causal).lower()}{mk}, scale=0.25) : (f32[{b}, {h}, {n}, {e}], f32[{b}, {h}, {n}])
  return (%o, %l)
}}
"""


def _eager(x: torch.Tensor, mask: torch.Tensor | None, h: int, causal: bool
           ) -> tuple[torch.Tensor, torch.Tensor]:
    b, n, _ = x.shape
    x4 = x.view(b, n, 3 * h, -1)
    q, k, v = (x4[:, :, i * h:(i + 1) * h].transpose(1, 2) for i in range(3))
    o, lse = FLASH(q, k, v, 0.0, causal, attn_mask=mask, scale=0.25)[:2]
    return o, lse


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 2), st.sampled_from([8, flash.MIN_ROWS, 40]), st.integers(2, 3),
       st.sampled_from([4, 16]), st.booleans(), st.booleans(), st.booleans())
def test_the_attention_extern_is_a_bound_call(b: int, n: int, h: int, e: int, causal: bool,
                                              mask: bool, strided: bool) -> None:
    module = compile_module(parse(_ir(b, n, h, e, causal, mask)))
    ops = [nd.kwargs["op"] for nd in module.graph().nodes if nd.op == "kernels.extern"]
    assert ops == [attention.HEADS_LAST], ops
    w = generate(module)
    # the extern's one line: both results bound by one call
    line = next(s for s in w.source.splitlines() if re.match(r" +v\d+_0, v\d+_1 = _c\d+\(", s))
    # one call of the bound function: no interpreter, argument list or dict per call
    assert "_interp" not in w.source and "_unpack(" not in w.source, w.source
    assert (" attn_mask=" in line) == mask, line
    fn = w.call.__globals__[line.split("= ")[1].split("(")[0]]
    assert fn.func is flash.forward_heads_last and fn.keywords == {"scale": 0.25}
    g = torch.Generator().manual_seed(b * 100 + n + h + e)
    x = torch.randn(b, n, 3 * h * e, generator=g)
    if strided:  # an input with other strides (a transposed buffer): still handled
        x = torch.randn(3 * h * e, b, n, generator=g).permute(1, 2, 0)
    m = torch.randn(b, 1, n, n, generator=g) if mask else None
    o, lse = w.call([x, m] if mask else [x]).outputs
    want_o, want_lse = _eager(x.contiguous(), m, h, causal)
    torch.testing.assert_close(o, want_o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [8, 24])
def test_the_bound_forward_returns_contiguous_heads_last_buffers(n: int) -> None:
    """Where torch's kernel runs (fewer than MIN_ROWS rows) its results are copied into the
    [B, L, H, E] order ember's kernel writes; both contiguous, as an extern's results are."""
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 8 if n < flash.MIN_ROWS else n, 3, 4 * 3, generator=g)
               [..., ::3].transpose(1, 2) for _ in range(3))  # strided last dim
    fn = attention._bind_forward({"kernel": attention.FORWARD, "scale": 0.5})
    o, lse = fn(q, k, v, 0.0, True)
    want_o, want_lse = FLASH(q.contiguous(), k.contiguous(), v.contiguous(), 0.0, True,
                             scale=0.5)[:2]
    assert o.is_contiguous() and lse.is_contiguous()
    torch.testing.assert_close(o, want_o.transpose(1, 2), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, want_lse.transpose(1, 2), rtol=1e-4, atol=1e-5)
