"""Code generation targets: one record per device kind (docs/inductor.md, "Targets").

The core (lower-loops, fuse, plan-buffers, the `kernels` dialect and its launch path) knows no
device. A target says, for graphs whose tensors live on its device kind: the registered pipeline
that turns them into a `kernels.*` module (`pipeline`, after `front` has lowered aten to prims),
the lowering rules it adds to lower-loops' table (`lowerings`), a fusion veto (`fusion`) and the
kernel language its kernel blocks are written in (`loader`, see launch.py). The CPU target
(targets/cpu/) registers itself when `ember.inductor` is imported; a graph on a device with no
target is refused (`TargetError`, naming the device and the registered targets), never compiled
for another one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.inductor.body import body_names
from ember.ir import Graph, Module, Node, TensorType
from ember.ir.passes import PipelineError

# lowering.Rule, spelled loosely here: targets/ is imported by lowering.py
Rule = Callable[[Any, Node], None]
# (module, graph, producer, consumer) -> why the two kernels must stay apart, or None
FusionVeto = Callable[[Module, Graph, Node, Node], "str | None"]


class TargetError(PipelineError):
    """A graph's device has no registered target (or its tensors are on several devices)."""


@dataclass(frozen=True)
class FusionHooks:
    """A target's say in fusion: `veto` names a reason to keep a producer and its reader in
    separate kernels (say, a GPU kernel's shared-memory budget); None lets the core rules
    decide. `recompute`: the `fuse` pass's default rule 5 (inline a pointwise value of at
    most that many computing nodes into each of its readers instead of writing it; 0: off)."""

    veto: FusionVeto | None = None
    recompute: int = 0


@dataclass(frozen=True)
class Target:
    device_kind: str  # torch.device(...).type: "cpu", "cuda", ...
    pipeline: str  # a registered pipeline: prims -> kernels.* module (e.g. "inductor-cpu")
    loader: str  # the kernel language of its kernel blocks (launch.register_loader)
    lowerings: Mapping[str, Rule] = field(default_factory=dict)  # op -> rule, over the table
    fusion: FusionHooks = FusionHooks()
    front: str = "to-prims"  # aten -> prims for this target (which ops it keeps whole)
    description: str = ""

    @property
    def full_pipeline(self) -> str:
        """aten -> kernels.*: what the `inductor` backend runs for a graph on this device."""
        return f"{self.front},{self.pipeline}"


_TARGETS: dict[str, Target] = {}


def register_target(device_kind: str, pipeline: str, loader: str, *,
                    lowerings: Mapping[str, Rule] | None = None,
                    fusion: FusionHooks | None = None, front: str = "to-prims",
                    description: str = "") -> Target:
    """Register the target of a device kind; registering a kind twice is an error."""
    return add_target(Target(device_kind, pipeline, loader, dict(lowerings or {}),
                             fusion or FusionHooks(), front, description))


def add_target(t: Target) -> Target:
    """Register a target record (register_target builds one); a kind twice is an error."""
    if t.device_kind in _TARGETS:
        raise ValueError(f"a target for device {t.device_kind!r} is already registered")
    _TARGETS[t.device_kind] = t
    return t


def unregister_target(device_kind: str) -> None:
    """Remove a target (tests that register their own)."""
    _TARGETS.pop(device_kind, None)


def targets() -> dict[str, Target]:
    return dict(_TARGETS)


def device_kind(device: str) -> str:
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        return device


def graph_devices(g: Graph) -> set[str]:
    """The devices of a graph's tensors (parameters, results and node results)."""
    vals = [*g.params, *(r for n in g.nodes for r in n.results)]
    return {v.type.device for v in vals if isinstance(v.type, TensorType)}


def top_graphs(m: Module) -> list[Graph]:
    """The graphs that are not loop kernel bodies (bodies hold 0-dim values of no device)."""
    bodies = body_names(m)
    return [g for g in m.graphs.values() if g.name not in bodies]


def module_devices(m: Module, graphs: Iterable[Graph] | None = None) -> set[str]:
    return set().union(*(graph_devices(g) for g in (top_graphs(m) if graphs is None
                                                      else graphs)))


def _known() -> str:
    return ", ".join(sorted(_TARGETS)) or "none"


def target_for_devices(devices: Iterable[str], what: str = "the graph") -> Target:
    """The target of the one device kind `devices` are on (no tensors: the CPU's)."""
    kinds = sorted({device_kind(d) for d in devices}) or ["cpu"]
    if len(kinds) > 1:
        raise TargetError(f"ember.inductor: {what} has tensors on several devices "
                          f"({', '.join(kinds)}); a compiled graph runs on one")
    t = _TARGETS.get(kinds[0])
    if t is None:
        devs = sorted(set(devices)) or kinds
        raise TargetError(f"ember.inductor: {what} is on {', '.join(devs)}, and no code "
                          f"generation target is registered for {kinds[0]} (registered "
                          f"targets: {_known()})")
    return t


@dataclass(frozen=True)
class DeviceUse:
    """A tensor value of a graph on a device: what `mixed_devices` reports."""

    graph: str
    name: str
    type: TensorType
    producer: str  # "input" (a graph parameter) or the op that made it
    where: str  # the source location of its producer, "" where it has none

    @property
    def scalar(self) -> bool:
        """0-dim: what eager accepts on the CPU as a scalar operand of a CUDA op."""
        return len(self.type.shape) == 0

    def text(self) -> str:
        at = f" at {self.where}" if self.where else ""
        kind = "0-dim " if self.scalar else ""
        return f"@{self.graph} %{self.name}: {self.type} ({kind}{self.producer}{at})"


def mixed_devices(m: Module, graphs: Iterable[Graph] | None = None
                  ) -> dict[str, list[DeviceUse]]:
    """The tensor values of each device kind where a module's graphs hold tensors of more than
    one (empty where they hold one): the evidence for `TargetError`'s reason."""
    uses: dict[str, list[DeviceUse]] = {}
    for g in (top_graphs(m) if graphs is None else graphs):
        vals = [(p, "input", "") for p in g.params]
        vals += [(r, n.op, str(n.loc) if n.loc is not None else "")
                 for n in g.nodes for r in n.results]
        for v, producer, where in vals:
            if isinstance(v.type, TensorType):
                uses.setdefault(device_kind(v.type.device), []).append(
                    DeviceUse(g.name, v.name, v.type, producer, where))
    return uses if len(uses) > 1 else {}


def mixed_reason(uses: Mapping[str, list[DeviceUse]], shown: int = 4) -> str:
    """Which values sit on the minority devices (the device with the most values is taken as
    the graph's own): `cpu: @forward %arg3: i64[] (0-dim input)`. A CPU tensor in a CUDA graph
    is usually a tensor the model built without a device (`torch.tensor(x)`, an `arange`
    without device=); a 0-dim one eager reads as a scalar."""
    main = max(uses, key=lambda k: len(uses[k]))
    parts = []
    for kind in sorted(k for k in uses if k != main):
        vs = uses[kind]
        more = f", and {len(vs) - shown} more" if len(vs) > shown else ""
        parts.append(f"{kind}: " + "; ".join(u.text() for u in vs[:shown]) + more)
    return f"{len(uses[main])} {main} values; on other devices: " + " | ".join(parts)


@dataclass(frozen=True)
class ScalarInputs:
    """CPU inputs of a graph otherwise on one device, retyped onto it (targets/
    device_constants.py: 0-dim ones, eager's scalar operands of device ops, and ones the graph
    computes from or copies to the device). The caller moves them there per call; an input
    seen before, the same tensor unchanged (a constant lifted to an input, the same object
    every call), is moved once. `positions`: per graph, the parameters to move."""

    module: Module
    device: str
    positions: dict[str, tuple[int, ...]]
    # (graph, position) -> (the CPU tensor, its version, its copy on the device)
    _moved: dict[tuple[str, int], tuple[torch.Tensor, int, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False)

    def move(self, graph: str, inputs: Sequence[Any]) -> Sequence[Any]:
        at = self.positions.get(graph)
        if not at:
            return inputs
        out = list(inputs)
        for i in at:
            x = out[i]
            if isinstance(x, torch.Tensor) and x.device.type == "cpu":
                if x.is_inference():  # no version counter to tell a change: moved per call
                    out[i] = x.to(self.device, non_blocking=True)
                    continue
                seen = self._moved.get((graph, i))
                if seen is not None and seen[0] is x and seen[1] == x._version:
                    out[i] = seen[2]
                    continue
                out[i] = x.to(self.device, non_blocking=True)
                self._moved[(graph, i)] = (x, x._version, out[i])
        return out


def scalar_inputs_to_device(m: Module) -> ScalarInputs | None:
    """Where every value off the module's main device (one non-CPU device) is a CPU value
    computed on that device just as well (`cpu_values_to_device`): a copy of the module with
    them typed on it, and the CPU inputs to move. None otherwise: a real mixed graph, refused
    by `target_for` with its values named."""
    from ember.inductor.targets.device_constants import cpu_values_to_device

    uses = mixed_devices(m)
    if len(uses) != 2 or "cpu" not in uses:
        return None
    main = next(k for k in uses if k != "cpu")
    devices = {u.type.device for u in uses[main]}
    if len(devices) != 1:
        return None
    device = next(iter(devices))
    moved = cpu_values_to_device(m, top_graphs(m), device)
    if moved is None or mixed_devices(moved[0]):
        return None
    return ScalarInputs(moved[0], device, moved[1])


def target_for(m: Module, graphs: Iterable[Graph] | None = None) -> Target:
    """The target of a module's device (refused when it has none: `TargetError`). A module
    mixing devices is refused with the values on the other devices named (`mixed_reason`)."""
    try:
        return target_for_devices(module_devices(m, graphs), "the module")
    except TargetError as e:
        uses = mixed_devices(m, graphs)
        if not uses:
            raise
        raise TargetError(f"{e}: {mixed_reason(uses)}") from None


def require_device(m: Module, graphs: Iterable[Graph], kind: str, what: str) -> None:
    """A target's own passes refuse graphs on another device: `what` (say "codegen-cpp")
    emits code for `kind` only."""
    for g in graphs:
        other = sorted(d for d in graph_devices(g) if device_kind(d) != kind)
        if other:
            raise TargetError(f"{what}: graph @{g.name} is on {', '.join(other)}; {what} "
                              f"generates {kind} code only (registered targets: {_known()})")


__all__ = ["ScalarInputs", "scalar_inputs_to_device", "DeviceUse", "FusionHooks", "add_target", "FusionVeto", "Rule", "Target", "TargetError",
           "device_kind", "graph_devices", "mixed_devices", "mixed_reason", "module_devices", "register_target", "require_device",
           "target_for", "target_for_devices", "targets", "top_graphs", "unregister_target"]
