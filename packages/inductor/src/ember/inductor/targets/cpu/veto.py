"""What the CPU target's fusion vetoes (broadcast.py, multipass.py, gather.py) read of a
producer and the kernel that would inline it: the pair each of them judges (a single-result
`loop.pointwise` producer into a pointwise or reduction reader), the kernels' bodies, their
element counts, and which of a body's parameters are bound to given values."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from ember.ir import Arg, Graph, Module, Node, Ref, Value

READERS = ("loop.pointwise", "loop.reduction")


def loop_body(m: Module, n: Node) -> Graph | None:
    """The body graph a loop node (`loop.pointwise`, `loop.reduction`, `loop.reduce`) names as
    its first argument, or None."""
    ref = n.args[0] if n.args else None
    g = m.items.get(ref.name) if isinstance(ref, Ref) else None
    return g if isinstance(g, Graph) else None


def numel(ranges: object) -> int | None:
    """The iterations of a domain's `ranges`; None where a size is symbolic (no count to judge
    by)."""
    if not isinstance(ranges, list) or not all(isinstance(d, int) for d in ranges):
        return None
    return math.prod(ranges)


def bound(g: Graph, args: Sequence[Arg], values: Collection[Value]) -> set[Value]:
    """The parameters of body `g` whose arguments (`args`: the loop node's operands after its
    body reference) are among `values`."""
    return {p for p, a in zip(g.params, args, strict=False)
            if isinstance(a, Value) and a in values}


def pointwise_pair(m: Module, producer: Node, consumer: Node,
                   readers: Collection[str] = READERS) -> tuple[Graph, Graph] | None:
    """The bodies of `producer` and `consumer` where `producer` is a single-result
    `loop.pointwise` and `consumer` one of `readers`; None for any other pair (a veto keeps
    out of its way)."""
    if producer.op != "loop.pointwise" or len(producer.results) != 1 \
            or consumer.op not in readers:
        return None
    pbody, cbody = loop_body(m, producer), loop_body(m, consumer)
    return None if pbody is None or cbody is None else (pbody, cbody)


__all__ = ["READERS", "bound", "loop_body", "numel", "pointwise_pair"]
