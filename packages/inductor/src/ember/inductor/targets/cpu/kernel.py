"""One loop kernel's C++ function: its schedule (schedule.py: the node's `sched_*` attributes,
the default decisions for those it lacks) checked against the kernel and rendered by
cppkernel.py's loop writer. `codegen-cpp` calls `kernel_source_sizes` for each loop node."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ember.inductor.indexing import flat_offset, ivar, rvar
from ember.inductor.sanitize import comment, kernel_symbol
from ember.inductor.schedule import Schedule, read_schedule
from ember.inductor.targets.cpu.cpp import (
    _cname,
    _int,
    _store,
    _tensor,
    body_statements,
    cexpr,
    ctypes_of,
    size_symbols,
    symbol_order,
)
from ember.inductor.targets.cpu.cppkernel import (
    HUGE_OUTPUT,
    _hints,
    _nest,
    _nest_col,
    _par_if,
    _setup,
    _work,
    _Writer,
)
from ember.inductor.targets.cpu.rowgroups import row_group_nest
from ember.inductor.targets.cpu.schedule import _apply, _decide
from ember.inductor.targets.cpu.splitloops import Piece, split_kernel
from ember.ir import Graph, Node, Symbol, Value
from ember.ir.expr import Dim, simplify_dim


def kernel_source(name: str, node: Node, body: Graph, provenance: str,
                  bodies: Mapping[str, object] | None = None,
                  symbols: Mapping[str, Symbol] | None = None) -> str:
    """One `extern "C"` function computing the loop node `node` whose body is `body`
    (`bodies`: the module's items, where `loop.reduce` nodes find their bodies). Its parameters
    are the body's buffers, then one pointer per output, then one `int64_t` per size symbol
    its code reads (`kernel_sizes`: by number; `symbols`' hints guide schedule decisions)."""
    return kernel_source_sizes(name, node, body, provenance, bodies, symbols)[0]


def kernel_source_sizes(name: str, node: Node, body: Graph, provenance: str,
                        bodies: Mapping[str, object] | None = None,
                        symbols: Mapping[str, Symbol] | None = None,
                        inplace: Sequence[int] = ()) -> tuple[str, list[str]]:
    """`kernel_source`, and the size symbols its function takes after the buffers, in order.
    The loops follow the node's `sched_*` attributes (ember.inductor.schedule), the default
    schedule (`kernel_schedule`) where it has none. `inplace`: per output, the input it may
    share storage with (inplace.py; -1: none): both are declared without `__restrict__`."""
    w = _Writer(bodies or {}, _hints(symbols))
    with size_symbols():  # (the default decisions' text is not the kernel's)
        args, ranges = _setup(node, body, w)
        default = _decide(w, node, body, args, ranges)
    with size_symbols() as used:
        s = read_schedule(node.kwargs, default)
        split = split_kernel(body, ranges, s) if node.op == "loop.pointwise" \
            and not w.reduces else None
        if split is not None:  # loops without divisions, nests without selects (splitloops)
            pieces, ranges, s = split
            body = pieces[0].inner[0][2]
            args = {p: f"in{k}" for k, p in enumerate(body.params)}
        lines = _kernel_lines(name, node, body, provenance, w, args, ranges, s,
                              pieces if split is not None else None, inplace)
    sizes = symbol_order(used)
    if sizes:  # the symbols' values, bound from the inputs' shapes by the caller
        head = lines[1 + len(node.results)]
        lines[1 + len(node.results)] = head.replace(
            ") {", "".join(f", int64_t {s}" for s in sizes) + ") {", 1)
    return "\n".join(lines) + "\n", sizes


def _kernel_lines(name: str, node: Node, body: Graph, provenance: str, w: _Writer,
                  args: dict[Value, str], ranges: list[Dim], s: Schedule,
                  pieces: list[Piece] | None = None, inplace: Sequence[int] = ()
                  ) -> list[str]:
    plan = _apply(w, node, body, args, ranges, s)

    def restrict(shared: bool) -> str:
        return "" if shared else "__restrict__ "
    ins = [f"const {ctypes_of(_tensor(p).dtype)[0]}* {restrict(k in inplace)}in{k}"
           for k, p in enumerate(body.params)]
    outs = [_tensor(r) for r in node.results]
    sig = ", ".join([*ins, *(
        f"{ctypes_of(t.dtype)[0]}* {restrict(j < len(inplace) and inplace[j] >= 0)}out{j}"
        for j, t in enumerate(outs))])
    lines = [comment(f"kernel @{name}: {node.op} of {provenance}"),
             *(comment(f"computes %{r.name}: {r.type}") for r in node.results),
             f'extern "C" void {kernel_symbol(name)}({sig}) {{']
    for j, t in enumerate(outs):
        size = simplify_dim(math.prod(_int(d) for d in t.shape) * t.dtype.itemsize)
        if not isinstance(size, int):  # decided per call
            lines.append(f"  if ({cexpr(size)} >= {HUGE_OUTPUT}LL) "
                         f"ember_hugepages(out{j}, {cexpr(size)});")
        elif size >= HUGE_OUTPUT:
            lines.append(f"  ember_hugepages(out{j}, {size}LL);")
    off = cexpr(flat_offset([ivar(k) for k in range(len(ranges))], ranges))
    if node.op == "loop.pointwise":
        override: dict[Value, str] = {}
        if plan is not None:  # g++ drops the numerator's now dead computation
            r, q = plan
            k = len(ranges) - 1
            at_r = cexpr(flat_offset([*(ivar(d) for d in range(k)), rvar(0)], ranges))
            r.stores.append(f"out0[{at_r}] = {_cname(r.body.outputs[0], f'n{r.j}_')};")
            ct = ctypes_of(r.rdt)[1]
            override[q] = f"out0[{off}] * (({ct})1 / {r.var})"
        stmts = body_statements(body, args, reduce_value=w.value(args), override=override)
        note = [comment("the sum's pass stored the numerators of %" + plan[1].name)] if plan \
            else []
        store = [f"out{j}[{off}] = {_store(_tensor(o).dtype, _cname(o))};"
                 for j, o in enumerate(body.outputs)]
        inner = [*note, *stmts, *store]
    else:  # loop.reduction: its own reduce, the last collected, stored
        r = list(w.reduces.values())[-1]
        elem = _tensor(body.outputs[0]).dtype
        value = w.ref(r) if r.kind in ("argmax", "argmin") else _store(elem, w.ref(r))
        inner = [f"out0[{off}] = {value};"]
    cond = _par_if(_work(w, ranges), s.threshold)
    vec = bool(s.vector)
    if pieces is not None:  # a split pointwise kernel: its loop nests, in order
        last = len(ranges) - 1
        for pc in pieces:
            inner = []
            for a, n, pbody in pc.inner:  # the innermost loop's consecutive pieces
                at = [ivar(k) + b for k, b in enumerate(pc.start[:last])] + [ivar(last) + a]
                poff = cexpr(flat_offset(at, ranges))
                pargs = {p: f"in{k}" for k, p in enumerate(pbody.params)}
                inner += [*(["#pragma omp simd"] if vec else []),
                          f"for (int64_t i{last} = 0; i{last} < {n}; ++i{last}) {{",
                          *("  " + x for x in body_statements(pbody, pargs)),
                          *(f"  out{j}[{poff}] = {_store(_tensor(o).dtype, _cname(o))};"
                            for j, o in enumerate(pbody.outputs)), "}"]
            lines += ["  " + x for x in _nest(w, pc.ranges[:last], inner, len(s.parallel),
                                                s.order[:last], False, cond)]
        lines.append("}")
        return lines
    nest = _nest_col(w, ranges, inner, len(s.parallel), s.order, vec, cond) \
        if w.col is not None else \
        row_group_nest(w, ranges, inner, len(s.parallel), s.order, vec, cond) or \
        _nest(w, ranges, inner, len(s.parallel), s.order, vec, cond)
    lines += ["  " + x for x in nest]
    lines.append("}")
    return lines


__all__ = ["kernel_source", "kernel_source_sizes"]
