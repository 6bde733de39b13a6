"""The `lower-loops` pass: a prims graph -> loop-level IR (see loopir.py).

Each elementwise prim becomes one `loop.pointwise` kernel, each reduction one `loop.reduction`
(fusion merges them later, see fusion.py). Shape prims are index rewrites: a view is the pair
(buffer, index expressions) and is folded into the loads of whoever reads it; it is materialised
(by a copy kernel) only where a graph output or an extern op needs a real buffer. Prims without a
loop form (matmul, convolution, sort, gather, random, ...) become `loop.extern` nodes that call
the prim's own implementation. Ops of other dialects pass through.

The lowering of each prim is found in one table, `LOWERINGS`: prim -> rule. Tables are plain
dicts, so a variant is `{**LOWERINGS, "prims.exp": my_rule}`; `register_lowering_table(name,
rules)` makes it selectable as `lower-loops{table=NAME}` (a prim without a rule stays an extern
call of its own implementation).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from ember.inductor.body import BodyBuilder, body_names, declare_domains, fresh_body_name
from ember.inductor.indexing import (
    affine_view,
    flat_offset,
    index_value,
    ivar,
    row_major_strides,
    rvar,
    simplify_index,
)
from ember.inductor.indexing import substitute as subst_index
from ember.inductor.targets import device_kind, graph_devices, targets
from ember.ir import Arg, Builder, DType, Graph, Module, Node, Ref, TensorType, Value
from ember.ir.expr import Dim, FloorDiv, PyMod, as_sympy, max_dim, min_dim, simplify_dim
from ember.ir.graph import map_args
from ember.ir.passes import PipelineError, register_pass
from ember.prims import PRIMS_BY_OP
from ember.prims.decomp.passes import is_custom_op


@dataclass(frozen=True)
class View:
    """A value that is `src` read at `index` (expressions over i0.. of the view's own dims)."""

    src: Value
    index: tuple[Dim, ...]
    type: TensorType


Lazy = Value | View

# prim -> its loop.reduction kind (the prim's name), for the prims that declare a reduction trait
REDUCTION_PRIMS = {p.op: p.name for p in PRIMS_BY_OP.values() if p.reduction is not None}


class _Lowering:
    def __init__(self, module: Module, g: Graph, bodies: list[Graph], taken: set[str],
                 rules: dict[str, Rule] | None = None):
        self.rules = LOWERINGS if rules is None else rules
        self.m = module
        self.g = g
        self.bodies = bodies
        self.taken = taken
        self.b = Builder(module, taken=(v.name for v in g.values()))
        self.env: dict[Value, Lazy] = {}
        self.strided: dict[Value, Value] = {}  # a view -> its loop.view node (extern operands)
        self._readers: dict[Value, list[Node]] | None = None
        # nodes a rule folded into an earlier node's lowering (a linear's bias and activation,
        # targets/cpu/linear.py): the driver skips them; one mapped to a value defines its
        # result as that value's lowering, one mapped to None has no reader left
        self.folded: dict[Node, Value | None] = {}

    def readers(self, v: Value) -> list[Node]:
        """The nodes of the graph being lowered that read `v`, in order (the map is built
        once: a rule asking per node would walk the whole graph each time)."""
        if self._readers is None:
            self._readers = {}
            for n in self.g.nodes:
                for u in dict.fromkeys(n.operands()):
                    self._readers.setdefault(u, []).append(n)
        return self._readers.get(v, [])

    # ---- index algebra ---------------------------------------------------------------------
    def index_of(self, v: Value, idx: Sequence[Dim], ranges: Ranges) -> tuple[Value, list[Dim]]:
        """The buffer and its index that reading `v` at `idx` means (`ranges`: the extents of
        the loop variables in `idx`, which simplify its `//` and `mod`)."""
        lazy = self.env.get(v, v)
        if isinstance(lazy, Value):
            return lazy, [simplify_index(e, ranges) for e in idx]
        sub = {ivar(k): e for k, e in enumerate(idx)}
        return lazy.src, [simplify_index(subst_index(e, sub), ranges) for e in lazy.index]

    def view(self, n: Node, x: Value, idx_of_x: Sequence[Dim]) -> None:
        """Define n's result as x read at `idx_of_x` (expressions over the result's i-vars)."""
        t = n.results[0].type
        assert isinstance(t, TensorType)
        src, idx = self.index_of(x, idx_of_x, _ranges(t.shape))
        self.env[n.results[0]] = View(src, tuple(idx), t)

    def materialize(self, v: Value) -> Value:
        lazy = self.env.get(v, v)
        if isinstance(lazy, Value):
            return lazy
        st = lazy.src.type
        if isinstance(st, TensorType) and list(st.shape) == list(lazy.type.shape) \
                and list(lazy.index) == [ivar(k) for k in range(st.rank)]:
            return lazy.src  # the buffer itself (a permute of a permuted view): no copy
        out = self.materialize_view(lazy, f"{v.name}.copy")
        self.env[v] = out
        return out

    def materialize_view(self, view: View, name: str) -> Value:
        """A copy kernel writing `view` into a new buffer (a producer fuses into it)."""
        bb = BodyBuilder(self.m, fresh_body_name(self.m, self.g.name, self.taken))
        val = bb.load(view.src, view.index)
        return self.kernel("loop.pointwise", bb, val, {"ranges": list(view.type.shape)},
                           view.type, name)

    def kernel(self, op: str, bb: BodyBuilder, result: Value, kwargs: dict[str, Arg],
               type: TensorType, name: str) -> Value:
        body = bb.finish(result)
        self.bodies.append(body)
        self.b.taken.discard(name)
        return self.b.op(op, [Ref(body.name), *bb.outer_args()], kwargs, type=type, name=name)

    # ---- node kinds ------------------------------------------------------------------------
    def pointwise(self, n: Node, emit: Callable[[BodyBuilder, list[Value]], Value],
                  loads: bool = True) -> None:
        """A pointwise kernel computing n's result; `emit` gets the operands loaded at the
        output index (`loads=False`: none, it loads what it needs itself)."""
        t = n.results[0].type
        assert isinstance(t, TensorType)
        bb = BodyBuilder(self.m, fresh_body_name(self.m, self.g.name, self.taken))
        bb.b.loc = n.loc
        idx = [ivar(k) for k in range(t.rank)]
        operands = []
        for a in n.operands() if loads else ():
            buf, bidx = self.index_of(a, idx, _ranges(t.shape))
            operands.append(bb.load(buf, bidx, n.loc))
        val = emit(bb, operands)
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
        buf, bidx = self.index_of(x, idx, _ranges([x.type.shape[d] for d in keep],
                                                   [x.type.shape[d] for d in red]))
        val = bb.load(buf, bidx, n.loc)
        t = n.results[0].type
        assert isinstance(t, TensorType)
        kw: dict[str, Arg] = {"ranges": [x.type.shape[d] for d in keep],
                              "reduce_ranges": [x.type.shape[d] for d in red], "reduction": kind}
        self.env[n.results[0]] = self.kernel("loop.reduction", bb, val, kw, t, n.results[0].name)

    def extern_operand(self, v: Value) -> Value:
        """A real buffer for an extern op. A view whose index is affine in its loop variables
        (slices, selects, expands, permutes, reshapes that split dims, and compositions) stays
        a strided view of its buffer, `loop.extern(%x, op="loop.view", index=, shape=)`: no
        copy (matmul reads transposed weights as they are). Any other view is materialised by
        a copy kernel. Readers other than externs keep reading the view's buffer directly."""
        lazy = self.env.get(v, v)
        if not isinstance(lazy, View):
            return lazy
        out = self.strided.get(v)
        if out is None:
            out = self.real_view(lazy, f"{v.name}.view")
            if out.node is not None and out.node.op != "loop.extern":  # a copy kernel
                self.env[v] = out
                return out
            self.strided[v] = out
        return out

    def real_view(self, view: View, name: str) -> Value:
        """A buffer holding `view`: a strided `loop.view` where its index is affine (with no
        negative stride: torch has none); else, where the view's row-major offset into its
        buffer is affine (a reshape merging dims of a contiguous buffer, [B, T, K] read as
        [B*T, K] by a matmul), a `prims.reshape` view of the buffer, flat if the view is not
        that reshape itself; else (a merge of dims the view permuted) a copy kernel."""
        aff = affine_view(view.index, view.type.rank)
        if aff is not None and not any(c < 0 for row in aff[1] for c in row):
            return self._view_node(view.src, "loop.view", view.type, name,
                                   index=[index_value(e) for e in view.index],
                                   shape=list(view.type.shape))
        src_t = view.src.type
        assert isinstance(src_t, TensorType)
        ivars = [ivar(k) for k in range(view.type.rank)]
        flat = simplify_index(flat_offset(view.index, src_t.shape), _ranges(view.type.shape))
        aff = affine_view([flat], view.type.rank)
        if aff is None or any(c < 0 for c in aff[1][0]):
            return self.materialize_view(view, name.replace(".view", ".copy"))
        shape = list(view.type.shape)
        numel = simplify_dim(sympy.Mul(*(as_sympy(d) for d in src_t.shape)))
        whole = as_sympy(numel) == sympy.Mul(*(as_sympy(d) for d in shape))
        if whole and as_sympy(flat) == as_sympy(flat_offset(ivars, shape)):  # the reshape itself
            return self._view_node(view.src, "prims.reshape", view.type, name, shape=shape)
        # a prefix of the buffer (a leading slice) reads through a flat view, never a reshape
        flat_t = TensorType(src_t.dtype, (numel,), None, src_t.device)
        buf = self._view_node(view.src, "prims.reshape", flat_t, f"{name}.flat", shape=[numel])
        return self._view_node(buf, "loop.view", view.type, name, index=[index_value(flat)],
                               shape=shape)

    def _view_node(self, src: Value, op: str, t: TensorType, name: str, **kw: Arg) -> Value:
        self.b.taken.discard(name)
        return self.b.emit("loop.extern", [src], {"op": op, **kw}, types=[t], names=[name])[0]

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
            if n in self.folded:
                src = self.folded[n]
                if src is not None:
                    self.env[n.results[0]] = self.env.get(src, src)
                continue
            rule = self.rules.get(n.op)
            scalar_operand = any(not isinstance(v.type, TensorType) for v in n.operands())
            if n.op.startswith("prims.") and (rule is None or scalar_operand):
                self.passthrough(n, n.op)
            elif rule is None and is_custom_op(n.op):  # a torch.library op: an extern call
                self.passthrough(n, n.op)
            elif rule is None:
                self.passthrough(n)
            else:
                rule(self, n)
        self.g.outputs = [self.materialize(o) for o in self.g.outputs]
        self.g.nodes = self.b.nodes


# ---- the table: prim -> lowering rule ----------------------------------------------------------

Rule = Callable[[_Lowering, Node], None]


Ranges = dict[sympy.Symbol, int]


def _ranges(shape: Sequence[Dim], reduce_shape: Sequence[Dim] = ()) -> Ranges:
    """The extents of i0.. (and r0..) for a kernel over `shape` (symbolic sizes: unknown)."""
    out: Ranges = {ivar(k): int(d) for k, d in enumerate(shape) if isinstance(d, int)}
    out.update({rvar(k): int(d) for k, d in enumerate(reduce_shape) if isinstance(d, int)})
    return out


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


def _device(n: Node) -> str:
    """n's (first result's) device: the values a rule makes inside its kernel's body (indices,
    constants) carry it, since elementwise prims refuse operands of mixed devices."""
    t = n.results[0].type
    return t.device if isinstance(t, TensorType) else "cpu"


def _index(bb: BodyBuilder, e: Dim, device: str, name: str) -> Value:
    """`loop.index(index=e)` on `device` (cpu, the default, is left unwritten)."""
    kw: dict[str, Arg] = {"index": index_value(e)}
    if device != "cpu":
        kw["device"] = device
    return bb.b.op("loop.index", [], kw, name=name)


def _iota(lw: _Lowering, n: Node) -> None:
    start, step = _attr(n, "start", 0), _attr(n, "step", 1)
    dtype = n.kwargs["dtype"]

    def emit(bb: BodyBuilder, loads: list[Value]) -> Value:
        e = simplify_dim(as_sympy(start) + as_sympy(step) * ivar(0))
        v = _index(bb, e, _device(n), f"{n.results[0].name}.i")
        if dtype == DType.i64:
            return v
        return bb.b.op("prims.convert_element_type", [v], {"dtype": dtype},
                       name=n.results[0].name)
    lw.pointwise(n, emit)


def _full(lw: _Lowering, n: Node) -> None:
    def emit(bb: BodyBuilder, loads: list[Value]) -> Value:
        return bb.b.op("prims.full", [], {**n.kwargs, "shape": []}, name=n.results[0].name)
    lw.pointwise(n, emit)


def _clamp(e: sympy.Expr, lo: int, hi: int, need_lo: bool, need_hi: bool) -> Dim:
    """e clamped to [lo, hi] where it may leave it (the loads of a `where`'s unselected side
    still run in C++: they must stay inside the buffer)."""
    out: Dim = e
    if need_lo:  # max_dim/min_dim: sympy's own Max/Min evaluation costs milliseconds a call
        out = max_dim(out, lo)
    if need_hi:
        out = min_dim(out, hi)
    return out


def _in_range(bb: BodyBuilder, var: sympy.Symbol, lo: int | None, hi: int | None,
              name: str, device: str) -> Value | None:
    """`lo <= var < hi` as a b8 body value on `device` (None: always true)."""
    conds = []
    if lo is not None or hi is not None:
        v = _index(bb, var, device, f"{name}.i")
        if lo is not None:
            conds.append(bb.b.op("prims.ge", [v, lo], {}, name=f"{name}.ge"))
        if hi is not None:
            conds.append(bb.b.op("prims.lt", [v, hi], {}, name=f"{name}.lt"))
    out = conds[0] if conds else None
    for c in conds[1:]:
        out = bb.b.op("prims.bitwise_and", [out, c], {}, name=f"{name}.and")
    return out


def _concatenate(lw: _Lowering, n: Node) -> None:
    """One pointwise kernel: piece k where its offset <= i_dim < its end (nested `where`s over
    the pieces' loads, their indices clamped into range), fused like any pointwise kernel
    (rotary embedding's cat becomes part of the kernel that reads it)."""
    pieces = n.args[0]
    t = n.results[0].type
    assert isinstance(pieces, list) and isinstance(t, TensorType)
    dim = int(_attr(n, "dim"))
    sizes = [p.type.shape[dim] for p in pieces if isinstance(p, Value)
             and isinstance(p.type, TensorType)]
    # the pieces' extents along `dim` must be known (the offsets are constants of the body);
    # the other dims may be size symbols (a size-generic kernel)
    if len(sizes) != len(pieces) or not all(isinstance(d, int) for d in sizes) \
            or not isinstance(t.shape[dim], int):
        lw.passthrough(n, n.op)
        return
    parts = [(p, off, sz) for p, off, sz in zip(pieces, itertools.accumulate([0, *sizes]),
                                                 sizes, strict=False) if sz > 0]

    def emit(bb: BodyBuilder, loads: list[Value]) -> Value:
        o = [ivar(k) for k in range(t.rank)]
        val: Value | None = None
        for k in reversed(range(len(parts))):
            p, off, sz = parts[k]
            idx = list(o)
            idx[dim] = _clamp(o[dim] - off, 0, sz - 1, k > 0, k < len(parts) - 1)
            buf, bidx = lw.index_of(p, idx, _ranges(t.shape))
            ld = bb.load(buf, bidx, n.loc)
            if val is None:
                val = ld
                continue
            cond = _in_range(bb, o[dim], None, off + sz, f"{n.results[0].name}.{k}",
                             t.device)
            val = bb.b.op("prims.where", [cond, ld, val], {}, name=f"{n.results[0].name}.{k}")
        assert val is not None
        return val
    if not parts:  # every piece is empty: so is the result
        lw.passthrough(n, n.op)
        return
    lw.pointwise(n, emit, loads=False)


def _pad(lw: _Lowering, n: Node) -> None:
    """`x` where the index falls inside it, else the padding value: one pointwise kernel
    (negative padding crops; interior padding stays an extern)."""
    x, xt = _x(n)
    t = n.results[0].type
    assert isinstance(t, TensorType)
    value = n.args[1]
    config = [[int(c) if isinstance(c, int) else c for c in cfg] for cfg in _attr(n, "config")]
    if not isinstance(value, (bool, int, float)) or any(c[2] != 0 for c in config) \
            or not all(isinstance(c, int) for cfg in config for c in cfg) \
            or not all(isinstance(d, int) for d in (*xt.shape, *t.shape)):
        lw.passthrough(n, n.op)
        return

    def emit(bb: BodyBuilder, loads: list[Value]) -> Value:
        name = n.results[0].name
        fill = bb.b.op("prims.full", [], {"shape": [], "value": value, "dtype": t.dtype,
                                          "device": t.device or "cpu"}, name=f"{name}.fill")
        if 0 in xt.shape:
            return fill
        o = [ivar(k) for k in range(t.rank)]
        idx: list[Dim] = []
        cond: Value | None = None
        for k, ((lo, hi, _), size) in enumerate(zip(config, xt.shape, strict=True)):
            idx.append(_clamp(o[k] - lo, 0, int(size) - 1, lo > 0, hi > 0))
            c = _in_range(bb, o[k], lo if lo > 0 else None, lo + int(size) if hi > 0 else None,
                          f"{name}.d{k}", t.device)
            if c is not None:
                cond = c if cond is None else bb.b.op("prims.bitwise_and", [cond, c], {},
                                                      name=f"{name}.d{k}.and")
        buf, bidx = lw.index_of(x, idx, _ranges(t.shape))
        ld = bb.load(buf, bidx, n.loc)
        if cond is None:
            return ld
        return bb.b.op("prims.where", [cond, ld, fill], {}, name=name)
    lw.pointwise(n, emit, loads=False)


def _gather(lw: _Lowering, n: Node) -> None:
    """A gather whose index varies only along `dim` and keeps x's other sizes (an embedding
    lookup: the ids broadcast over the row) is `index_select` of the 1-d ids
    (`loop.index_select`): rows copied whole, no [N, D] index materialised. Others stay
    `prims.gather` externs."""
    x, xt = _x(n)
    idx = n.args[1]
    t = n.results[0].type
    d = int(_attr(n, "dim"))
    assert isinstance(idx, Value) and isinstance(t, TensorType)
    lazy = lw.env.get(idx, idx)
    index = list(lazy.index) if isinstance(lazy, View) else [ivar(k) for k in range(t.rank)]
    src = lazy.src if isinstance(lazy, View) else lazy
    # (sizes may be symbols: the ids' count is the output's size along `dim`); the ids may
    # vary only along `dim` (size symbols in their index are constants of the call)
    others = {ivar(k) for k in range(t.rank) if k != d}
    if xt.rank != t.rank \
            or any(t.shape[k] != xt.shape[k] for k in range(t.rank) if k != d) \
            or any(not isinstance(e, int) and e.free_symbols & others for e in index) \
            or not isinstance(idx.type, TensorType):
        lw.passthrough(n, n.op)
        return
    ids = View(src, tuple(subst_index(e, {ivar(d): ivar(0)}) for e in index),
               TensorType(idx.type.dtype, (t.shape[d],), None, idx.type.device))
    name = n.results[0].name
    ids_buf = lw.real_view(ids, f"{name}.ids.view")
    lw.b.taken.discard(name)
    out = lw.b.emit("loop.extern", [lw.extern_operand(x), ids_buf],
                    {"op": "loop.index_select", "dim": d}, types=[t], names=[name], loc=n.loc)
    lw.env[n.results[0]] = out[0]


def _reduction(lw: _Lowering, n: Node) -> None:
    lw.reduction(n)


def _elementwise(lw: _Lowering, n: Node) -> None:
    lw.elementwise(n)


LOWERINGS: dict[str, Rule] = {
    **{p.op: _elementwise for p in PRIMS_BY_OP.values() if p.elementwise},
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
    "prims.concatenate": _concatenate,
    "prims.pad": _pad,
    "prims.gather": _gather,
}


LOWERING_TABLES: dict[str, dict[str, Rule]] = {"default": LOWERINGS}
# run on a lookup of a table not registered: lowering_plugins.py adds the `ember.lowerings`
# entry point loader here (it imports this module; this one never imports it: no cycle)
TABLE_LOADERS: list[Callable[[], None]] = []


def register_lowering_table(name: str, rules: dict[str, Rule], *, replace: bool = False
                            ) -> dict[str, Rule]:
    """Make `rules` (prim -> rule, e.g. a modified copy of LOWERINGS) selectable as
    `lower-loops{table=NAME}`."""
    if name == "default" or (name in LOWERING_TABLES and not replace):
        raise ValueError(f"lowering table {name} is already registered"
                         + ("" if name == "default" else " (pass replace=True to redefine it)"))
    LOWERING_TABLES[name] = rules
    return rules


@register_pass("lower-loops", "prims -> loop-level IR: pointwise/reduction kernels over index "
               "values, views as index rewrites, the rest extern; table=NAME picks a "
               "registered lowering table")
def lower_loops(module: Module, *, table: str = "default") -> Module:
    rules = LOWERING_TABLES.get(table)
    if rules is None:  # plugins' tables too (entry point group ember.lowerings)
        for load in TABLE_LOADERS:
            load()
        rules = LOWERING_TABLES.get(table)
    if rules is None:
        raise PipelineError(f"lower-loops: unknown lowering table {table!r} (known: "
                            f"{', '.join(sorted(LOWERING_TABLES))})")
    out = module.clone()
    bodies: list[Graph] = []
    taken: set[str] = set()
    for g in list(out.graphs.values()):
        if not _is_body(out, g):
            _Lowering(out, g, bodies, taken, _with_target_rules(g, rules)).run()
    for body in bodies:
        out.add(body)
    declare_domains(out)  # ir-v1.1: each body states the loops it runs over
    return out


def _with_target_rules(g: Graph, rules: dict[str, Rule]) -> dict[str, Rule]:
    """The table plus the rules of the target of g's device for ops the table leaves out (the
    CPU target's channels-last convolution, its fused attention): lowering itself knows no
    device. A device with no target gets the table alone (loop IR is device-neutral)."""
    kinds = {device_kind(d) for d in graph_devices(g)} or {"cpu"}
    target = targets().get(kinds.pop()) if len(kinds) == 1 else None
    if target is None or not target.lowerings:
        return rules
    return {**target.lowerings, **rules}


def _is_body(m: Module, g: Graph) -> bool:
    """A graph some loop node uses as its body (lowering it again would be wrong)."""
    return g.name in body_names(m)


def lowered_ops(module: Module) -> set[str]:
    return {n.op for g in module.graphs.values() for n in g.nodes}


__all__ = ["LOWERINGS", "LOWERING_TABLES", "View", "lower_loops", "lowered_ops",
           "register_lowering_table"]

