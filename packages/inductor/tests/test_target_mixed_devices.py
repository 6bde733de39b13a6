"""A graph holding tensors of two devices is refused with the values on the minority device
named, except 0-dim CPU inputs of a graph otherwise on one device, which are retyped onto
it and moved there per call (issue 20): on the H200 the dolly-shaped prefill was refused as "cpu and cuda tensors in
one graph" with nothing saying which tensor was on the CPU. The classification runs on the
types alone, so this needs no GPU."""

from __future__ import annotations

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the targets)
from ember.inductor.targets import (
    ScalarInputs,
    TargetError,
    mixed_devices,
    mixed_reason,
    scalar_inputs_to_device,
    target_for,
    targets,
)
from ember.ir import parse, verify

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


_SCALAR = """ember.ir 1.0

graph @forward(%x: f32[4]@cuda:0, %s: f32[]) -> (f32[4]@cuda:0) {
  %y = aten.mul.Tensor(%x, %s) : f32[4]@cuda:0
  %z = aten.add.Tensor(%y, %x) : f32[4]@cuda:0
  return (%z)
}
"""


def test_zero_dim_cpu_inputs_are_retyped_onto_the_graphs_device() -> None:
    m = parse(_SCALAR)
    moved = scalar_inputs_to_device(m)
    assert moved is not None
    assert moved.device == "cuda:0" and moved.positions == {"forward": (1,)}
    g = moved.module.graph(None)
    assert g.params[1].type.device == "cuda:0" and g.params[1].type.shape == ()
    assert m.graph(None).params[1].type.device == "cpu"  # the original is left alone
    verify(moved.module)  # the nodes' types hold with the scalar on the device
    assert mixed_devices(moved.module) == {}
    if "cuda" in targets():  # (registered where triton is installed)
        assert target_for(moved.module).device_kind == "cuda"


def test_cpu_values_eager_would_accept_are_moved_others_refused() -> None:
    # a 0-dim CPU value a node makes from a CPU input (eager reads it as a scalar operand),
    # and an unused CPU input, are computed on / moved to the device (device_constants.py)
    assert scalar_inputs_to_device(parse(_MIXED)) is not None
    made = _SCALAR.replace("%s: f32[]) ->", "%s: f32[3]) ->").replace(
        "%y = aten.mul.Tensor(%x, %s)", "%t = aten.sum.default(%s) : f32[]\n"
        "  %y = aten.mul.Tensor(%x, %t)")
    moved = scalar_inputs_to_device(parse(made))
    assert moved is not None and moved.positions == {"forward": (1,)}
    verify(moved.module)
    assert mixed_devices(moved.module) == {}
    # a CPU vector read by a device op without a copy (eager refuses it too): refused, named
    vector = _SCALAR.replace("%s: f32[]) ->", "%s: f32[4]) ->")
    assert scalar_inputs_to_device(parse(vector)) is None
    assert scalar_inputs_to_device(parse(_ONE)) is None  # one device: nothing to do


def test_move_puts_the_scalar_inputs_on_the_device_once_per_call() -> None:
    moved = ScalarInputs(parse(_SCALAR), "meta", {"forward": (1,)})
    x, s = torch.ones(4), torch.tensor(2.0)
    out = moved.move("forward", [x, s])
    assert out[0] is x and out[1].device.type == "meta" and s.device.type == "cpu"
    assert moved.move("other", [x, s]) == [x, s]


def test_the_same_unchanged_cpu_input_is_moved_once() -> None:
    # a constant lifted to an input is the same tensor every call: one copy to the device;
    # a new tensor, or the same one changed in place, is moved again
    moved = ScalarInputs(parse(_SCALAR), "meta", {"forward": (1,)})
    x, s = torch.ones(4), torch.tensor(2.0)
    first = moved.move("forward", [x, s])[1]
    assert moved.move("forward", [x, s])[1] is first
    s.add_(1)
    again = moved.move("forward", [x, s])[1]
    assert again is not first
    assert moved.move("forward", [x, torch.tensor(2.0)])[1] is not again
    with torch.inference_mode():  # no version counter: moved every call, never cached
        t = torch.tensor(3.0)
        assert moved.move("forward", [x, t])[1] is not moved.move("forward", [x, t])[1]


_MOVED_CONSTANT = """ember.ir 1.0

graph @forward(%x: f32[2, 3]@cuda:0, %c: f32[0, 3]) -> (f32[2, 3]@cuda:0) {
  %d = aten._to_copy.default(%c, dtype=f32, device="cuda:0") : f32[0, 3]@cuda:0
  %y = aten.cat.default([%d, %x], 0) : f32[2, 3]@cuda:0
  return (%y)
}
"""


def test_a_cpu_constant_only_copied_to_the_device_is_moved_too() -> None:
    # `torch.tensor([], device="cuda")` in a model (transformers 5.17's DynamicCache init) is
    # captured as a CPU constant and a copy to the device
    moved = scalar_inputs_to_device(parse(_MOVED_CONSTANT))
    assert moved is not None and moved.positions == {"forward": (1,)}
    verify(moved.module)
    assert mixed_devices(moved.module) == {}
    # a CPU value computed from it and returned (the caller expects it on the CPU) stays a
    # refused mixed graph
    used = _MOVED_CONSTANT.replace("[%d, %x], 0) : f32[2, 3]@cuda:0",
                                   "[%d, %x], 0) : f32[2, 3]@cuda:0\n"
                                   "  %e = aten.neg.default(%c) : f32[0, 3]").replace(
        "-> (f32[2, 3]@cuda:0)", "-> (f32[2, 3]@cuda:0, f32[0, 3])").replace(
        "return (%y)", "return (%y, %e)")
    verify(parse(used))
    assert scalar_inputs_to_device(parse(used)) is None
