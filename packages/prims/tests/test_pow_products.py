"""`x ** 2`, `x ** 3` and `x ** -2` of f32/f64 decompose to products, as eager's CPU kernel
computes them (pow_tensor_scalar_optimized_kernel): no pow call (GPT-2's GELU cubes its input;
a vector powf cost 20x the products), the same values bitwise, specials included."""

from __future__ import annotations

import pytest
import torch

import ember.prims  # noqa: F401  (registers prims and decompositions)
from ember.ir import Interpreter, parse, print_module
from ember.prims.decomp import DECOMPOSITIONS, decompose_module

GRAPH = """ember.ir 1.0

graph @f(%x: {dt}[64]) -> ({dt}[64]) {{
  %y = aten.pow.Tensor_Scalar(%x, {e}) : {dt}[64]
  return (%y)
}}
"""

SPECIALS = [0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), 1e-30, -3e12,
            1e20, 2.5e-20, 7.0]


@pytest.mark.parametrize("e", [2.0, 3.0, -2.0, 3])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_small_integer_powers_are_products_bitwise_equal_to_eager(dt: str, e: object) -> None:
    m = decompose_module(parse(GRAPH.format(dt=dt, e=e)), DECOMPOSITIONS)
    text = print_module(m)
    assert "prims.pow" not in text and "prims.mul" in text, text
    torch.manual_seed(0)
    dtype = {"f32": torch.float32, "f64": torch.float64}[dt]
    x = torch.cat([torch.tensor(SPECIALS, dtype=dtype),
                   torch.randn(64 - len(SPECIALS), dtype=dtype) * 50])
    (y,) = Interpreter(m).run([x]).outputs
    torch.testing.assert_close(y, torch.pow(x, e), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(("dt", "e"), [("f32", 2.5), ("f32", 4.0), ("i64", 3)])
def test_other_powers_and_integer_tensors_keep_pow(dt: str, e: object) -> None:
    text = print_module(decompose_module(parse(GRAPH.format(dt=dt, e=e)), DECOMPOSITIONS))
    assert "prims.pow" in text, text
