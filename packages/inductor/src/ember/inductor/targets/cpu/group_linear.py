"""`group-linears`: linears that read one input become one product over their weights concatenated.

A transformer block's q, k and v projections (and llama's gate and up projections) read the same
activation. `F.linear(x, w, b)` arrives as

    %t = prims.permute(%w, dims=[1, 0])
    %y = prims.matmul(%x, %t)
    %yb = prims.add(prims.broadcast_in_dim(%b, shape=[M, N], broadcast_dims=[1]), %y)

and each product is a call of its own (the packed linear, linear.py: dispatch, oneDNN's setup
and, with threads, a fork and join each). This pass rewrites the products of one 2-d `x` by
weights that are graph inputs (parameters) into one product by their concatenation, as
TorchInductor's and TensorRT's horizontal fusion do:

    %wc = prims.concatenate([%wq, %wk, %wv], dim=0)
    %y = prims.matmul(%x, prims.permute(%wc, dims=[1, 0]))
    (+ broadcast of prims.concatenate([%bq, %bk, %bv], dim=0))
    %q = prims.slice(%y, start=[0, 0], limit=[M, Nq])   ... one slice per linear

The slices are views: their readers (the reshape and permute to heads, the attention extern,
rotary's kernel) read the [M, Nq + Nk + Nv] result through strides, no copy. This module's
`lower_matmul` (the CPU target's rule for prims.matmul; linear.py's for other products) turns
the product of a concatenation of parameters into one `loop.linear_grouped` extern on the
parts (the bias add folded in), whose call concatenates the weights (and biases) once and
keeps them, and linear.py's packed weight, while the parameters keep their versions.

Grouped: the products of one `x` (2-d, f32: the packed linear's operands) by the transpose of
a 2-d f32 parameter of static sizes, with a bias that is a parameter ([N], added by a
broadcast along the columns, the product read by that add alone) or without one: a group
holds linears all with or all without a bias (a zero bias for the others would cost an add
of zeros over their columns), at least 2 and at most MAX_PARTS; not a linear whose result is
a graph output (the slice would be copied into the output). Only inference graphs (no
`saved=` attribute): in training the weights change every step, so the concatenation would be
copied anew each call, and a training forward keeps torch.mm (linear.py). A linear whose
result an extern reads through views alone (bert's and t5's q, k, v straight into the
attention or a bmm) is grouped only where the thread count at compile is at least
`extern_threads` (EXTERN_THREADS), a decision of the compiling process as schedule-cpu's are.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ember.inductor.lowering import _Lowering
from ember.inductor.targets.cpu import linear
from ember.inductor.wrapper import register_binder
from ember.ir import (
    Arg,
    DType,
    Graph,
    InferContext,
    Interpreter,
    Module,
    Node,
    OpDef,
    OpTypeError,
    Ref,
    TensorType,
    Type,
    Value,
    default_registry,
)
from ember.ir.builder import Builder, BuildError
from ember.ir.passes import register_pass
from ember.ir.passes.utils import replace_uses

MAX_PARTS = 16  # operands of one extern call: a block has 2-3 linears on one input
GROUPED_OP = "loop.linear_grouped"
# At 1 thread the attention (flash.py) reading q, k, v as slices of one [M, 3N] result took
# ~10% longer than on three [M, N] results (bert's 2x4x128x64 heads: 1055 vs 961 us, ~100 us
# a layer), about what the one product saved (~150-200 us a layer in bert): zoo bert and
# t5-encoder grouping them at 1 thread, two runs (thread time, interleaved, 150 reps): bert
# 0.963x and 0.997x, t5 0.981x and 0.993x, within ~1% A/A noise or below. gate/up (read by
# the SiLU kernel) and llama's q, k, v (rotary's kernel, repeat_kv's copy) gained. Above 2
# threads each call saved is also a fork and join (not measured here: no 16-core machine;
# benchmarks/device_queue/group_linears16.sh).
EXTERN_THREADS = 3


@dataclass
class _Linear:
    """One linear of a group: its product, its weight, its bias (and the add), its result."""
    mm: Node
    w: Value
    n: int
    bias: Value | None
    add: Node | None
    result: Value


def _readers(g: Graph) -> dict[Value, list[Node]]:
    out: dict[Value, list[Node]] = {}
    for n in g.nodes:
        for v in dict.fromkeys(n.operands()):
            out.setdefault(v, []).append(n)
    return out


def _static_f32(v: object, rank: int) -> TensorType | None:
    if not isinstance(v, Value) or not isinstance(v.type, TensorType):
        return None
    t = v.type
    if t.rank != rank or t.dtype != DType.f32 or not all(isinstance(d, int) for d in t.shape):
        return None
    return t


def _bias(g: Graph, y: Value, readers: dict[Value, list[Node]], params: set[Value],
          outputs: set[Value]) -> tuple[Value, Node] | None:
    """The parameter `b` and the add if `y` [M, N] is read only by add(broadcast(b), y)."""
    rs = readers.get(y, [])
    if y in outputs or len(rs) != 1:
        return None
    add = rs[0]
    if add.op != "prims.add" or add.kwargs or len(add.args) != 2 or len(add.results) != 1 \
            or add.results[0].type != y.type:
        return None
    other = add.args[1] if add.args[0] is y else add.args[0]
    bc = other.node if isinstance(other, Value) and other is not y else None
    if bc is None or bc.op != "prims.broadcast_in_dim" or bc.kwargs.get("broadcast_dims") != [1]:
        return None
    b = bc.args[0]
    yt = y.type
    bt = _static_f32(b, 1)
    if bt is None or b not in params or not isinstance(yt, TensorType) \
            or list(bt.shape) != [yt.shape[1]]:
        return None
    assert isinstance(b, Value)
    return b, add


def _member(g: Graph, n: Node, readers: dict[Value, list[Node]], params: set[Value],
            outputs: set[Value]) -> _Linear | None:
    if n.op != "prims.matmul" or n.kwargs or len(n.args) != 2 or len(n.results) != 1:
        return None
    x, t = n.args
    if not (isinstance(x, Value) and isinstance(x.type, TensorType) and x.type.rank == 2
            and x.type.dtype == DType.f32):  # (its rows may be symbolic)
        return None
    p = t.node if isinstance(t, Value) else None
    if p is None or p.op != "prims.permute" or p.kwargs.get("dims") != [1, 0]:
        return None
    w = p.args[0]
    wt = _static_f32(w, 2)
    if wt is None or w not in params:
        return None
    assert isinstance(w, Value)
    y = n.results[0]
    found = _bias(g, y, readers, params, outputs)
    b, add = found if found is not None else (None, None)
    res = add.results[0] if add is not None else y
    if res in outputs:  # (returned as is: a slice would be copied into an output)
        return None
    return _Linear(n, w, int(wt.shape[0]), b, add, res)


# views: their readers read the linear's result itself (strided). Not broadcast_in_dim: what
# reads a broadcast is (nearly always) a kernel's copy, as llama's repeat_kv (an expand, then
# a reshape merging the repeated heads) before its attention
_VIEWS = frozenset({"prims.reshape", "prims.permute", "prims.slice", "prims.squeeze",
                    "prims.unsqueeze", "prims.rev"})


def _extern_reads(v: Value, readers: dict[Value, list[Node]], outputs: set[Value]) -> bool:
    """Whether an extern op (an attention, a product: not a prims kernel) or a graph output
    reads `v` through views alone: where `v` is a slice of the grouped result, it reads the
    wider result's rows with their longer stride (no kernel copies it first)."""
    todo, seen = [v], set()
    while todo:
        u = todo.pop()
        if u in outputs:
            return True
        for r in readers.get(u, []):
            if r.op in _VIEWS and len(r.results) == 1:
                if r.results[0] not in seen:
                    seen.add(r.results[0])
                    todo.append(r.results[0])
            elif r.op == "prims.matmul" or not r.op.startswith("prims."):
                return True
    return False


def _groups(g: Graph, extern_ok: bool) -> list[list[_Linear]]:
    readers = _readers(g)
    params = set(g.params)
    outputs = {o for o in g.outputs if isinstance(o, Value)}
    by: dict[tuple[Value, bool], list[_Linear]] = {}
    for n in g.nodes:
        m = _member(g, n, readers, params, outputs)
        if m is not None and (extern_ok or not _extern_reads(m.result, readers, outputs)):
            x = n.args[0]
            assert isinstance(x, Value)
            by.setdefault((x, m.bias is not None), []).append(m)
    out: list[list[_Linear]] = []
    for ms in by.values():
        # a linear wider than all the others together is left alone (phi's fc1 beside q, k,
        # v): its share of the product gains little, and its readers (the GELU kernel) read
        # it with the longer stride (phi's GELU kernel 530 -> 715 us a layer): zoo phi at 1
        # thread with q, k, fc1 grouped 0.991x (paired -1047 us), with q, k only 1.005x
        # (+200 us; thread time, interleaved, 150 reps)
        while len(ms) >= 2 and 2 * max(m.n for m in ms) > sum(m.n for m in ms):
            widest = max(ms, key=lambda m: m.n)
            ms = [m for m in ms if m is not widest]
        for k in range(0, len(ms), MAX_PARTS):
            if len(ms[k:k + MAX_PARTS]) >= 2:
                out.append(ms[k:k + MAX_PARTS])
    return out


def _emit(b: Builder, group: list[_Linear]) -> list[Value]:
    """The grouped product's nodes (appended to b.nodes) and the slice standing for each
    linear's result."""
    first = group[0].mm
    x = first.args[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    loc = first.loc
    rows = x.type.shape[0]
    total = sum(m.n for m in group)
    wc = b.op("prims.concatenate", [[m.w for m in group]], {"dim": 0}, loc=loc)
    wt = b.op("prims.permute", [wc], {"dims": [1, 0]}, loc=loc)
    y = b.op("prims.matmul", [x, wt], loc=loc)
    if group[0].bias is not None:
        bc = b.op("prims.concatenate", [[m.bias for m in group]], {"dim": 0}, loc=loc)
        bb = b.op("prims.broadcast_in_dim", [bc],
                  {"shape": [rows, total], "broadcast_dims": [1]}, loc=loc)
        y = b.op("prims.add", [bb, y], loc=loc)
    out: list[Value] = []
    off = 0
    for m in group:
        out.append(b.op("prims.slice", [y], {"start": [0, off], "limit": [rows, off + m.n]},
                        loc=m.mm.loc))
        off += m.n
    return out


def _rewrite(module: Module, g: Graph, extern_ok: bool) -> None:
    groups = _groups(g, extern_ok)
    if not groups:
        return
    taken = {v.name for n in g.nodes for v in n.results} | {p.name for p in g.params}
    at: dict[int, list[Node]] = {}  # id(first product) -> the nodes taking its place
    gone: set[int] = set()
    mapping: dict[Value, Value] = {}
    for group in groups:
        b = Builder(module, [], taken=taken)
        try:
            slices = _emit(b, group)
        except BuildError:  # (a type rule refused: leave the group as it is)
            continue
        taken = b.taken
        at[id(group[0].mm)] = b.nodes
        for m, s in zip(group, slices, strict=True):
            mapping[m.result] = s
            gone.add(id(m.mm))
            if m.add is not None:
                gone.add(id(m.add))
    nodes: list[Node] = []
    for n in g.nodes:
        nodes.extend(at.get(id(n), ()))
        if id(n) not in gone:
            nodes.append(n)
    g.nodes = nodes
    replace_uses(g, mapping)
    # the weights' transposes and the biases' broadcasts read by nothing else now
    while True:
        used = {v for n in g.nodes for v in n.operands()} | set(g.outputs)
        dead = [n for n in g.nodes if n.op in ("prims.permute", "prims.broadcast_in_dim")
                and not any(r in used for r in n.results)]
        if not dead:
            return
        drop = {id(n) for n in dead}
        g.nodes = [n for n in g.nodes if id(n) not in drop]


@register_pass("group-linears", "CPU, inference graphs: the linears of one 2-d input by "
               "parameter weights (all with or all without a parameter bias) become one "
               "product by the concatenated weights, sliced per linear (q/k/v, gate/up)")
def group_linears(module: Module, *, extern_threads: int = EXTERN_THREADS) -> Module:
    """`extern_threads`: a linear whose result an extern reads through views alone (q, k, v
    straight into an attention or a product) is grouped only where the thread count at
    compile is at least this (as schedule-cpu, the decision is the compiling process's)."""
    out = module.clone()
    extern_ok = torch.get_num_threads() >= extern_threads
    for g in out.graphs.values():
        if "saved" not in g.attrs:
            _rewrite(out, g, extern_ok)
    return out


# ---- the CPU lowering: one packed linear over the concatenated parameters --------------------

_USAGE = (f"{GROUPED_OP} takes x [M, K], parts= weights [N_i, K] and, with bias=true, parts= "
          f"biases [N_i], all of one dtype")


def _attrs(kw: Mapping[str, Any]) -> tuple[int, bool]:
    parts, bias = kw.get("parts"), kw.get("bias", False)
    if parts.__class__ is not int or not 1 <= parts <= MAX_PARTS or bias.__class__ is not bool \
            or set(kw) - {"parts", "bias"}:
        raise OpTypeError(_USAGE)
    return int(parts), bool(bias)


def _infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    parts, bias = _attrs(kw)
    if len(args) != 1 + parts * (1 + bias):
        raise OpTypeError(_USAGE)
    x = args[0]
    if not (isinstance(x, Value) and isinstance(x.type, TensorType) and x.type.rank == 2):
        raise OpTypeError(_USAGE)
    xt = x.type
    total: Any = 0
    for k, w in enumerate(args[1:1 + parts]):
        if not (isinstance(w, Value) and isinstance(w.type, TensorType) and w.type.rank == 2
                and w.type.dtype == xt.dtype and w.type.shape[1] == xt.shape[1]):
            raise OpTypeError(_USAGE)
        if bias:
            b = args[1 + parts + k]
            if not (isinstance(b, Value) and isinstance(b.type, TensorType)
                    and list(b.type.shape) == [w.type.shape[0]] and b.type.dtype == xt.dtype):
                raise OpTypeError(_USAGE)
        total = total + w.type.shape[0]
    return [TensorType(xt.dtype, (xt.shape[0], total), None, xt.device)]


# a bound call's remembered concatenation: the parts (weakly), their versions and data
# pointers, the concatenated weight (a Parameter: linear.py packs and caches only those) and
# bias, the parts' data (held: a freed storage's address must not come back under the same key)
_Cat = tuple[tuple[weakref.ref[Any], ...], tuple[int, ...], torch.Tensor | None,
             torch.Tensor | None, tuple[torch.Tensor, ...]]


def _dead() -> None:
    return None


def bind(kw: Mapping[str, Any]) -> Callable[..., torch.Tensor]:
    """The wrapper's call of the op: x @ cat(weights).T + cat(biases) by linear.py's bound
    call (oneDNN on the concatenation's pack, or addmm, by the same size rule), the
    concatenation made once and kept while every part keeps its version and data pointer
    (the contract of linear.py's and packed.py's packs: a write that bypasses the version
    counter is not seen). Where autograd needs the product, a part has no version counter
    (an inference-mode tensor) or a part is not an nn.Parameter (a buffer: linear.py keeps
    only Parameters' packs), the concatenation is made for the call alone."""
    parts, bias = _attrs(kw)
    inner = linear.bind({"bias": True} if bias else {})
    state: _Cat = ((), (), None, None, ())  # (one tuple, replaced whole: see linear.bind)

    def fresh(ops: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = torch.cat([t.detach() for t in ops[:parts]])
        return w, torch.cat([t.detach() for t in ops[parts:]]) if bias else None

    def call(x: torch.Tensor, *ops: torch.Tensor) -> torch.Tensor:
        nonlocal state
        s = state
        if torch.is_grad_enabled() and any(t.requires_grad for t in ops):
            return torch.nn.functional.linear(
                x, torch.cat(ops[:parts]), torch.cat(ops[parts:]) if bias else None)
        try:
            key = tuple(v for t in ops for v in (t._version, t.data_ptr()))
        except RuntimeError:  # an inference-mode tensor: no version counter
            w, b = fresh(ops)
            return torch.nn.functional.linear(x, w, b)
        w_cat, b_cat = s[2], s[3]
        if w_cat is None or key != s[1] or len(s[0]) != len(ops) \
                or not all(r() is t for r, t in zip(s[0], ops, strict=True)):
            w, b_cat = fresh(ops)
            if not all(isinstance(t, torch.nn.Parameter) for t in ops):
                # a buffer or a caller's tensor may be rewritten without its version moving
                # (`.data`, as batch norm's running statistics are): as linear.py, which
                # keeps only Parameters' packs, concatenated for this call alone
                return torch.nn.functional.linear(x, w, b_cat)
            w_cat = torch.nn.Parameter(w, requires_grad=False)
            state = (tuple(weakref.ref(t) for t in ops), key, w_cat, b_cat,
                     tuple(t.detach() for t in ops))
        return inner(x, w_cat, b_cat) if bias else inner(x, w_cat)
    return call


def _run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    return bind(kw)(*args)


def _param_parts(lw: _Lowering, v: object, rank: int) -> list[Value] | None:
    """The parameters `v` concatenates along dim 0, if it is such a prims.concatenate of
    unchanged f32 graph inputs of static sizes and rank `rank`."""
    c = v.node if isinstance(v, Value) else None
    if c is None or c.op != "prims.concatenate" or c.kwargs.get("dim") != 0 or not c.args \
            or not isinstance(c.args[0], list) or not 1 <= len(c.args[0]) <= MAX_PARTS:
        return None
    params = set(lw.g.params)
    out: list[Value] = []
    for p in c.args[0]:
        if _static_f32(p, rank) is None or p not in params or lw.env.get(p, p) is not p:
            return None
        assert isinstance(p, Value)
        out.append(p)
    return out


def _grouped_weights(lw: _Lowering, n: Node) -> list[Value] | None:
    """The weights of a product `x @ concatenate(w_1, ..., w_n).T` (group-linears' form) of a
    graph that is not a training one, if it is that."""
    if "saved" in lw.g.attrs or len(n.args) != 2 or len(n.results) != 1:
        return None
    x, t = n.args
    p = t.node if isinstance(t, Value) else None
    if not (isinstance(x, Value) and isinstance(x.type, TensorType) and x.type.rank == 2
            and x.type.dtype == DType.f32) or p is None or p.op != "prims.permute" \
            or p.kwargs.get("dims") != [1, 0]:
        return None
    return _param_parts(lw, p.args[0], 2)


def _bias_parts(lw: _Lowering, y: Value, ws: list[Value]) -> tuple[list[Value], list[Node]] | None:
    """The biases group-linears adds to the product `y`, if `y` is read only by
    add(broadcast(concatenate(b_1, ..., b_n)), y), each b_i an [N_i] parameter and the
    broadcast and concatenation read by nothing else: the parts and those three nodes (the
    pass emits them after the product: not lowered yet)."""
    rs = lw.readers(y)
    outputs = set(lw.g.outputs)
    if y in outputs or len(rs) != 1:
        return None
    add = rs[0]
    if add.op != "prims.add" or add.kwargs or len(add.args) != 2 or add.results[0].type != y.type:
        return None
    other = add.args[1] if add.args[0] is y else add.args[0]
    if not isinstance(other, Value) or other is y or other in outputs \
            or len(lw.readers(other)) != 1:
        return None
    bc = other.node
    if bc is None or bc.op != "prims.broadcast_in_dim" or bc.kwargs.get("broadcast_dims") != [1]:
        return None
    cat = bc.args[0]
    bs = _param_parts(lw, cat, 1)
    if bs is None or not isinstance(cat, Value) or len(bs) != len(ws) or cat in outputs \
            or len(lw.readers(cat)) != 1 \
            or not all(isinstance(b.type, TensorType) and isinstance(w.type, TensorType)
                       and b.type.shape[0] == w.type.shape[0]
                       for b, w in zip(bs, ws, strict=True)):
        return None
    assert isinstance(cat, Value) and cat.node is not None
    return bs, [add, bc, cat.node]


def lower_matmul(lw: _Lowering, n: Node) -> None:
    """`prims.matmul(x, concatenate(w_1, ..., w_n).T)` of parameters (group-linears): one
    `loop.linear_grouped` extern on the parts (the bias add folded in where the bias is a
    concatenation of parameters too); any other product: linear.py's rule."""
    ws = _grouped_weights(lw, n)
    if ws is None:
        linear.lower_matmul(lw, n)
        return
    x = n.args[0]
    assert isinstance(x, Value)
    res = n.results[0]
    found = _bias_parts(lw, res, ws)
    bs: list[Value] = []
    if found is not None:
        bs, (add, bc, cat) = found
        lw.folded.update({add: res, bc: None, cat: None})
    _drop_weight_kernel(lw, n)
    lw.b.taken.discard(res.name)
    kw: dict[str, Arg] = {"op": GROUPED_OP, "parts": len(ws), **({"bias": True} if bs else {})}
    args = [lw.extern_operand(x), *ws, *bs]
    lw.env[res] = lw.b.emit("loop.extern", args, kw, types=[res.type], names=[res.name],
                            loc=n.loc)[0]


def _drop_weight_kernel(lw: _Lowering, n: Node) -> None:
    """Remove the kernel that lower-loops' concatenate rule emitted for the product's
    concatenated weights where only this product reads them (through its transpose): the
    extern reads the parts. (The table's rule runs first: the target's rules only fill in.)"""
    t = n.args[1]
    p = t.node if isinstance(t, Value) else None
    cat = p.args[0] if p is not None else None
    outputs = set(lw.g.outputs)
    if not isinstance(t, Value) or not isinstance(cat, Value) or lw.readers(t) != [n] \
            or p is None or lw.readers(cat) != [p] or t in outputs or cat in outputs:
        return
    k = lw.env.get(cat)
    if not isinstance(k, Value):
        return
    kn = k.node
    if kn is None or kn.op != "loop.pointwise" or not kn.args or not isinstance(kn.args[0], Ref) \
            or not any(m is kn for m in lw.b.nodes) \
            or any(k in m.operands() for m in lw.b.nodes):
        return
    body = kn.args[0].name
    lw.b.nodes[:] = [m for m in lw.b.nodes if m is not kn]
    lw.bodies[:] = [b for b in lw.bodies if b.name != body]
    del lw.env[cat]


GROUPED_OPDEF = OpDef(GROUPED_OP, "x [M, K] times the transpose of the concatenation of "
                      "parts= [N_i, K] weights, plus that of their [N_i] biases (bias=true): "
                      "linear_packed on the concatenation, made once (an extern's op)",
                      _infer, _run, aliasing="fresh")
if default_registry().lookup(GROUPED_OP) is None:
    default_registry().register(GROUPED_OPDEF)
register_binder(GROUPED_OP, bind)

__all__ = ["EXTERN_THREADS", "GROUPED_OP", "MAX_PARTS", "group_linears", "lower_matmul"]
