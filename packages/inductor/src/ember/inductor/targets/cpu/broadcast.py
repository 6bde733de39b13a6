"""The CPU target's fusion veto: a small costly value broadcast along a kernel's innermost loop
is written once, not recomputed per element.

`fuse` inlines a single-reader pointwise producer into its reader (rule 1). Where the producer
is a broadcast (a squeeze-excitation gate sigmoid(s) of [N, 1, 1, C] read by the
[N, H, W, C] scale), the inlined body runs at every element of the reader: H * W exps per
value (3136 in efficientnet_b0's 56x56 blocks), and along the innermost loop no compiler
hoists it. The veto keeps such a producer a kernel of its own when its body holds a costly op
(exp, log, tanh, erf, pow, sqrt, trigonometric...), the reader covers at least `BROADCAST`
times its elements, and the reader's loads of it move with a loop variable that some access
of the reader moves along contiguously (its output's last dim, another load's last index:
schedule-cpu makes one of those the innermost loop; an NHWC reader's channels). A value
that only moves with outer loops (a layer norm's per-row rstd along its columns, a
per-channel value over an NCHW image) is hoisted by the C++ compiler and still fuses.
"""

from __future__ import annotations

import re

from ember.inductor.indexing import index_text
from ember.inductor.targets.cpu.veto import bound, numel, pointwise_pair
from ember.ir import Graph, Module, Node

_VAR = re.compile(r"\bi\d+\b")
# the reader covers at least this many times the producer's elements
BROADCAST = 16
COSTLY = frozenset(f"prims.{op}" for op in (
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "erf", "erfc", "erfinv",
    "pow", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh",
    "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma"))


def broadcast_veto(m: Module, g: Graph, producer: Node, consumer: Node) -> str | None:
    """Why `producer` stays a kernel of its own rather than fusing into `consumer`, or None."""
    pair = pointwise_pair(m, producer, consumer, ("loop.pointwise",))
    if pair is None:
        return None
    pn, cn = numel(producer.kwargs.get("ranges")), numel(consumer.kwargs.get("ranges"))
    if pn is None or cn is None or cn < BROADCAST * pn:
        return None
    pbody, cbody = pair
    costly = next((n.op for n in pbody.nodes if n.op in COSTLY), None)
    if costly is None:
        return None
    ranges = consumer.kwargs["ranges"]
    assert isinstance(ranges, list)
    r = producer.results[0]
    params = bound(cbody, consumer.args[1:], {r})
    # the loop variables the producer's value moves with, and those some access moves along
    # contiguously: the output's last dim, each other load's last index (schedule-cpu puts
    # one of them innermost). Top-level loads only: a reduction's run per outer index.
    mine: set[str] = set()
    fast = {f"i{len(ranges) - 1}"}
    for n in cbody.nodes:
        if n.op != "loop.load" or not n.args:
            continue
        raw = n.kwargs.get("index")
        index = [index_text(x) for x in raw] if isinstance(raw, list) else []
        if n.args[0] in params:
            mine.update(v for x in index for v in _VAR.findall(x))
        elif index:
            fast.update(_VAR.findall(index[-1]))
    if mine & fast:
        return (f"%{r.name} ({pn} values, {costly}) is a broadcast along the reader's "
                f"contiguous dim: inlined, it would be recomputed for each of the reader's "
                f"{cn} elements")
    return None


__all__ = ["BROADCAST", "COSTLY", "broadcast_veto"]
