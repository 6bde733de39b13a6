"""Partitioners: which forward values @forward saves for @backward, and which @backward
recomputes (AOTAutograd's partitioner).

Every policy cuts the same joint graph; they differ in the set `keep` of forward values where
the backward stops walking back: a forward value the backward reads that is in `keep` (or is a
parameter) is saved, any other is recomputed in the backward from saved ones. Random draws are
always kept (the backward has no seed), so forward and backward see the same dropout mask.

- `save-all`: keep every forward value (the split of docs/autograd.md: the backward recomputes
  only what the forward never computed);
- `recompute-all`: keep only the parameters (and random draws): the backward recomputes the
  whole forward chain it needs;
- `min-cut`: a minimum s-t cut (networkx max-flow) over the forward values, each costing its
  bytes when saved (an input nothing: the caller holds it anyway, so the cut saves a weight `W`
  rather than the transposed copy `W^T` the forward would have to materialize); results of matmul, convolution, random draws and extern (aten) ops may not
  be recomputed (AOTAutograd's ban list), so the cut saves a matmul's output rather than its
  inputs only where that is smaller. A value the forward would not write at all (every forward
  reader fuses with it) costs twice its bytes, as in AOTAutograd: saving it adds a write to the
  forward, where saving a matmul's output only holds a buffer that exists anyway. Any cut is a
  valid partition, save-all's included, so the min-cut's weighted cost never exceeds save-all's
  (its bytes can, by a row statistic: cross-entropy saves the logits and row max, not exp(x - max)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import networkx as nx

from ember.ir import Graph, Node, TensorType, Value
from ember.ir.expr import evaluate
from ember.prims import PRIMS_BY_OP

POLICIES = ("save-all", "recompute-all", "min-cut")
# ops whose results the backward never recomputes (costly, or random)
NO_RECOMPUTE = frozenset({"prims.matmul", "prims.convolution", "prims.philox_uniform",
                          "prims.sort", "prims.topk"})
# reductions: a row statistic (softmax's max and sum, a norm's mean and variance) is a few
# bytes to save, while recomputing it makes the backward read the whole operand again, often
# in a kernel of its own (as AOTAutograd saves softmax's max and logsumexp, a norm's rstd)
NO_RECOMPUTE_REDUCTIONS = frozenset({"prims.sum", "prims.prod", "prims.amax", "prims.amin",
                                     "prims.argmax", "prims.argmin"})
INF = float("inf")
# prims a kernel reads inline (a fused load, never a buffer of their operand's own): the
# elementwise and reduction prims and the views
VIEWS = frozenset(f"prims.{n}" for n in ("broadcast_in_dim", "reshape", "permute", "slice",
                                          "squeeze", "unsqueeze", "rev"))
FUSED_READERS = frozenset(
    {p.op for p in PRIMS_BY_OP.values() if p.elementwise or p.reduction is not None}
    | VIEWS | {"prims.concatenate", "prims.pad", "graph.stop_gradient"}) - NO_RECOMPUTE


@dataclass
class PartitionReport:
    policy: str
    saved: int  # values the forward saves
    saved_bytes: int  # their bytes per call (at the size hints for symbolic shapes)
    recomputed: int  # forward nodes the backward recomputes
    # the bytes of saved values that are not the forward's inputs: what a training step keeps
    # alive for the backward beyond the tensors the caller holds anyway (parameters, the batch)
    activation_bytes: int = 0

    def text(self) -> str:
        return (f"partitioner {self.policy}: saves {self.saved} value(s), {self.saved_bytes} "
                f"bytes per call ({self.activation_bytes} beyond the inputs); recomputes "
                f"{self.recomputed} forward op(s) in the backward")


def nbytes(v: Value, hints: dict[str, int]) -> int:
    """A value's bytes (numbers: 8), symbolic dims at their hints."""
    t = v.type
    if not isinstance(t, TensorType):
        return 8
    n = 1
    for d in t.shape:
        try:
            n *= evaluate(d, hints)
        except Exception:  # an unbound symbol: count it as large, so it is not preferred
            n *= 1 << 20
    return n * t.dtype.torch.itemsize


def _no_recompute(op: str) -> bool:
    if op == "graph.stop_gradient":  # the identity (stop.py): free to recompute
        return False
    return op in NO_RECOMPUTE or op in NO_RECOMPUTE_REDUCTIONS or not op.startswith("prims.")


def choose_keep(policy: str, j: Graph, fwd_params: list[Value], fwd_nodes: list[Node],
                hints: dict[str, int]) -> set[Value]:
    """The forward values the backward does not recompute, by policy."""
    if policy not in POLICIES:
        raise ValueError(f"unknown partitioner {policy!r}; choose one of {', '.join(POLICIES)}")
    randoms = {r for n in fwd_nodes if n.op == "prims.philox_uniform" for r in n.results}
    if policy == "save-all":
        return set(fwd_params) | {r for n in fwd_nodes for r in n.results}
    if policy == "recompute-all":
        return set(fwd_params) | randoms
    return _min_cut(j, fwd_params, fwd_nodes, hints)


def _min_cut(j: Graph, fwd_params: list[Value], fwd_nodes: list[Node],
             hints: dict[str, int]) -> set[Value]:
    src, snk = "source", "sink"
    g = nx.DiGraph()
    g.add_node(src)
    g.add_node(snk)
    in_fwd = set(fwd_params)
    for p in fwd_params:
        # an input the caller holds anyway (a parameter, the batch) costs nothing to save, so
        # the cut saves `W` rather than a transposed copy `W^T` the forward would materialize
        g.add_edge(src, (p, 0), capacity=INF)
        g.add_edge((p, 0), (p, 1), capacity=0)
    fwd_ids = set(map(id, fwd_nodes))
    written = _written(j, fwd_nodes)
    for n in fwd_nodes:
        ops = [o for o in n.operands() if o in in_fwd]
        for r in n.results:
            # (a value the forward never writes: saving it adds the write, see the docstring)
            cost = nbytes(r, hints) * (1 if r in written or _no_recompute(n.op) else 2)
            g.add_edge((r, 0), (r, 1), capacity=cost)
            if _no_recompute(n.op):
                g.add_edge(src, (r, 0), capacity=INF)
            for o in ops:
                g.add_edge((o, 1), (r, 0), capacity=INF)
        in_fwd.update(n.results)
    for n in j.nodes:  # what the backward side reads
        if id(n) in fwd_ids:
            continue
        for o in n.operands():
            if o in in_fwd:
                g.add_edge((o, 1), snk, capacity=INF)
    for o in j.outputs:
        if o in in_fwd:
            g.add_edge((o, 1), snk, capacity=INF)
    _, (reach, _rest) = nx.minimum_cut(g, src, snk)
    return {v for v in in_fwd if (v, 0) in reach and (v, 1) not in reach}


def _written(j: Graph, fwd_nodes: list[Node]) -> set[Value]:
    """The forward values the forward writes to memory whatever is saved: its results, the
    operands of readers that need a buffer (a matmul's, an extern's), and values read again
    after such a reader that depends on them (a residual sum read by a norm and, past the
    next matmul, by the next residual add: no one kernel holds both reads). Not views: a
    saved view is a copy, where its operand is the buffer itself."""
    k = j.attrs.get("forward_outputs", len(j.outputs))
    results = set(j.outputs[:k if isinstance(k, int) else len(j.outputs)])
    out = set(results)
    # past[v]: the values v depends on through at least one buffer-reading op
    past: dict[Value, frozenset[Value]] = {}
    reach: dict[Value, frozenset[Value]] = {}  # every value v depends on, v included
    for n in fwd_nodes:
        ops = list(n.operands())
        fused = n.op in FUSED_READERS
        if not fused:
            out.update(ops)
        below = frozenset().union(*(reach.get(o, frozenset((o,))) for o in ops))
        through = below if not fused else frozenset().union(
            *(past.get(o, frozenset()) for o in ops))
        out.update(o for o in ops if o in through)
        for r in n.results:
            past[r] = through
            reach[r] = below | {r}
    return out - {r for n in fwd_nodes if n.op in VIEWS for r in n.results if r not in results}


def backward_nodes(j: Graph, roots: list[Value], keep: set[Value], in_fwd: set[Value],
                   fwd_ids: set[int]) -> tuple[list[Node], list[Node]]:
    """The nodes the backward runs for `roots`, walking back until a kept value; forward nodes
    among them (recomputed) are copies. Returns (nodes, the copies)."""
    need = {r for r in roots if r not in keep}
    picked: list[Node] = []
    for n in reversed(j.nodes):
        if any(r in need for r in n.results):
            picked.append(n)
            need.update(o for o in n.operands() if o not in keep)
    picked.reverse()
    out: list[Node] = []
    copies: list[Node] = []
    for n in _recompute_late(picked, fwd_ids):
        if id(n) in fwd_ids:
            c = dataclasses.replace(n, args=list(n.args), kwargs=dict(n.kwargs),
                                    results=list(n.results))
            copies.append(c)
            out.append(c)
        else:
            out.append(n)
    return out, copies


def _recompute_late(nodes: list[Node], fwd_ids: set[int]) -> list[Node]:
    """`nodes` (in order) with each recomputed forward node moved to just before its first
    backward consumer: in the joint order they all come first, so every recomputed activation
    would be live from the backward's start to its last use. Still topological: a recomputed
    node reads only saved values and other recomputed nodes, placed before it on demand."""
    made = {r: n for n in nodes if id(n) in fwd_ids for r in n.results}
    placed: set[int] = set()
    out: list[Node] = []

    def place(n: Node) -> None:
        stack = [(n, False)]
        while stack:
            m, ready = stack.pop()
            if id(m) in placed:
                continue
            if ready:
                placed.add(id(m))
                out.append(m)
                continue
            stack.append((m, True))
            for o in reversed(list(m.operands())):
                d = made.get(o)
                if d is not None and id(d) not in placed:
                    stack.append((d, False))

    for n in nodes:
        if id(n) not in fwd_ids:
            place(n)
    for n in nodes:  # recomputed values only a graph output reads
        if id(n) not in placed:
            place(n)
    return out
