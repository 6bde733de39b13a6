"""The `lower-loops` pass: a prims graph -> loop-level IR (see loopir.py).

Each elementwise prim becomes one `loop.pointwise` kernel, each reduction one `loop.reduction`
(fusion merges them later, see fusion.py). Shape prims are index rewrites: a view is the pair
(buffer, index expressions) and is folded into the loads of whoever reads it; it is materialised
(by a copy kernel) only where a graph output or an extern op needs a real buffer. Prims without a
loop form (matmul, convolution, sort, gather, random, ...) become `loop.extern` nodes that call
the prim's own implementation. Ops of other dialects pass through.

The lowering of each prim is found in one table, `LOWERINGS`: prim -> rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from ember.inductor.body import BodyBuilder, body_names, fresh_body_name
from ember.inductor.indexing import flat_offset, index_text, ivar, row_major_strides, rvar
from ember.inductor.indexing import substitute as subst_index
from ember.ir import Arg, Builder, DType, Graph, Module, Node, Ref, TensorType, Value
from ember.ir.expr import Dim, FloorDiv, PyMod, as_sympy, simplify_dim
from ember.ir.graph import map_args
from ember.ir.passes import register_pass
from ember.prims import PRIMS_BY_OP


@dataclass(frozen=True)
class View:
    """A value that is `src` read at `index` (expressions over i0.. of the view's own dims)."""

    src: Value
    index: tuple[Dim, ...]
    type: TensorType


Lazy = Value | View

ELEMENTWISE_GROUPS = ("elementwise unary", "elementwise binary", "comparison",
                      "elementwise ternary", "conversion")
REDUCTION_PRIMS = {"prims.sum": "sum", "prims.prod": "prod", "prims.amax": "amax",
                   "prims.amin": "amin", "prims.argmax": "argmax", "prims.argmin": "argmin"}


class _Lowering:
    def __init__(self, module: Module, g: Graph, bodies: list[Graph], taken: set[str]):
        self.m = module
        self.g = g
        self.bodies = bodies
        self.taken = taken
        self.b = Builder(module, taken=(v.name for v in g.values()))
        self.env: dict[Value, Lazy] = {}

    # ---- index algebra ---------------------------------------------------------------------
    def index_of(self, v: Value, idx: Sequence[Dim]) -> tuple[Value, list[Dim]]:
        """The buffer and its index that reading `v` at `idx` means."""
        lazy = self.env.get(v, v)
        if isinstance(lazy, Value):
            return lazy, list(idx)
        sub = {ivar(k): e for k, e in enumerate(idx)}
        return lazy.src, [subst_index(e, sub) for e in lazy.index]

    def view(self, n: Node, x: Value, idx_of_x: Sequence[Dim]) -> None:
        """Define n's result as x read at `idx_of_x` (expressions over the result's i-vars)."""
        src, idx = self.index_of(x, idx_of_x)
        t = n.results[0].type
        assert isinstance(t, TensorType)
        self.env[n.results[0]] = View(src, tuple(idx), t)

    def materialize(self, v: Value) -> Value:
        lazy = self.env.get(v, v)
        if isinstance(lazy, Value):
            return lazy
        bb = BodyBuilder(self.m, fresh_body_name(self.m, self.g.name, self.taken))
        val = bb.load(lazy.src, lazy.index)
        out = self.kernel("loop.pointwise", bb, val, {"ranges": list(lazy.type.shape)},
                          lazy.type, f"{v.name}.copy")
        self.env[v] = out
        return out

    def kernel(self, op: str, bb: BodyBuilder, result: Value, kwargs: dict[str, Arg],
               type: TensorType, name: str) -> Value:
        body = bb.finish(result)
        self.bodies.append(body)
        self.b.taken.discard(name)
        return self.b.op(op, [Ref(body.name), *bb.outer_args()], kwargs, type=type, name=name)

    # ---- node kinds ------------------------------------------------------------------------
    def pointwise(self, n: Node, emit: Callable[[BodyBuilder, list[Value]], Value]) -> None:
        t = n.results[0].type
        assert isinstance(t, TensorType)
        bb = BodyBuilder(self.m, fresh_body_name(self.m, self.g.name, self.taken))
        bb.b.loc = n.loc
        idx = [ivar(k) for k in range(t.rank)]
        loads = []
        for a in n.operands():
            buf, bidx = self.index_of(a, idx)
            loads.append(bb.load(buf, bidx, n.loc))
        val = emit(bb, loads)
        self.env[n.results[0]] = self.kernel("loop.pointwise", bb, val,
                                             {"ranges": list(t.shape)}, t, n.results[0].name)

    def elementwise(self, n: Node) -> None:
        def emit(bb: BodyBuilder, loads: list[Value]) -> Value:
            it = iter(loads)
            args = [next(it) if isinstance(a, Value) else a for a in n.args]
            return bb.b.op(n.op, args, n.kwargs, name=n.results[0].name)
        self.pointwise(n, emit)

    def reduction(self, n: Node) -> None:
        x = n.args[0]
        assert isinstance(x, Value) and isinstance(x.type, TensorType)
        kind = REDUCTION_PRIMS[n.op]
        dims = [_attr(n, "dim")] if kind in ("argmax", "argmin") else list(_attr(n, "dims"))
        red = sorted(int(d) for d in dims)
        if not red:
            self.env[n.results[0]] = self.env.get(x, x)
            return
        keep = [d for d in range(x.type.rank) if d not in red]
        idx: list[Dim] = [0] * x.type.rank
        for j, d in enumerate(keep):
            idx[d] = ivar(j)
        for j, d in enumerate(red):
            idx[d] = rvar(j)
        bb = BodyBuilder(self.m, fresh_body_name(self.m, self.g.name, self.taken))
        bb.b.loc = n.loc
        buf, bidx = self.index_of(x, idx)
        val = bb.load(buf, bidx, n.loc)
        t = n.results[0].type
        assert isinstance(t, TensorType)
        kw: dict[str, Arg] = {"ranges": [x.type.shape[d] for d in keep],
                              "reduce_ranges": [x.type.shape[d] for d in red], "reduction": kind}
        self.env[n.results[0]] = self.kernel("loop.reduction", bb, val, kw, t, n.results[0].name)

    def extern_operand(self, v: Value) -> Value:
        """A real buffer for an extern op: a permutation of a buffer's dims stays a view
        (`loop.extern(op="prims.permute")`, no copy: matmul reads transposed weights as they
        are); any other view is materialised by a copy kernel."""
        lazy = self.env.get(v, v)
        if isinstance(lazy, View) and isinstance(lazy.src.type, TensorType) \
                and lazy.src.type.rank == lazy.type.rank:
            where = {ivar(j): d for j in range(lazy.type.rank)
                     for d, e in enumerate(lazy.index) if e == ivar(j)}
            if len(where) == lazy.type.rank:
                dims = [where[ivar(j)] for j in range(lazy.type.rank)]
                out = self.b.emit("loop.extern", [lazy.src], {"op": "prims.permute",
                                                               "dims": dims},
                                  types=[lazy.type], names=[f"{v.name}.view"])[0]
                self.env[v] = out
                return out
        return self.materialize(v)

    def passthrough(self, n: Node, op: str | None = None) -> None:
        """An extern call of the prim (op given), or a node of another dialect, on real buffers."""
        real = self.extern_operand if op is not None else self.materialize
        args = [map_args(a, real) for a in n.args]
        kwargs = {k: map_args(a, real) for k, a in n.kwargs.items()}
        if op is not None:
            kwargs = {"op": op, **kwargs}
            name = "loop.extern"
        else:
            name = n.op
        for r in n.results:
            self.b.taken.discard(r.name)
        outs = self.b.emit(name, args, kwargs, types=[r.type for r in n.results],
                           names=[r.name for r in n.results], loc=n.loc)
        self.env.update(zip(n.results, outs, strict=True))

    # ---- driver ------------------------------------------------------------------------------
    def run(self) -> None:
        for n in self.g.nodes:
            rule = LOWERINGS.get(n.op)
            scalar_operand = any(not isinstance(v.type, TensorType) for v in n.operands())
            if n.op.startswith("prims.") and (rule is None or scalar_operand):
                self.passthrough(n, n.op)
            elif rule is None:
                self.passthrough(n)
            else:
                rule(self, n)
        self.g.outputs = [self.materialize(o) for o in self.g.outputs]
        self.g.nodes = self.b.nodes


# ---- the table: prim -> lowering rule ----------------------------------------------------------

Rule = Callable[[_Lowering, Node], None]


def _attr(n: Node, key: str, default: Any = None) -> Any:
    """A keyword attribute as plain Python data (lists of ints and size expressions)."""
    v = n.kwargs.get(key, default)
    return default if v is None else v


def _x(n: Node) -> tuple[Value, TensorType]:
    x = n.args[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    return x, x.type


def _ivars(n: Node) -> list[sympy.Symbol]:
    t = n.results[0].type
    assert isinstance(t, TensorType)
    return [ivar(k) for k in range(t.rank)]


def _broadcast_in_dim(lw: _Lowering, n: Node) -> None:
    x, xt = _x(n)
    o = _ivars(n)
    shape = list(_attr(n, "shape"))
    bd = [int(d) for d in _attr(n, "broadcast_dims")]
    idx: list[Dim] = [0 if (xt.shape[i] == 1 and shape[b] != 1) else o[b]
                      for i, b in enumerate(bd)]
    lw.view(n, x, idx)


def _reshape(lw: _Lowering, n: Node) -> None:
    x, xt = _x(n)
    t = n.results[0].type
    assert isinstance(t, TensorType)
    if list(xt.shape) == list(t.shape):
        lw.view(n, x, _ivars(n))
        return
    flat = as_sympy(flat_offset(_ivars(n), t.shape))
    idx: list[Dim] = []
    for k, (size, st) in enumerate(zip(xt.shape, row_major_strides(xt.shape), strict=True)):
        if size == 1:
            idx.append(0)
            continue
        e = FloorDiv(flat, as_sympy(st))
        idx.append(simplify_dim(e if k == 0 else PyMod(e, as_sympy(size))))
    lw.view(n, x, idx)


def _permute(lw: _Lowering, n: Node) -> None:
    x, xt = _x(n)
    o = _ivars(n)
    idx: list[Dim] = [0] * xt.rank
    for i, d in enumerate(_attr(n, "dims")):
        idx[int(d)] = o[i]
    lw.view(n, x, idx)


def _slice(lw: _Lowering, n: Node) -> None:
    x, xt = _x(n)
    o = _ivars(n)
    start = list(_attr(n, "start"))
    step = list(_attr(n, "step") or [1] * xt.rank)
    lw.view(n, x, [simplify_dim(as_sympy(s) + o[k] * as_sympy(st))
                   for k, (s, st) in enumerate(zip(start, step, strict=True))])


def _squeeze(lw: _Lowering, n: Node) -> None:
    x, xt = _x(n)
    o = iter(_ivars(n))
    dims = {int(d) for d in _attr(n, "dims")}
    lw.view(n, x, [0 if k in dims else next(o) for k in range(xt.rank)])


def _unsqueeze(lw: _Lowering, n: Node) -> None:
    x, _ = _x(n)
    dims = {int(d) for d in _attr(n, "dims")}
    lw.view(n, x, [v for k, v in enumerate(_ivars(n)) if k not in dims])


def _rev(lw: _Lowering, n: Node) -> None:
    x, xt = _x(n)
    dims = {int(d) for d in _attr(n, "dims")}
    lw.view(n, x, [simplify_dim(as_sympy(xt.shape[k]) - 1 - v) if k in dims else v
                   for k, v in enumerate(_ivars(n))])


def _iota(lw: _Lowering, n: Node) -> None:
    start, step = _attr(n, "start", 0), _attr(n, "step", 1)
    dtype = n.kwargs["dtype"]

    def emit(bb: BodyBuilder, loads: list[Value]) -> Value:
        e = simplify_dim(as_sympy(start) + as_sympy(step) * ivar(0))
        v = bb.b.op("loop.index", [], {"index": index_text(e)}, name=f"{n.results[0].name}.i")
        if dtype == DType.i64:
            return v
        return bb.b.op("prims.convert_element_type", [v], {"dtype": dtype},
                       name=n.results[0].name)
    lw.pointwise(n, emit)


def _full(lw: _Lowering, n: Node) -> None:
    def emit(bb: BodyBuilder, loads: list[Value]) -> Value:
        return bb.b.op("prims.full", [], {**n.kwargs, "shape": []}, name=n.results[0].name)
    lw.pointwise(n, emit)


def _reduction(lw: _Lowering, n: Node) -> None:
    lw.reduction(n)


def _elementwise(lw: _Lowering, n: Node) -> None:
    lw.elementwise(n)


LOWERINGS: dict[str, Rule] = {
    **{p.op: _elementwise for p in PRIMS_BY_OP.values() if p.group in ELEMENTWISE_GROUPS},
    **{op: _reduction for op in REDUCTION_PRIMS},
    "prims.broadcast_in_dim": _broadcast_in_dim,
    "prims.reshape": _reshape,
    "prims.permute": _permute,
    "prims.slice": _slice,
    "prims.squeeze": _squeeze,
    "prims.unsqueeze": _unsqueeze,
    "prims.rev": _rev,
    "prims.iota": _iota,
    "prims.full": _full,
}


@register_pass("lower-loops", "prims -> loop-level IR: pointwise/reduction kernels over index "
               "values, views as index rewrites, the rest extern")
def lower_loops(module: Module) -> Module:
    out = module.clone()
    bodies: list[Graph] = []
    taken: set[str] = set()
    for g in list(out.graphs.values()):
        if not _is_body(out, g):
            _Lowering(out, g, bodies, taken).run()
    for body in bodies:
        out.add(body)
    return out


def _is_body(m: Module, g: Graph) -> bool:
    """A graph some loop node uses as its body (lowering it again would be wrong)."""
    return g.name in body_names(m)


def lowered_ops(module: Module) -> set[str]:
    return {n.op for g in module.graphs.values() for n in g.nodes}


__all__ = ["LOWERINGS", "View", "lower_loops", "lowered_ops"]

