"""The CPU target's fusion veto: a transcendental value that a multi-pass kernel would compute
in each of its passes is written once instead.

A fused reduction (`loop.reduce`) runs as a pass over its row before the kernel's output pass
(cppkernel.py); a LayerNorm is three (mean, variance, output). A pointwise producer inlined
into such a reader (fuse's rule 1, or rule 5's recompute) is copied into every pass that reads
it: Whisper's conv stem `gelu(conv + bias) + positions`, read by the first LayerNorm, computed
its erf three times per element, and a fourth time in the residual add that recomputed it too.
The row a reader re-reads stays in cache, so one kernel writing the value and the passes
loading it cost less than the repeated erf (TorchInductor writes it once too).

The veto keeps such a producer a kernel of its own when its body holds an op from `COSTLY`
(exp, erf, tanh, log, trigonometric, pow...; not sqrt/rsqrt: a training backward's
`(x - mean) * rsqrt(var + eps)` is cheaper recomputed, docs/perf-notes.md) and the reader
loads it in more than one pass (its own body and its reductions' bodies), unless the producer
holds a reduction itself (softmax's `exp(x - max)`, whose exp the C++ kernel computes once). A value read by
one pass only (`sum(exp(x))`, a plain pointwise reader) still fuses.
"""

from __future__ import annotations

from ember.inductor.targets.cpu.broadcast import COSTLY as _BROADCAST_COSTLY
from ember.inductor.targets.cpu.veto import bound, loop_body, pointwise_pair
from ember.ir import Graph, Module, Node, Value

# sqrt/rsqrt of a per-row value read per element (a normalisation's xhat) stay recomputed
COSTLY = _BROADCAST_COSTLY - {"prims.sqrt", "prims.rsqrt"}


def _passes(m: Module, body: Graph, mine: set[Value], out: set[str]) -> None:
    """Add to `out` the name of each body (`body` and its reductions' bodies, each a pass over
    the row) that loads one of the values `mine`."""
    for n in body.nodes:
        if n.op == "loop.load" and n.args and n.args[0] in mine:
            out.add(body.name)
        elif n.op == "loop.reduce":
            sub = loop_body(m, n)
            smine = set() if sub is None else bound(sub, n.args[1:], mine)
            if sub is not None and smine:
                _passes(m, sub, smine, out)


def multipass_veto(m: Module, g: Graph, producer: Node, consumer: Node) -> str | None:
    """Why `producer` stays a kernel of its own rather than fusing into `consumer`, or None."""
    pair = pointwise_pair(m, producer, consumer)
    if pair is None:
        return None
    pbody, cbody = pair
    costly = next((n.op for n in pbody.nodes if n.op in COSTLY), None)
    # a producer holding a reduction (softmax's exp(x - max)) is a normalisation's own chain:
    # codegen computes softmax's exp once (the sum's pass stores it, cppkernel.py)
    if costly is None or any(n.op == "loop.reduce" for n in pbody.nodes):
        return None
    r = producer.results[0]
    mine = bound(cbody, consumer.args[1:], {r})
    passes: set[str] = set()
    _passes(m, cbody, mine, passes)
    if len(passes) > 1:
        return (f"%{r.name} ({costly}) would be computed in each of the reader's "
                f"{len(passes)} passes over it")
    return None


__all__ = ["COSTLY", "multipass_veto"]
