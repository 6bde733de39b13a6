"""Decompositions of convolution, pooling and the fused attention forms beyond the op
database's one-op samples: symbolic batch and spatial sizes as dynamic-shape capture gives them
(the op database's duck sizing also makes channel counts symbolic, which grouped convolutions
cannot take), and the scalar results of the fused attention kernels."""

from __future__ import annotations

import pytest
import torch

import ember.prims  # noqa: F401  (registers prims and decompositions)
from ember.ir import Interpreter, parse, verify
from ember.prims.decomp import DECOMPOSITIONS, DecompositionError, decompose_module

aten = torch.ops.aten

# batch s0 and spatial s1, s2 symbolic; channels static
CONV = """ember.ir 1.0

symbol s0 hint=2 min=1
symbol s1 hint=6 min=3
symbol s2 hint=7 min=3

graph @f(%x: f32[s0, 4, s1, s2], %w: f32[6, 2, 3, 2], %b: f32[6], %wt: f32[4, 3, 2, 3]) -> ({types}) {{
  %y = aten.convolution.default(%x, %w, %b, [2, 1], [1, 0], [1, 2], false, [0, 0], 2) : {y}
  %z = aten.convolution.default(%x, %wt, none, [2, 3], [1, 1], [1, 1], true, [1, 2], 2) : {z}
  return (%y, %z)
}}
"""


def _conv_types(n: int, h: int, w: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    x = torch.empty(n, 4, h, w, device="meta")
    y = aten.convolution(x, torch.empty(6, 2, 3, 2, device="meta"), None, [2, 1], [1, 0],
                         [1, 2], False, [0, 0], 2)
    z = aten.convolution(x, torch.empty(4, 3, 2, 3, device="meta"), None, [2, 3], [1, 1],
                         [1, 1], True, [1, 2], 2)
    return tuple(y.shape), tuple(z.shape)


def test_convolutions_with_symbolic_batch_and_spatial_sizes() -> None:
    """Declared with expressions of s0, s1, s2; run at sizes other than the hints."""
    y = "f32[s0, 6, (s1 - 1) // 2 + 1, s2 - 2]"
    z = "f32[s0, 6, s1 * 2 - 1, s2 * 3]"
    assert _conv_types(2, 6, 7) == ((2, 6, 3, 5), (2, 6, 11, 21))  # the expressions at hints
    m = parse(CONV.format(types=f"{y}, {z}", y=y, z=z))
    verify(m)
    d = decompose_module(m, DECOMPOSITIONS)
    verify(d)
    assert all(n.op.startswith("prims.") for n in d.graph().nodes)
    assert "s1" in str(d.graph().nodes[-1].results[0].type)  # still symbolic
    g = torch.Generator().manual_seed(0)
    for n, h, w in ((3, 5, 9), (1, 8, 4)):
        x = torch.randn(n, 4, h, w, generator=g)
        wts = torch.randn(6, 2, 3, 2, generator=g)
        b = torch.randn(6, generator=g)
        wt = torch.randn(4, 3, 2, 3, generator=g)
        got = Interpreter(d).run([x, wts, b, wt]).outputs
        want = [aten.convolution(x, wts, b, [2, 1], [1, 0], [1, 2], False, [0, 0], 2),
                aten.convolution(x, wt, None, [2, 3], [1, 1], [1, 1], True, [1, 2], 2)]
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1.3e-6, atol=1e-5)


POOL = """ember.ir 1.0

symbol s0 hint=2 min=1
symbol s1 hint=3 min=1

graph @f(%x: f32[s0, s1, 7, 6]) -> (f32[s0, s1, 4, 4], i64[s0, s1, 4, 4], f32[s0, s1, 4, 4], f32[s0, s1, 3, 4]) {
  %m, %i = aten.max_pool2d_with_indices.default(%x, [3, 2], [2, 2], [1, 1], [1, 1], true) : (f32[s0, s1, 4, 4], i64[s0, s1, 4, 4])
  %a = aten.avg_pool2d.default(%x, [3, 2], [2, 2], [1, 1], true, false) : f32[s0, s1, 4, 4]
  %p = aten._adaptive_avg_pool2d.default(%x, [3, 4]) : f32[s0, s1, 3, 4]
  return (%m, %i, %a, %p)
}
"""


def test_pooling_with_symbolic_batch_and_channels() -> None:
    d = decompose_module(parse(POOL), DECOMPOSITIONS)
    verify(d)
    x = torch.randn(3, 5, 7, 6, generator=torch.Generator().manual_seed(1))
    x[0, 0, 0, 0] = float("nan")
    got = Interpreter(d).run([x]).outputs
    m, i = aten.max_pool2d_with_indices(x, [3, 2], [2, 2], [1, 1], [1, 1], True)
    want = [m, i, aten.avg_pool2d(x, [3, 2], [2, 2], [1, 1], True, False),
            aten._adaptive_avg_pool2d(x, [3, 4])]
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True)


def test_pooling_rejects_symbolic_spatial_sizes() -> None:
    m = parse("""ember.ir 1.0

symbol s0 hint=6 min=2

graph @f(%x: f32[1, 2, s0, 6]) -> (f32[1, 2, s0 // 2, 3]) {
  %a = aten.avg_pool2d.default(%x, [2, 2]) : f32[1, 2, s0 // 2, 3]
  return (%a)
}
""")
    with pytest.raises(DecompositionError, match="must be static"):
        decompose_module(m, DECOMPOSITIONS)


FLASH = """ember.ir 1.0

graph @f(%q: f16[1, 2, 3, 8], %k: f16[1, 2, 5, 8], %v: f16[1, 2, 5, 8]) -> ({ret_types}) {{
  %o, %lse, %mq, %mk, %rng, %unused, %dbg = aten._scaled_dot_product_flash_attention.default(%q, %k, %v) : (f16[1, 2, 3, 8], f32[1, 2, 3], i64, i64, u64[2], u64[], f16[0])
  %y = aten.mul.Scalar(%o, %mq) : f16[1, 2, 3, 8]
  %z = aten.add.Scalar(%lse, %mk) : f32[1, 2, 3]
  return ({ret})
}}
"""


def test_fused_attention_sizes_become_literals() -> None:
    """max_q/max_k decompose to the sequence lengths, which their uses take as literals."""
    m = parse(FLASH.format(ret_types="f16[1, 2, 3, 8], f32[1, 2, 3]", ret="%y, %z"))
    d = decompose_module(m, DECOMPOSITIONS)
    verify(d)
    text = str(d)
    assert "prims.mul(" in text and "%mq" not in text
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(*s, generator=g).half() for s in ((1, 2, 3, 8), (1, 2, 5, 8),
                                                              (1, 2, 5, 8)))
    y, z = Interpreter(d).run([q, k, v]).outputs
    ref = aten._scaled_dot_product_attention_math(q.float(), k.float(), v.float())[0]
    torch.testing.assert_close(y, (ref.half() * 3), rtol=5e-3, atol=5e-3)
    lse = torch.logsumexp(q.float() @ k.float().transpose(-2, -1) / 8 ** 0.5, -1)
    torch.testing.assert_close(z, lse + 5)


def test_a_returned_literal_scalar_is_an_error() -> None:
    m = parse(FLASH.format(ret_types="f16[1, 2, 3, 8], i64", ret="%y, %mq"))
    with pytest.raises(DecompositionError, match="returns %mq"):
        decompose_module(m, DECOMPOSITIONS)
