"""Shrink a graph on which a backend fails to a small repro: delta debugging over the graph's
nodes and outputs (Zeller and Hildebrandt's ddmin), every candidate a valid, verified module.

The failure: the backend raises (the same exception type and message prefix as on the
original graph), or its results disagree with the reference interpreter's beyond the
whole-graph tolerances of ember.runtime.check. A candidate reproduces it or is dropped.

Removing nodes keeps the module valid by cutting, not deleting: a removed node's result that a
kept node (or an output) uses becomes a new graph parameter, fed the value the reference
interpreter computed for it on the current inputs, so the kept nodes see exactly the values
they saw before. The kept nodes' results that nothing kept uses become outputs (so a cut never
hides a wrong value); later rounds drop the outputs the failure does not need, the nodes only
those fed (dead code) and the parameters nothing uses (a parameter that alone binds a size
symbol stays). Rounds of node ddmin then output ddmin repeat until neither shrinks the graph.

ddmin first tries keeping one chunk of the nodes (halves, then quarters, ...), then removing
one chunk, so a single faulty node among n is isolated in about 2 log2(n) runs of the backend.
Results are cached per candidate.

Not minimized: other graphs of the module (`graph.call` callees stay as they are) and input
values (the repro's inputs are the reference's values). The graph's `input_updates` are turned
into plain results first: every backend returns them as results anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import sympy
import torch

from ember.ir import (
    Graph,
    Interpreter,
    Module,
    Node,
    ScalarType,
    TensorType,
    Value,
    VerificationError,
    verify,
)
from ember.ir.backends import Runner, default_backends
from ember.ir.graph import map_args
from ember.runtime.check import (
    DEFAULT_TOLERANCE,
    Tolerance,
    compare_results,
    has_random_ops,
)
from ember.runtime.tensors import save_tensors

T = TypeVar("T")
Prepare = Callable[[Module], Runner]
PREFIX_CHARS = 40  # how much of an exception's message must stay the same


class MinimizeError(Exception):
    """The graph cannot be minimized: it does not fail, or the reference itself fails."""


@dataclass(frozen=True)
class Failure:
    """How a backend fails on a graph: it raises, or its results mismatch the reference's."""

    kind: str  # "raises" or "mismatch"
    summary: str  # one line, for people
    exc_type: str = ""
    prefix: str = ""  # the start of the message, numbers blanked (names and sizes shrink)

    def reproduced_by(self, other: Failure | None) -> bool:
        if other is None or other.kind != self.kind:
            return False
        return self.kind == "mismatch" or (other.exc_type == self.exc_type and
                                           other.prefix == self.prefix)


def _prefix(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r"^(\d+:\d+: )+", "", first)  # the node's position in the text
    return re.sub(r"\d+", "N", first)[:PREFIX_CHARS]


class _Invalid(Exception):
    """A candidate that is not a runnable module (the verifier or the reference refuses it)."""


def resolve_backend(backend: str | Prepare) -> Prepare:
    if callable(backend):
        return backend
    return default_backends().get(backend).prepare


def failure_of(module: Module, graph: str, inputs: Sequence[Any], backend: str | Prepare,
               tol: Tolerance = DEFAULT_TOLERANCE) -> Failure | None:
    """How `backend` fails on @graph with `inputs` (None: it agrees with the reference).
    Raises MinimizeError when the module does not verify or the reference itself fails."""
    try:
        return _failure(module, graph, list(inputs), resolve_backend(backend), tol)
    except _Invalid as e:
        raise MinimizeError(str(e)) from None


def _failure(module: Module, graph: str, inputs: list[Any], prepare: Prepare,
             tol: Tolerance) -> Failure | None:
    try:
        verify(module)
    except VerificationError as e:
        raise _Invalid(f"the module does not verify: {e.errors[0].message}") from None
    try:
        ref = Interpreter(module).run(_clones(inputs), graph)
    except Exception as e:
        raise _Invalid(f"the reference interpreter fails: {type(e).__name__}: {e}") from None
    try:
        got = prepare(module)(graph, _clones(inputs))
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        msg = " ".join(str(e).split())
        return Failure("raises", f"{type(e).__name__}: {msg[:300]}", type(e).__name__,
                       _prefix(str(e)))
    g = module.graph(graph)
    labels = [f"out{i}" for i in range(len(ref.outputs))]
    labels += [f"update of %{g.params[p].name}" for p in ref.updates]
    want = list(ref.outputs) + list(ref.updates.values())
    have = list(got.outputs) + [got.updates.get(p) for p in ref.updates]
    if len(got.outputs) != len(ref.outputs):
        return Failure("mismatch", f"{len(got.outputs)} outputs, the reference gives "
                                   f"{len(ref.outputs)}")
    bad = [d for d in compare_results(want, have, labels, tol) if not d.ok]
    if not bad:
        return None
    worst = max(bad, key=lambda d: d.max_abs if d.problem is None else float("inf"))
    return Failure("mismatch", worst.describe())


def _clones(xs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


# ---- ddmin --------------------------------------------------------------------------------


def ddmin(items: Sequence[T], test: Callable[[list[T]], bool]) -> list[T]:
    """A 1-minimal sublist of `items` (order kept) for which `test` holds; `test(items)` is
    assumed to hold. Tries keeping each of n chunks, then dropping each, then doubles n."""
    cur = list(items)
    n = 2
    while len(cur) >= 2:
        chunks = _split(cur, n)
        for c in chunks:
            if len(c) < len(cur) and test(c):
                cur, n = c, 2
                break
        else:
            for i in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                if rest and test(rest):
                    cur, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(cur):
                    break
                n = min(len(cur), 2 * n)
    return cur


def _split(xs: list[T], n: int) -> list[list[T]]:
    k, r = divmod(len(xs), n)
    out, start = [], 0
    for i in range(n):
        end = start + k + (1 if i < r else 0)
        if end > start:
            out.append(xs[start:end])
        start = end
    return out


# ---- cutting a graph ----------------------------------------------------------------------


@dataclass
class _State:
    """The graph being minimized, its inputs, and the reference's value of every value."""

    module: Module
    graph: Graph
    inputs: list[Any]
    values: dict[Value, Any] = field(default_factory=dict)


def _normalized(module: Module, graph: str) -> Module:
    """A copy whose @graph returns its input updates as plain results."""
    m = module.clone()
    m.graph(graph).attrs.pop("input_updates", None)
    return m


def _reference_values(module: Module, g: Graph, inputs: list[Any]) -> dict[Value, Any]:
    """Every value of `g` as the reference computes it: a copy of the graph returning all."""
    probe = g.clone()
    probe.outputs = [r for n in probe.nodes for r in n.results]
    probe.result_types = [r.type for r in probe.outputs]
    probe.attrs.pop("input_updates", None)
    m = module.clone()
    m.items[g.name] = probe
    res = Interpreter(m).run(_clones(inputs), g.name)
    mine = [r for n in g.nodes for r in n.results]
    out: dict[Value, Any] = dict(zip(g.params, inputs, strict=True))
    out.update(zip(mine, _clones(res.outputs), strict=True))
    return out


def _cut(st: _State, keep: Sequence[Node], outputs: Sequence[Value] | None
         ) -> tuple[Module, list[Any]]:
    """The module with @graph reduced to the nodes `keep`: removed nodes' used results become
    parameters holding the reference's values. `outputs`: the values to return (None: the
    graph's outputs still computed, plus every kept result nothing kept uses)."""
    g, kept = st.graph, set(keep)
    new: dict[Value, Value] = {}
    params: list[Value] = []
    vals: list[Any] = []
    for p, x in zip(g.params, st.inputs, strict=True):
        new[p] = Value(p.name, p.type)
        params.append(new[p])
        vals.append(x)

    def sub(v: Value) -> Value:
        if v not in new:  # a removed node's result: a parameter with the reference's value
            if not isinstance(v.type, TensorType | ScalarType):
                raise _Invalid(f"%{v.name} of type {v.type} cannot become an input")
            new[v] = Value(v.name, v.type)
            params.append(new[v])
            vals.append(st.values[v])
        return new[v]

    nodes: list[Node] = []
    for n in g.nodes:
        if n not in kept:
            continue
        m = Node(n.op, [map_args(a, sub) for a in n.args],
                 {k: map_args(a, sub) for k, a in n.kwargs.items()}, [], n.loc, n.pos)
        for i, r in enumerate(n.results):
            new[r] = Value(r.name, r.type, m, i)
            m.results.append(new[r])
        nodes.append(m)
    if outputs is None:
        used = {id(v) for n in keep for v in n.operands()}
        outs = [o for o in g.outputs if o.node is not None and o.node in kept]
        seen = {id(o) for o in outs}
        outs += [r for n in keep for r in n.results if id(r) not in used and id(r) not in seen]
    else:
        outs = list(outputs)
    out_vals = [sub(o) for o in outs]
    out_vals = [o for o in out_vals if o.node is not None]  # a bare input computes nothing
    nodes = _live(nodes, out_vals)
    return _assemble(st, params, vals, nodes, out_vals)


def _live(nodes: list[Node], outputs: list[Value]) -> list[Node]:
    """The nodes some output depends on (dead code removed)."""
    need = {id(v) for v in outputs}
    live: list[Node] = []
    for n in reversed(nodes):
        if any(id(r) in need for r in n.results):
            live.append(n)
            need.update(id(v) for v in n.operands())
    return live[::-1]


def _assemble(st: _State, params: list[Value], vals: list[Any], nodes: list[Node],
              outputs: list[Value]) -> tuple[Module, list[Any]]:
    g = st.graph
    used = {id(v) for n in nodes for v in n.operands()} | {id(o) for o in outputs}
    keep = [i for i, p in enumerate(params) if id(p) in used]
    bound = {s for i in keep for s in _bare_symbols(params[i])}
    needed = set().union(*(_symbols(r.type) for n in nodes for r in n.results),
                         *(_symbols(params[i].type) for i in keep))
    for i, p in enumerate(params):  # an unused parameter that alone binds a symbol stays
        if i not in keep and _bare_symbols(p) & (needed - bound):
            keep.append(i)
            bound |= _bare_symbols(p)
    keep.sort()
    index = {id(params[i]): j for j, i in enumerate(keep)}
    attrs = dict(g.attrs)
    attrs.pop("input_updates", None)
    philox = attrs.get("philox")
    if isinstance(philox, list) and len(philox) == 3:
        old = g.params
        s, o = (old[i] if isinstance(i, int) and i < len(old) else None for i in philox[:2])
        si, oi = (index.get(id(params[old.index(v)])) if v is not None else None
                  for v in (s, o))
        if si is None or oi is None:
            attrs.pop("philox")
        else:
            attrs["philox"] = [si, oi, philox[2]]
    graph = Graph(g.name, [params[i] for i in keep], [o.type for o in outputs], nodes,
                  outputs, attrs, g.pos)
    m = st.module.clone()
    m.items[g.name] = graph
    return m, [vals[i] for i in keep]


def _symbols(t: Any) -> set[str]:
    if not isinstance(t, TensorType):
        return set()
    dims = list(t.shape) + list(t.strides or [])
    return {s.name for d in dims if isinstance(d, sympy.Expr) for s in d.free_symbols
            if isinstance(s, sympy.Symbol)}


def _bare_symbols(p: Value) -> set[str]:
    t = p.type
    return {d.name for d in t.shape if isinstance(d, sympy.Symbol)} \
        if isinstance(t, TensorType) else set()


# ---- the minimizer ------------------------------------------------------------------------


@dataclass
class Repro:
    """The minimized module (its graph `graph`), its inputs, and what it reproduces."""

    module: Module
    graph: str
    inputs: list[Any]
    failure: Failure
    nodes_before: int
    runs: int  # how many candidates were run on the backend

    @property
    def nodes(self) -> int:
        return len(self.module.graph(self.graph).nodes)

    def write(self, path: str | Path) -> tuple[Path, Path]:
        """OUT.ir and its inputs, OUT.inputs.safetensors (keyed by parameter name)."""
        p = Path(path)
        stem = p.name[:-3] if p.name.endswith(".ir") else p.name
        ins = p.with_name(stem + ".inputs.safetensors")
        g = self.module.graph(self.graph)
        save_tensors(str(ins), {q.name: x for q, x in zip(g.params, self.inputs, strict=True)})
        p.write_text(str(self.module))
        return p, ins


def minimize(module: Module, inputs: Sequence[Any], backend: str | Prepare, *,
             graph: str | None = None, tol: Tolerance = DEFAULT_TOLERANCE, max_rounds: int = 4,
             log: Callable[[str], None] | None = None) -> Repro:
    """The smallest graph found on which `backend` still fails as it does on `module`'s
    @graph (default: the first) with `inputs`. MinimizeError when it does not fail there."""
    name = module.graph(graph).name
    if has_random_ops(module):
        raise MinimizeError("the graph draws random numbers from torch's generator, which "
                            "the reference and a decomposing backend do not share: decompose "
                            "it first (ember opt -p decompose)")
    prepare = resolve_backend(backend)
    say = log or (lambda _s: None)
    m = _normalized(module, name)
    cur = list(inputs)
    try:
        orig = _failure(m, name, cur, prepare, tol)
    except _Invalid as e:
        raise MinimizeError(str(e)) from None
    if orig is None:
        raise MinimizeError(f"the backend agrees with the reference on @{name} (within "
                            f"{tol.describe()}): nothing to minimize")
    say(f"@{name}: {len(m.graph(name).nodes)} nodes; the failure: {orig.summary}")
    before = len(module.graph(name).nodes)
    runs = 0

    def state(mod: Module, xs: list[Any]) -> _State:
        g = mod.graph(name)
        return _State(mod, g, xs, _reference_values(mod, g, xs))

    def tries(st: _State, build: Callable[[], tuple[Module, list[Any]]]) -> \
            tuple[Module, list[Any]] | None:
        nonlocal runs
        try:
            cand = build()
        except _Invalid:
            return None
        runs += 1
        try:
            got = _failure(cand[0], name, cand[1], prepare, tol)
        except _Invalid:
            return None
        return cand if orig.reproduced_by(got) else None

    st = state(m, cur)
    for _ in range(max_rounds):
        size = (len(st.graph.nodes), len(st.graph.outputs), len(st.graph.params))
        st = _shrink_nodes(st, tries, state)
        st = _shrink_outputs(st, tries, state)
        say(f"@{name}: {len(st.graph.nodes)} nodes, {len(st.graph.outputs)} outputs, "
            f"{len(st.graph.params)} inputs ({runs} backend runs)")
        if (len(st.graph.nodes), len(st.graph.outputs), len(st.graph.params)) == size:
            break
    final = _failure(st.module, name, st.inputs, prepare, tol)
    assert final is not None and orig.reproduced_by(final), "the last candidate reproduced"
    return Repro(st.module, name, st.inputs, final, before, runs)


_Tries = Callable[[_State, Callable[[], tuple[Module, list[Any]]]],
                  tuple[Module, list[Any]] | None]


def _shrink_nodes(st: _State, tries: _Tries, state: Callable[[Module, list[Any]], _State]
                  ) -> _State:
    nodes = list(st.graph.nodes)
    if len(nodes) < 2:
        return st
    found: dict[frozenset[int], tuple[Module, list[Any]] | None] = {}

    def test(keep: list[Node]) -> bool:
        key = frozenset(id(n) for n in keep)
        if key not in found:
            found[key] = tries(st, lambda: _cut(st, keep, None))
        return found[key] is not None

    keep = ddmin(nodes, test)
    if len(keep) == len(nodes):
        return st
    best = found[frozenset(id(n) for n in keep)]
    assert best is not None
    return state(*best)


def _shrink_outputs(st: _State, tries: _Tries, state: Callable[[Module, list[Any]], _State]
                    ) -> _State:
    outs = list(range(len(st.graph.outputs)))
    found: dict[tuple[int, ...], tuple[Module, list[Any]] | None] = {}

    def test(keep: list[int]) -> bool:
        key = tuple(keep)
        if key not in found:
            chosen = [st.graph.outputs[i] for i in keep]
            found[key] = tries(st, lambda: _cut(st, st.graph.nodes, chosen))
        return found[key] is not None

    # the same outputs with dead code and unused inputs removed, when that still fails
    test(outs)
    keep = ddmin(outs, test) if len(outs) >= 2 else outs
    best = found.get(tuple(keep))
    return state(*best) if best is not None else st
