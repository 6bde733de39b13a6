"""The generated wrapper calls a prims.matmul extern of two 3-d operands of one static batch
size as torch.bmm (wrapper.py `_matmul_kernel`: what torch.matmul calls for them, without its
dispatch), other ranks as the prim's reference; results equal eager's, on strided inputs too."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module
from ember.inductor.wrapper import generate
from ember.ir import parse


def _ir(b: int, n: int, k: int, m: int) -> str:
    return f"""ember.ir 1.0

graph @f(%a: f32[{b}, {n}, {k}], %b: f32[{b}, {k}, {m}], %e: f32[2, {b}, {n}, {k}], %g: f32[2, {b}, {k}, {m}]) -> (f32[{b}, {n}, {m}], f32[2, {b}, {n}, {m}]) {{
  %x = aten.matmul.default(%a, %b) : f32[{b}, {n}, {m}]
  %z = aten.matmul.default(%e, %g) : f32[2, {b}, {n}, {m}]
  return (%x, %z)
}}
"""


def _maybe_t(t: torch.Tensor, flip: bool) -> torch.Tensor:
    """t itself, or the same values as a transposed (strided) view."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2) if flip else t


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9),
       st.booleans(), st.booleans())
def test_a_batched_matmul_is_a_bmm_call(b: int, n: int, k: int, m: int, fa: bool,
                                        fb: bool) -> None:
    w = generate(compile_module(parse(_ir(b, n, k, m))))
    calls = [v for v in w.call.__globals__.values() if v is torch.bmm]
    assert len(calls) == 1, w.source  # the 3-d one; the 4-d one keeps the prim's reference
    g = torch.Generator().manual_seed(b * 1000 + n * 100 + k * 10 + m)
    a, bb = torch.randn(b, n, k, generator=g), torch.randn(b, k, m, generator=g)
    e, gg = torch.randn(2, b, n, k, generator=g), torch.randn(2, b, k, m, generator=g)
    x, z = w.call([_maybe_t(a, fa), _maybe_t(bb, fb), _maybe_t(e, fa), gg]).outputs
    torch.testing.assert_close(x, torch.matmul(a, bb))
    torch.testing.assert_close(z, torch.matmul(e, gg))
    assert x.is_contiguous() and z.is_contiguous()
