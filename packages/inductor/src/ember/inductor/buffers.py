"""The `plan-buffers` pass: a kernel's output takes the storage of a buffer that is dead by then.

A compiled graph allocates every kernel output. Fresh allocations of large buffers cost page
faults on every call (glibc gives big blocks back to the system), and their memory is cold.
TorchInductor reuses the storage of dead buffers; so does this pass: walking a `kernels.*` graph
in order, each `kernels.call` result takes a dead buffer of the same dtype and element count
(a symbolic count: the same expression, so the same size whatever the symbols' values),
written as `kernels.call(@k, ..., reuse=[%dead])` (the wrapper and the interpreter view the dead
buffer's storage instead of allocating).

A buffer is dead after the last use of every value that may alias it: itself, `kernels.view`s
of it, and the results of ops that may return a view of their operands (every extern whose
op's record does not declare `aliasing="fresh"`, every op left to the reference). Only
`kernels.call` outputs and the single result of a fresh extern (a convolution's output: the
next activation kernel writes into it once it is dead, instead of into new memory) are reused
(never graph inputs), never a buffer that a graph output may alias, and never by the node that
reads it last (a kernel does not write where it reads), except where the call says it may
(`inplace=`: the CPU target's pointwise kernels that read an operand only at the element they
write, targets/cpu/inplace.py): its output then takes that operand's storage if the operand
dies at the call. An extern result that is not
contiguous at run time is not taken (launch.out_buffer allocates instead). A dead buffer is
held for a later reuse only where holding it does not raise the graph's peak bytes (its
owned buffers, and a training backward's inputs up to their last use); otherwise it is let go.

An extern that has an out form (`out_call`: prims.matmul of 2-d or batched 3-d operands is
torch.mm / torch.bmm with out=, loop.index_select is torch.index_select with out=) takes a
dead buffer the same way, `kernels.extern(..., op="prims.matmul", reuse=[%dead])`: the wrapper
passes the dead buffer's storage as `out=` instead of letting the op allocate its result
(TorchInductor's wrapper does the same with `extern_kernels.bmm(..., out=buf)`). Externs
without one (oneDNN's packed linear and convolution, attention) still allocate, except where
the op can write its result over an operand (`INTO_FORMS`: oneDNN's convolution with a
residual adds into the residual in place, TorchInductor's `_convolution_pointwise_.binary`
under freezing): where that operand is a buffer of the graph's own whose storage, and
everything aliasing it, is last read there and no other operand may share it, the node gets
`reuse=[%operand]` and the op's attribute saying so, and the operand's storage lives on as
the result (never handed to another buffer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sympy
import torch

from ember.inductor.body import body_names
from ember.ir import Graph, Module, Node, OpRegistry, TensorType, Value, default_registry
from ember.ir.expr import as_sympy
from ember.ir.graph import iter_values
from ember.ir.passes import register_pass

NEVER = math.inf


def _matmul_out(n: Node) -> Callable[..., Any] | None:
    """prims.matmul's out form: torch.mm for 2-d operands, torch.bmm for 3-d ones of the same
    batch (what torch.matmul calls for them, without its broadcasting), all of one dtype."""
    ts = [a.type for a in n.args if isinstance(a, Value)]
    r = n.results[0].type
    if len(ts) != 2 or len(n.args) != 2 or n.kwargs.keys() - {"op", "reuse"} \
            or not isinstance(r, TensorType) \
            or not all(isinstance(t, TensorType) and t.dtype == r.dtype for t in ts):
        return None
    a, b = ts
    assert isinstance(a, TensorType) and isinstance(b, TensorType)
    if a.rank == b.rank == r.rank == 2:
        return torch.mm
    if a.rank == b.rank == r.rank == 3 and a.shape[0] == b.shape[0] == r.shape[0]:
        return torch.bmm
    return None


def _index_select_out(n: Node) -> Callable[..., Any] | None:
    """loop.index_select's out form: torch.index_select(x, dim, ids, out=)."""
    dim = n.kwargs.get("dim")
    if len(n.args) != 2 or not isinstance(dim, int) or isinstance(dim, bool) \
            or n.kwargs.keys() - {"op", "dim", "reuse"}:
        return None

    def call(x: torch.Tensor, ids: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, dim, ids, out=out)
    return call


# extern op -> its out form for a node (a callable of the node's operands and out=, writing
# the node's one result into `out`), or None where this node has none
OUT_FORMS: dict[str, Callable[[Node], Callable[..., Any] | None]] = {
    "prims.matmul": _matmul_out, "loop.index_select": _index_select_out}


# extern op -> for a node, (the operand its result may be written over, the boolean
# attribute telling the op to do so), or None where this node cannot (the op's own module
# registers it: packed.py's convolution with a residual)
INTO_FORMS: dict[str, Callable[[Node], tuple[int, str] | None]] = {}


def out_call(n: Node) -> Callable[..., Any] | None:
    """The out form of extern node `n` (one tensor result), if its op has one."""
    op = n.kwargs.get("op")
    form = OUT_FORMS.get(op) if n.op == "kernels.extern" and isinstance(op, str) \
        and len(n.results) == 1 and isinstance(n.results[0].type, TensorType) else None
    return form(n) if form is not None else None


def last_uses(g: Graph) -> dict[Value, float]:
    """Per value: the index of the last node that reads it (NEVER for graph outputs)."""
    last: dict[Value, float] = {}
    for i, n in enumerate(g.nodes):
        for v in n.operands():  # (also inside keyword lists: reuse=[...])
            last[v] = i
    for o in g.outputs:
        last[o] = NEVER
    return last


def _fresh_extern(n: Node, registry: OpRegistry) -> bool:
    """A `kernels.extern` whose op's record declares its results new storage."""
    name = n.kwargs.get("op")
    op = registry.lookup(name) if isinstance(name, str) else None
    return op is not None and op.fresh


def _owned(n: Node, registry: OpRegistry) -> bool:
    """The node's results are buffers of their own that plan-buffers may hand on: kernel
    outputs, and the one result of a fresh extern (several results of one extern may be
    views of one new storage)."""
    return n.op == "kernels.call" or (n.op == "kernels.extern" and len(n.results) == 1
                                      and _fresh_extern(n, registry))


def _aliases(g: Graph) -> dict[Value, set[Value]]:
    """Per value: the owned buffers (kernel outputs, fresh extern results) whose storage it
    may share."""
    al: dict[Value, set[Value]] = {}
    registry = default_registry()
    for n in g.nodes:
        fresh = n.op == "kernels.call" or (n.op == "kernels.extern"
                                           and _fresh_extern(n, registry))
        src: set[Value] = set()
        if not fresh:
            for v in n.operands():  # (also inside keyword lists: reuse=[...])
                src |= al.get(v, set())
        own = _owned(n, registry)
        for r in n.results:
            al[r] = {r} if own else set(src)
    return al


def _buffer_key(v: Value) -> tuple[str, object] | None:
    """A buffer's dtype and element count: a symbolic count as its expanded expression, so
    that two buffers share a key only where their sizes are equal for every binding."""
    t = v.type
    if not isinstance(t, TensorType):
        return None
    if all(isinstance(d, int) for d in t.shape):
        return t.dtype.name, math.prod(int(d) for d in t.shape)
    return t.dtype.name, sympy.expand(math.prod(as_sympy(d) for d in t.shape))


def _nbytes(v: Value) -> int | None:
    """A buffer's static size in bytes (None: symbolic)."""
    t = v.type
    if not isinstance(t, TensorType) or not all(isinstance(d, int) for d in t.shape):
        return None
    return math.prod(int(d) for d in t.shape) * t.dtype.itemsize


def _profile(g: Graph, dies: dict[Value, float], last: dict[Value, float]) -> list[int]:
    """Per node: the bytes of the owned buffers (kernel outputs, fresh extern results) live
    while it runs, each from its node to its death (static sizes only). A training backward's
    (`grad_inputs=` in its attributes) inputs count too, up to their last use: the runtime
    hands them over in a BoxedInputs list the call empties as it goes (an input the caller
    holds throughout adds the same bytes everywhere, which no decision here depends on)."""
    prof = [0] * len(g.nodes)
    if "grad_inputs" in g.attrs:
        for p in g.params:
            size = _nbytes(p)
            end = last.get(p, -1)
            if size is not None:
                for j in range(0, len(g.nodes) if end == NEVER else int(end) + 1):
                    prof[j] += size
    made = {r: i for i, n in enumerate(g.nodes) for r in n.results}
    for b, d in dies.items():
        size = _nbytes(b)
        if size is None or b not in made:
            continue
        for j in range(made[b], len(g.nodes) if d == NEVER else int(d) + 1):
            prof[j] += size
    return prof


def _hold(prof: list[int], start: int, end: int, size: int | None) -> bool:
    """Whether a dead buffer of `size` bytes may be kept from node `start` to node `end` (which
    reuses it) without raising the graph's peak; if so, the profile counts it. A held buffer
    spares the reader a fresh allocation (page faults), but held across the peak it is memory
    the step needs on top (a training backward's first [tokens, vocab] buffer, reused by the
    embedding's gradient at its very end)."""
    if size is None or start >= end:
        return True
    if max(prof[start:end]) + size > max(prof):
        return False
    for j in range(start, end):
        prof[j] += size
    return True


def _operand_dying(n: Node, inplace: object, j: int, i: int, dies: dict[Value, float],
                   key: tuple[str, object] | None) -> Value | None:
    """The operand kernel call `n` (node i) may write its result j over (its `inplace=`, set
    by the target's code generator where the kernel reads that operand only at the element it
    writes): a buffer of the graph's own (a kernel output or a fresh extern's result) whose
    storage, and everything aliasing it, is last read here; else None."""
    if not isinstance(inplace, list) or j >= len(inplace) or not isinstance(inplace[j], int) \
            or not 0 <= inplace[j] < len(n.args) - 1:
        return None
    a = n.args[1 + inplace[j]]
    if not isinstance(a, Value) or dies.get(a) != i or key is None or _buffer_key(a) != key \
            or sum(1 for b in n.args if b is a) != 1:  # (another operand's pointer: restrict)
        return None
    return a


def _into_operand(n: Node, i: int, dies: dict[Value, float], al: dict[Value, set[Value]]
                  ) -> tuple[Value, str] | None:
    """The operand extern node `n` (node i) writes its one result over (INTO_FORMS) and the
    attribute saying so, where that is safe: an owned buffer of the result's dtype and size
    whose storage, and every value aliasing it, is last read here (so never a graph input or
    output, or a view of one), that no other operand (or keyword value) may alias; else None."""
    op = n.kwargs.get("op")
    form = INTO_FORMS.get(op) if n.op == "kernels.extern" and isinstance(op, str) \
        and len(n.results) == 1 and "reuse" not in n.kwargs else None
    spec = form(n) if form is not None else None
    if spec is None or not 0 <= spec[0] < len(n.args):
        return None
    a = n.args[spec[0]]
    if not isinstance(a, Value) or dies.get(a) != i or al.get(a) != {a} \
            or _buffer_key(a) is None or _buffer_key(a) != _buffer_key(n.results[0]):
        return None
    others = [*iter_values([b for k, b in enumerate(n.args) if k != spec[0]]),
              *iter_values(list(n.kwargs.values()))]
    if any(v is a or a in al.get(v, ()) for v in others):  # (conv(x) + x: x read as well)
        return None
    return a, spec[1]


def plan_graph(g: Graph) -> int:
    """Add `reuse=` to the graph's kernel calls and out-form externs; the number of buffers
    reused. A graph that already carries a plan (a stored compiled module, planned by an
    earlier version whose rules may differ) is kept as it is."""
    if any(n.op in ("kernels.call", "kernels.extern") and "reuse" in n.kwargs
           for n in g.nodes):
        return 0
    al = _aliases(g)
    last = last_uses(g)
    # buffer -> its definition, then the last use of anything aliasing it
    registry = default_registry()
    dies: dict[Value, float] = {r: i for i, n in enumerate(g.nodes) for r in n.results
                                if _owned(n, registry)}
    for v, bufs in al.items():
        for b in bufs:
            dies[b] = max(dies.get(b, -1), last.get(v, -1))
    free: dict[tuple[str, object], list[Value]] = {}
    released: list[tuple[float, Value]] = sorted(
        ((d, b) for b, d in dies.items() if d != NEVER), key=lambda x: x[0])
    prof = _profile(g, dies, last)
    overwritten: set[Value] = set()
    k = 0
    count = 0
    for i, n in enumerate(g.nodes):
        while k < len(released) and released[k][0] < i:  # dead before this node runs
            b = released[k][1]
            key = _buffer_key(b)
            if key is not None and b not in overwritten:  # (its storage lives on as a result)
                free.setdefault(key, []).append(b)
            k += 1
        into = _into_operand(n, i, dies, al)
        if into is not None:  # written over its dying operand (INTO_FORMS)
            n.kwargs = {**n.kwargs, into[1]: True, "reuse": [into[0]]}
            overwritten.add(into[0])
            count += 1
            continue
        if n.op != "kernels.call" and (n.op != "kernels.extern" or out_call(n) is None):
            continue
        reuse: list[Value] = []
        inplace = n.kwargs.get("inplace")
        for j, r in enumerate(n.results):  # a prefix of the results (reuse= is positional)
            key = _buffer_key(r)
            own = _operand_dying(n, inplace, j, i, dies, key)
            if own is not None:  # written over the operand it reads (inplace=)
                reuse.append(own)
                overwritten.add(own)
                continue
            pool = free.get(key) if key is not None else None
            if not pool:
                break
            # the most recently dead buffer: held the shortest; a longer-dead one would be
            # held longer still, so if this one may not be held, none may
            b = pool.pop()
            if not _hold(prof, int(dies[b]) + 1, i, _nbytes(b)):
                pool.clear()
                break
            reuse.append(b)
        if reuse:
            n.kwargs = {**n.kwargs, "reuse": reuse}
            count += len(reuse)
    return count


@register_pass("plan-buffers", "kernels.* graph: each kernel output reuses the storage of a "
               "dead buffer of the same dtype and size (reuse=[%dead])")
def plan_buffers(module: Module) -> Module:
    out = module.clone()
    bodies = body_names(out)
    for g in out.graphs.values():
        if g.name not in bodies:
            plan_graph(g)
    return out


__all__ = ["INTO_FORMS", "OUT_FORMS", "last_uses", "out_call", "plan_buffers", "plan_graph"]
