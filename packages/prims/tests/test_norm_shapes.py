"""The normalized dims of layer norm and RMS norm (norms.py `_last_dims`): the last
len(normalized_shape) dims, symbolic sizes included; a normalized_shape the input cannot have is
one clear DecompositionError for either op."""

from __future__ import annotations

import pytest
import torch

import ember.prims  # noqa: F401  (registers prims and decompositions)
from ember.ir import Interpreter, parse
from ember.prims.decomp import DECOMPOSITIONS, DecompositionError, decompose_module

NORMS = """ember.ir 1.0

symbol s0 hint=3 min=2

graph @f(%x: f32[s0, 4, 6], %w: f32[{wshape}]) -> (f32[s0, 4, 6], f32[{stat}], f32[{stat}]) {{
  %y, %mean, %rstd = aten.native_layer_norm.default(%x, {shape}, %w, %w, 1e-05) : \
(f32[s0, 4, 6], f32[{stat}], f32[{stat}])
  %z, %r = aten._fused_rms_norm.default(%x, {shape}, %w, 1e-05) : (f32[s0, 4, 6], f32[{stat}])
  return (%z, %mean, %r)
}}
"""


def test_both_norms_normalize_the_last_dims() -> None:
    m = decompose_module(parse(NORMS.format(wshape="4, 6", shape="[4, 6]", stat="s0, 1, 1")),
                         DECOMPOSITIONS)
    x, w = torch.randn(5, 4, 6), torch.randn(4, 6)  # s0 = 5, not the hint
    z, mean, r = Interpreter(m).run([x, w]).outputs
    torch.testing.assert_close(mean, x.mean((1, 2), keepdim=True))
    torch.testing.assert_close(z, torch.nn.functional.rms_norm(x, [4, 6], w, 1e-5))
    torch.testing.assert_close(r, torch.rsqrt(x.pow(2).mean((1, 2), keepdim=True) + 1e-5))


BAD = {
    "native_layer_norm": "%y, %m, %r = aten.native_layer_norm.default(%x, [1, 4, 6], %w, %w, "
                         "1e-05) : (f32[4, 6], f32[1, 1, 1], f32[1, 1, 1])",
    "_fused_rms_norm": "%y, %r = aten._fused_rms_norm.default(%x, [1, 4, 6], %w, 1e-05) : "
                       "(f32[4, 6], f32[1, 1, 1])",
}


@pytest.mark.parametrize("op", sorted(BAD))
def test_a_normalized_shape_longer_than_the_input_is_one_clear_error(op: str) -> None:
    text = ("ember.ir 1.0\n\ngraph @f(%x: f32[4, 6], %w: f32[1, 4, 6]) -> (f32[4, 6]) {\n"
            f"  {BAD[op]}\n  return (%y)\n}}\n")
    with pytest.raises(DecompositionError, match=rf"aten\.{op}\.default: normalized_shape "
                                                 r"\[1, 4, 6\] does not fit"):
        decompose_module(parse(text), DECOMPOSITIONS)
