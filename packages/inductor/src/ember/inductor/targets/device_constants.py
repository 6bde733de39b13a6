"""The CPU values of a device graph computed on the device: what eager would have moved.

A model captured with CUDA inputs can still hold CPU tensors, made without a device:
- timm's edgenext builds `~torch.zeros(shape).to(device=weight.device)`: a CPU factory result
  reaching the device only through a copy;
- HF deberta-v2 scales attention by `torch.sqrt(torch.tensor(q.size(-1), dtype=float) * s)`:
  a 0-dim CPU constant (lifted to a graph input), a 0-dim `mul` and `sqrt` on the CPU, read
  by a CUDA `div` as a scalar operand (eager allows 0-dim CPU operands of CUDA ops; so does
  torch.compile);
- transformers' caches make `torch.tensor([], device=...)`: a CPU input only copied to the
  device; a static cache's `cumulative_length` is a 0-dim CPU input.
A graph holding them is a CUDA graph with CPU values, which no target compiles ("tensors on
several devices"). Where every CPU value is of those kinds, computing it on the device gives
the values eager would have (the same ops on the same dtypes; only random ops differ by
device, and they stay refused): `cpu_values_to_device` retypes the CPU nodes onto the graph's
device and names the CPU inputs the caller moves there (`ScalarInputs`, which moves an input
it saw before, unchanged, once). Anything else stays refused with its values named.
"""

from __future__ import annotations

from ember.ir import Graph, Module, Node, TensorType, Value

_COPY = "aten._to_copy.default"
# ops whose values depend on the device's generator: computed elsewhere, they would differ
_RANDOM = ("rand", "bernoulli", "normal", "dropout", "multinomial", "exponential", "poisson",
           "uniform", "cauchy", "geometric", "philox")


def _device_kind(device: str) -> str:
    return device.split(":", 1)[0]


def _on_cpu(v: Value) -> bool:
    return isinstance(v.type, TensorType) and _device_kind(v.type.device) == "cpu"


def _operands(n: Node) -> list[Value]:
    return [a for a in [*n.args, *n.kwargs.values()] if isinstance(a, Value)]


def _cpu_results(n: Node) -> bool:
    return any(_on_cpu(r) for r in n.results)


def _why_not(g: Graph, device: str) -> str | None:
    """Why `g`'s CPU values cannot all be computed on `device` (None: they can). They can
    where: none is returned; every node with a CPU result has only CPU tensor results, reads
    only CPU tensors, is not random and names no other device; and every other node reading
    one is a copy to `device`, or reads only 0-dim ones (eager's scalar operands) into tensor
    results."""
    cpu = {p for p in g.params if _on_cpu(p)}
    for n in g.nodes:
        if not _cpu_results(n):
            continue
        if not all(_on_cpu(r) for r in n.results if isinstance(r.type, TensorType)) or \
                not all(isinstance(r.type, TensorType) for r in n.results):
            return f"{n.op} has results on the CPU and elsewhere"
        if any(isinstance(a.type, TensorType) and a not in cpu for a in _operands(n)):
            return f"{n.op} reads a {device} tensor into a CPU one (a copy back to the host)"
        if any(w in n.op for w in _RANDOM):
            return f"{n.op} is random (its values depend on the device's generator)"
        dev = n.kwargs.get("device")
        if dev is not None and not (isinstance(dev, str) and _device_kind(dev) == "cpu"):
            return f"{n.op} names device {dev!r}"
        cpu.update(n.results)
    if not cpu:
        return "it holds no CPU value"
    if any(o in cpu for o in g.outputs):
        return "a CPU value is a result of the graph"
    for n in g.nodes:
        if _cpu_results(n):
            continue
        reads = [a for a in _operands(n) if a in cpu]
        if not reads or (n.op == _COPY and n.kwargs.get("device") == device):
            continue
        if any(isinstance(a.type, TensorType) and a.type.shape for a in reads):
            return f"{n.op} reads a CPU tensor that is not 0-dim without copying it"
        if not n.results or not all(isinstance(r.type, TensorType) for r in n.results):
            return f"{n.op} reads a 0-dim CPU tensor into a host value"
    return None


def cpu_values_to_device(m: Module, graphs: list[Graph], device: str
                         ) -> tuple[Module, dict[str, tuple[int, ...]]] | None:
    """A copy of `m` with the CPU values of `graphs` (the module's top graphs) on `device`,
    and per graph the positions of the CPU parameters the caller moves there; None where a
    graph holds a CPU value of another kind, or no graph holds one."""
    why = {g.name: _why_not(g, device) for g in graphs}
    if all(w is not None for w in why.values()) or any(
            w is not None and w != "it holds no CPU value" for w in why.values()):
        return None
    out = m.clone()
    positions: dict[str, tuple[int, ...]] = {}
    for name in (g.name for g in graphs):
        g = out.graph(name)
        at = tuple(i for i, p in enumerate(g.params) if _on_cpu(p))
        if at:
            positions[name] = at
        for v in [*g.params, *(r for n in g.nodes for r in n.results)]:
            t = v.type
            if isinstance(t, TensorType) and _device_kind(t.device) == "cpu":
                v.type = TensorType(t.dtype, t.shape, t.strides, device)
        for n in g.nodes:
            if isinstance(n.kwargs.get("device"), str) and \
                    _device_kind(str(n.kwargs["device"])) == "cpu":
                n.kwargs["device"] = device
        g.result_types = [o.type for o in g.outputs]
    return out, positions
