"""Split a graph at gradient-bucket boundaries, so that DDP's all-reduce overlaps the backward.

DDP all-reduces gradients bucket by bucket, each as soon as all of its gradients are ready. A
compiled training graph is one autograd node: every gradient it computes is ready only when its
whole backward has run, so no communication overlaps computation. Cut into pieces whose
parameters fill about one bucket each, every piece is its own autograd node: the backward runs
the pieces last-first, and the buckets of the later pieces are all-reduced while the earlier
pieces' backward still computes (TorchDynamo's DDP optimizer makes the same cut).

`split_buckets` is a pure Module -> Module function (and the pass `split-buckets`): the graph
becomes a chain of `graph.call`s of pieces `@<graph>_b0`, `@<graph>_b1`, ... in forward order;
every value a later piece or the graph's results need crosses as a result of its piece.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ember.ir import Module
from ember.ir.graph import Graph, Kernel, Node, Ref, Value, map_args
from ember.ir.passes import PipelineError, register_pass
from ember.ir.types import TensorType

# DDP's default bucket cap (25 MiB), used where the caller names none
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass
class BucketPlan:
    """Where a graph was cut: the node index each piece starts at, and per piece the graph
    parameters (by index) it holds and their bytes."""

    starts: list[int]
    params: list[list[int]]
    bytes: list[int]

    def text(self) -> str:
        sizes = ", ".join(f"{b} B ({len(p)} param(s))" for b, p in zip(self.bytes, self.params,
                                                                     strict=True))
        return f"{len(self.starts)} piece(s) at DDP's gradient buckets: {sizes}"


def _bytes(v: Value) -> int:
    t = v.type
    if not isinstance(t, TensorType):
        return 0
    n = 1
    for d in t.shape:
        if not isinstance(d, int):
            return 0  # a symbolic size: counted as nothing (DDP's buckets hold parameters,
            # whose sizes are static)
        n *= d
    return n * t.dtype.itemsize


def plan_buckets(graph: Graph, params: Sequence[int], cap: int) -> BucketPlan:
    """Cut points for `graph` so that each piece uses about `cap` bytes of the parameters
    `params` (indices into the graph's parameters). The nodes are walked last-first, as the
    backward meets them; a parameter counts for the piece of its last use in the forward."""
    if cap <= 0:
        raise ValueError(f"split-buckets: the bucket cap must be positive, not {cap}")
    wanted = {graph.params[i]: i for i in params}
    seen: set[int] = set()
    pieces: list[tuple[int, list[int], int]] = []  # (start, params, bytes), last piece first
    held: list[int] = []
    size = 0
    for k in range(len(graph.nodes) - 1, -1, -1):
        if size >= cap:  # the bucket is full: the nodes after k are a piece
            pieces.append((k + 1, held, size))
            held, size = [], 0
        for v in graph.nodes[k].operands():
            i = wanted.get(v)
            if i is not None and i not in seen:
                seen.add(i)
                held.append(i)
                size += _bytes(v)
    pieces.append((0, held, size))
    pieces.reverse()
    # a first piece holding no parameter is merged into the next: it would only add a node
    while len(pieces) > 1 and not pieces[0][1]:
        pieces = [(0, pieces[1][1], pieces[1][2]), *pieces[2:]]
    return BucketPlan([p[0] for p in pieces], [sorted(p[1]) for p in pieces],
                      [p[2] for p in pieces])


def _piece(name: str, nodes: list[Node], needed_after: set[Value]) -> tuple[Graph, list[Value],
                                                                         list[Value]]:
    """A graph of `nodes`: its parameters are the values it reads from outside (in order of
    first use), its results the values it defines that are needed after it."""
    defined = {r for n in nodes for r in n.results}
    inputs: list[Value] = []
    for n in nodes:
        for v in n.operands():
            if v not in defined and v not in inputs:
                inputs.append(v)
    outputs = [r for n in nodes for r in n.results if r in needed_after]
    vmap = {v: Value(v.name, v.type) for v in inputs}

    def sub(v: Value) -> Value:
        return vmap.get(v, v)

    body: list[Node] = []
    for n in nodes:
        m = Node(n.op, [map_args(a, sub) for a in n.args],
                 {k: map_args(a, sub) for k, a in n.kwargs.items()}, [], n.loc, n.pos)
        for i, r in enumerate(n.results):
            q = Value(r.name, r.type, m, i)
            vmap[r] = q
            m.results.append(q)
        body.append(m)
    g = Graph(name, [vmap[v] for v in inputs], [o.type for o in outputs], body,
              [vmap[o] for o in outputs])
    return g, inputs, outputs


def split_buckets(module: Module, params: Sequence[int], cap: int = DEFAULT_BUCKET_BYTES,
                  graph: str | None = None) -> tuple[Module, BucketPlan]:
    """`module` with its graph (the first, or `graph`) as a chain of `graph.call`s of pieces,
    cut by `plan_buckets`; with one piece, the module unchanged."""
    src = module.graph(graph)
    plan = plan_buckets(src, params, cap)
    if len(plan.starts) < 2:
        return module, plan
    out = module.clone()
    g = out.graph(src.name)
    bounds = [*plan.starts, len(g.nodes)]
    # what is needed after each piece: the graph's outputs, and every later piece's reads
    needed: list[set[Value]] = []
    later: set[Value] = set(g.outputs)
    for j in range(len(plan.starts) - 1, -1, -1):
        needed.append(set(later))
        for n in g.nodes[bounds[j]:bounds[j + 1]]:
            later.update(n.operands())
    needed.reverse()
    calls: list[Node] = []
    pieces: list[Graph] = []
    env: dict[Value, Value] = {p: p for p in g.params}
    for j in range(len(plan.starts)):
        name = _fresh(out, f"{g.name}_b{j}")
        piece, reads, defines = _piece(name, g.nodes[bounds[j]:bounds[j + 1]], needed[j])
        pieces.append(piece)
        call = Node("graph.call", [Ref(name), *(env[v] for v in reads)], {}, [], None, None)
        for i, v in enumerate(defines):
            r = Value(v.name, v.type, call, i)
            call.results.append(r)
            env[v] = r
        calls.append(call)
    top = Graph(g.name, list(g.params), list(g.result_types), calls,
                [env[o] for o in g.outputs], dict(g.attrs), g.pos)
    items: dict[str, Graph | Kernel] = {}
    for key, item in out.items.items():
        if key == g.name:
            for p in pieces:
                items[p.name] = p
            items[key] = top
        else:
            items[key] = item
    out.items = items
    return out, plan


def _fresh(module: Module, name: str) -> str:
    k, cand = 0, name
    while cand in module.items:
        k += 1
        cand = f"{name}_{k}"
    return cand


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(":") if t]
    except ValueError:
        raise PipelineError(f"split-buckets: params= takes parameter indices separated by ':', "
                         f"not {text!r}") from None


@register_pass("split-buckets", "cut a graph into a chain of graph.calls whose parameters "
               "(params=i:j:..., indices; default every parameter) fill about bytes= each "
               "(DDP's gradient buckets, so its all-reduce overlaps the backward)")
def split_buckets_pass(module: Module, *, graph: str = "", params: str = "",
                       bytes: int = DEFAULT_BUCKET_BYTES) -> Module:
    if bytes <= 0:
        raise PipelineError(f"split-buckets: bytes= must be positive, not {bytes}")
    g = module.graph(graph or None)
    which = _ints(params) if params else list(range(len(g.params)))
    bad = [i for i in which if not 0 <= i < len(g.params)]
    if bad:
        raise PipelineError(f"split-buckets: @{g.name} has {len(g.params)} parameter(s); no "
                         f"parameter {bad[0]}")
    return split_buckets(module, which, bytes, graph or None)[0]


def piece_modules(module: Module, graph: str | None = None) -> Mapping[str, Module]:
    """Each piece of a split graph as a module of its own (its symbols kept), by name."""
    top = module.graph(graph)
    out: dict[str, Module] = {}
    for n in top.nodes:
        ref = n.args[0]
        assert n.op == "graph.call" and isinstance(ref, Ref)
        m = module.clone()
        m.items = {ref.name: m.graph(ref.name)}
        out[ref.name] = m
    return out
