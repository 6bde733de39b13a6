"""Shape decompositions with symbolic size *arguments* (what dynamic-shape capture will emit):
the decomposed graph stays symbolic and gives eager's numbers at sizes other than the hints.
The op database covers the rest; its symbolic check has only symbolic input shapes."""

from __future__ import annotations

import pytest
import torch

import ember.prims  # noqa: F401  (registers prims and decompositions)
from ember.ir import Interpreter, parse, verify
from ember.prims.decomp import DECOMPOSITIONS, DecompositionError, decompose_module

SYMBOLIC = """ember.ir 1.0

symbol s0 hint=4 min=2

graph @f(%x: f32[s0, 6], %y: f32[s0, 1]) -> (f32[s0 * 3, 2], f32[s0 * 2, 3], f32[3, s0, 6], \
f32[s0, 5], f32[s0 - 1, 6], f32[s0 - 2, 6], f32[s0, 6], f32[s0, 6], f32[s0 * 6]) {
  %a = aten.view.default(%x, [-1, 2]) : f32[s0 * 3, 2]
  %b = aten.view.default(%x, [s0 * 2, 3]) : f32[s0 * 2, 3]
  %c = aten.expand.default(%x, [3, -1, -1]) : f32[3, s0, 6]
  %d = aten.expand.default(%y, [s0, 5]) : f32[s0, 5]
  %e = aten.slice.Tensor(%x, 0, 1, 9223372036854775807) : f32[s0 - 1, 6]
  %g = aten.slice.Tensor(%x, 0, 1, s0 - 1) : f32[s0 - 2, 6]
  %h = aten.roll.default(%x, [5], [0]) : f32[s0, 6]
  %i = aten.flip.default(%x, [0]) : f32[s0, 6]
  %j = aten.reshape.default(%x, [-1]) : f32[s0 * 6]
  return (%a, %b, %c, %d, %e, %g, %h, %i, %j)
}
"""


def _eager(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    n = x.shape[0]
    return [x.view(-1, 2), x.view(n * 2, 3), x.expand(3, -1, -1), y.expand(n, 5), x[1:],
            x[1:n - 1], x.roll(5, 0), x.flip(0), x.reshape(-1)]


def test_symbolic_size_arguments_stay_symbolic() -> None:
    m = parse(SYMBOLIC)
    verify(m)
    d = decompose_module(m, DECOMPOSITIONS)
    verify(d)
    g = d.graph()
    assert {n.op.split(".")[0] for n in g.nodes} == {"prims"}
    # the decomposition did not specialise to the hint s0 = 4
    assert [str(t) for t in g.result_types] == [str(t) for t in m.graph().result_types]
    for n in (2, 3, 7):
        x, y = torch.randn(n, 6), torch.randn(n, 1)
        got = Interpreter(d).run([x, y]).outputs
        for i, (a, b) in enumerate(zip(got, _eager(x, y), strict=True)):
            torch.testing.assert_close(a, b, msg=lambda m, i=i, n=n: f"output {i}, n={n}: {m}")


def _to_copy(device: str) -> str:
    return f"""ember.ir 1.0

graph @f(%x: f32[2]) -> (f16[2]) {{
  %y = aten._to_copy.default(%x, dtype=f16, device="{device}") : f16[2]
  return (%y)
}}
"""


def test_to_copy_on_the_same_device_is_a_conversion() -> None:
    d = decompose_module(parse(_to_copy("cpu")), DECOMPOSITIONS)
    assert [n.op for n in d.graph().nodes] == ["prims.convert_element_type"]


def test_to_copy_between_devices_is_not_decomposed() -> None:
    with pytest.raises(DecompositionError, match="between devices"):
        decompose_module(parse(_to_copy("cuda:0")), DECOMPOSITIONS)
