"""A graph holding tensors of two devices is refused with the values on the minority device
named (issue 20): on the H200 the dolly-shaped prefill was refused as "cpu and cuda tensors in
one graph" with nothing saying which tensor was on the CPU. The classification runs on the
types alone, so this needs no GPU."""

from __future__ import annotations

import pytest

import ember.inductor  # noqa: F401  (registers the targets)
from ember.inductor.targets import TargetError, mixed_devices, mixed_reason, target_for
from ember.ir import parse

_MIXED = """ember.ir 1.0

graph @forward(%x: f32[4]@cuda:0, %s: f32[], %i: i64[3]) -> (f32[4]@cuda:0) {
  %y = aten.mul.Tensor(%x, %s) : f32[4]@cuda:0
  %z = aten.add.Tensor(%y, %x) : f32[4]@cuda:0
  return (%z)
}
"""

_ONE = """ember.ir 1.0

graph @forward(%x: f32[4], %s: f32[]) -> (f32[4]) {
  %y = aten.mul.Tensor(%x, %s) : f32[4]
  return (%y)
}
"""


def test_mixed_graph_names_the_values_on_the_other_device() -> None:
    m = parse(_MIXED)
    uses = mixed_devices(m)
    assert sorted(uses) == ["cpu", "cuda"]
    cpu = {u.name: u for u in uses["cpu"]}
    assert set(cpu) == {"s", "i"}
    assert cpu["s"].scalar and cpu["s"].producer == "input"
    assert not cpu["i"].scalar
    reason = mixed_reason(uses)
    assert reason.startswith("3 cuda values; on other devices: cpu: ")
    assert "%s: f32[] (0-dim input)" in reason and "%i: i64[3] (input)" in reason
    with pytest.raises(TargetError, match=r"several devices \(cpu, cuda\).*0-dim input"):
        target_for(m)


def test_one_device_graph_has_no_mixed_report() -> None:
    m = parse(_ONE)
    assert mixed_devices(m) == {}
    assert target_for(m).device_kind == "cpu"


def test_reason_shows_a_few_values_and_counts_the_rest() -> None:
    lines = ", ".join(f"%c{i}: f32[]" for i in range(6))
    m = parse(f"ember.ir 1.0\n\ngraph @g(%x: f32[2]@cuda:0, %y: f32[2]@cuda:0, "
              f"%w: f32[2]@cuda:0, %v: f32[2]@cuda:0, %u: f32[2]@cuda:0, %t: f32[2]@cuda:0, "
              f"%q: f32[2]@cuda:0, {lines}) -> (f32[2]@cuda:0) {{\n  return (%x)\n}}\n")
    reason = mixed_reason(mixed_devices(m), shown=2)
    assert "%c0" in reason and "%c1" in reason and "%c2" not in reason
    assert "and 4 more" in reason
