"""CPU constants of a device graph computed on the device: `~torch.zeros(shape).to(device)`.

A model that builds a tensor without a device and moves it (timm's edgenext: its positional
encoding's mask is `torch.zeros(shape).to(device=weight.device)`) is captured with that tensor
made on the CPU: a CUDA graph holding CPU values, which no target compiles ("tensors on several
devices"). Where those CPU values come from no graph input (factory ops and what is computed
from them alone), are no result of the graph, and reach the device only through copies to it,
computing them on the device gives the same values (the ops are the same, on the same
dtypes): `constants_to_device` retypes them onto the graph's device, and the copies become
same-device copies. Anything else off the device stays as it was (refused with its values
named, or moved per call by `ScalarInputs` when it is an input).
"""

from __future__ import annotations

from ember.ir import Graph, Module, Node, TensorType, Value

_COPY = "aten._to_copy.default"


def _device_kind(device: str) -> str:
    return device.split(":", 1)[0]


def _cpu_results(n: Node) -> bool:
    return any(isinstance(r.type, TensorType) and _device_kind(r.type.device) == "cpu"
               for r in n.results)


def _movable(g: Graph, device: str) -> list[Node] | None:
    """The nodes of `g` that compute CPU values from no input, when every such value is used
    only by such nodes or by copies to `device` and none is returned; None when some CPU
    value of `g` is not of that kind."""
    params = {p for p in g.params if isinstance(p.type, TensorType)}
    if any(_device_kind(p.type.device) == "cpu" for p in params  # type: ignore[union-attr]
           ):
        return None
    cpu = [n for n in g.nodes if _cpu_results(n)]
    made = {r for n in cpu for r in n.results}
    if not cpu or any(o in made for o in g.outputs):
        return None
    for n in cpu:  # computed from constants only: every tensor operand is such a CPU value
        for a in [*n.args, *n.kwargs.values()]:
            if isinstance(a, Value) and isinstance(a.type, TensorType) and a not in made:
                return None
        dev = n.kwargs.get("device")
        if dev is not None and not (isinstance(dev, str) and _device_kind(dev) == "cpu"):
            return None
    for n in g.nodes:  # ... and read on the device only through a copy to it
        if n in cpu:
            continue
        reads = [a for a in [*n.args, *n.kwargs.values()] if isinstance(a, Value) and a in made]
        if reads and not (n.op == _COPY and n.kwargs.get("device") == device):
            return None
    return cpu


def constants_to_device(m: Module, graphs: list[Graph], device: str) -> Module | None:
    """A copy of `m` with the CPU constants of `graphs` (their names) computed on `device`,
    or None where some graph holds a CPU value of another kind (or none at all)."""
    names = [g.name for g in graphs]
    found = {name: _movable(m.graph(name), device) for name in names}
    if not any(found.values()) or any(
            v is None and any(_cpu_results(n) for n in m.graph(k).nodes)
            for k, v in found.items()):
        return None
    out = m.clone()
    for name in names:
        g = out.graph(name)
        for n in g.nodes:
            if not _cpu_results(n):
                continue
            for r in n.results:
                if isinstance(r.type, TensorType):
                    t = r.type
                    r.type = TensorType(t.dtype, t.shape, t.strides, device)
            if isinstance(n.kwargs.get("device"), str):
                n.kwargs["device"] = device
        g.result_types = [o.type for o in g.outputs]
    return out
