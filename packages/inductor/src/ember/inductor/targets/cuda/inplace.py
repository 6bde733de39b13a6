"""`cache-inplace` (before lower-loops): a static KV cache's new slots written in place.

Both targets run it (first in `inductor-cpu`; in `inductor-cuda` with `attention=true`, the
CUDA decode attention kernel); the op's lowering is `lower_inplace` on both.

A decode step with a static cache (transformers' `StaticCache.update`) writes each layer's new
key and value rows with `keys.index_copy_(2, cache_position, k)`. Capture makes that pure: the
graph computes `index_copy(keys, ...)` as a new tensor, the attention reads it, it is returned,
and the runtime copies it into `keys` after the call (`input_updates`). Decomposed, it is

    %x = prims.permute(%keys, dims=P)                      # the written dim first
    %i = prims.broadcast_in_dim(%pos, shape=[n, ...], broadcast_dims=[0])
    %s = prims.scatter(%x, %i, %src, dim=0)                # a copy of the whole cache + n rows
    %new = prims.permute(%s, dims=P^-1)                    # read by attention, returned

which on the GPU is, per cache and layer, a copy of the whole cache (the scatter's clone), the
scatter, a copy of its permuted result into a graph output, and the write-back's copy into
`keys`: four launches and three passes over the cache for n new rows.

Where the runtime says the result replaces the input (`backend_module`'s `replaced_inputs`
attribute: [[param, result], ...], no autograd record) and nothing else in the graph reads the
input's old value, this pass writes the rows into the input itself:

    %new = loop.index_copy_inplace(%keys, %pos, prims.permute(%src, dims=P^-1), dim=P[0])

an extern (`x.index_copy_(dim, index, src)`, one small kernel) whose result is the input
tensor itself: the attention reads the cache in place, the graph returns `keys`, and the
write-back (`write_back`: `new is old`) and the CUDA graph's in-graph copy have nothing to do.
`cache-inplace{explain=true}` prints what each update got and why (stderr).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ember.ir import Graph, Module, Node, TensorType, Value
from ember.ir.graph import Arg, fresh_name, value_names
from ember.ir.passes import register_pass
from ember.ir.registry import OpTypeError, default_registry, register_op
from ember.ir.types import Type

OP = "loop.index_copy_inplace"
ATTENTION_OP = "loop.decode_attention_inplace"
# torch's fused CUDA attention ops: (is_causal's position, the bias's position or None)
_ATTENTION_ARGS = {"aten._scaled_dot_product_flash_attention.default": (4, None),
                   "aten._scaled_dot_product_efficient_attention.default": (6, 3),
                   "aten._scaled_dot_product_cudnn_attention.default": (6, 3)}
_DROPOUT_AT = {"aten._scaled_dot_product_flash_attention.default": 3,
               "aten._scaled_dot_product_efficient_attention.default": 5,
               "aten._scaled_dot_product_cudnn_attention.default": 5}
REPLACED_INPUTS = "replaced_inputs"  # ember.runtime.writeback.REPLACED_INPUTS (no import: layers)
PERMUTE, SCATTER, BROADCAST = "prims.permute", "prims.scatter", "prims.broadcast_in_dim"


def _infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    if len(args) != 3 or not all(isinstance(a, Value) and isinstance(a.type, TensorType)
                                 for a in args):
        raise OpTypeError(f"{OP}: takes (x, index, src) tensors")
    x, idx, src = (a.type for a in args)  # type: ignore[union-attr]
    assert isinstance(x, TensorType) and isinstance(idx, TensorType)
    assert isinstance(src, TensorType)
    dim = kw.get("dim")
    if not isinstance(dim, int) or not 0 <= dim < x.rank:
        raise OpTypeError(f"{OP}: dim= must be a dim of x (rank {x.rank}), got {dim!r}")
    if idx.rank != 1 or not idx.dtype.is_integer:
        raise OpTypeError(f"{OP}: index must be a 1-d integer tensor, got {idx}")
    want = (*x.shape[:dim], idx.shape[0], *x.shape[dim + 1:])
    if src.dtype != x.dtype or tuple(src.shape) != want:
        raise OpTypeError(f"{OP}: src must be {x.dtype.name}{list(want)}, got {src}")
    return [x]


def _run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    x, idx, src = args
    return x.index_copy_(int(kw["dim"]), idx, src)  # x itself: the rows written in place


def _attention_infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    if len(args) not in (6, 7) or not all(isinstance(a, Value) and isinstance(a.type, TensorType)
                                          for a in args):
        raise OpTypeError(f"{ATTENTION_OP}: takes (q, k_cache, v_cache, pos, k_new, v_new"
                          f"[, bias]) tensors")
    q, kc, vc, pos, kn, vn = (a.type for a in args[:6])  # type: ignore[union-attr]
    assert isinstance(q, TensorType) and isinstance(kc, TensorType)
    assert isinstance(vc, TensorType) and isinstance(pos, TensorType)
    assert isinstance(kn, TensorType) and isinstance(vn, TensorType)
    if kc.rank != 4 or vc.shape != kc.shape:
        raise OpTypeError(f"{ATTENTION_OP}: the caches must be [B, H, S, E] alike, got {kc}, "
                          f"{vc}")
    B, H, _, E = kc.shape
    one = (B, H, 1, E)
    if tuple(q.shape) != one or tuple(kn.shape) != one or tuple(vn.shape) != one:
        raise OpTypeError(f"{ATTENTION_OP}: q, k_new and v_new must be {list(one)}, got "
                          f"{q}, {kn}, {vn}")
    if pos.rank != 1 or pos.shape[0] != 1 or not pos.dtype.is_integer:
        raise OpTypeError(f"{ATTENTION_OP}: pos must be one integer position, got {pos}")
    if len({q.dtype, kc.dtype, vc.dtype, kn.dtype, vn.dtype}) != 1:
        raise OpTypeError(f"{ATTENTION_OP}: q, the caches and the new rows must share a dtype")
    bias = args[6].type if len(args) > 6 else None  # type: ignore[union-attr]
    if isinstance(bias, TensorType) and (bias.rank != 4 or any(
            d not in (1, w) for d, w in zip(bias.shape, (B, H, 1, kc.shape[2]), strict=True))):
        raise OpTypeError(f"{ATTENTION_OP}: the bias must broadcast to "
                          f"{[B, H, 1, kc.shape[2]]}, got {bias}")
    out = TensorType(q.dtype, one, None, q.device)
    return [out, kc, vc]


def _attention_run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    from ember.inductor.targets.cuda.decode_attention import decode_attention_
    q, kc, vc, pos, kn, vn = args[:6]
    bias = args[6] if len(args) > 6 else None
    out = decode_attention_(q, kc, vc, pos, kn, vn, bias, kw.get("scale"))
    return out, kc, vc


def _register() -> None:
    reg = default_registry()
    if reg.lookup(OP) is None:
        register_op(OP, "x with x.select(dim, index[i]) = src.select(dim, i), written into x "
                    "in place (x itself is the result: a static KV cache's update; an "
                    "extern's op, emitted by cache-inplace)", _infer, _run,
                    has_side_effects=True, aliasing="alias")
    if reg.lookup(ATTENTION_OP) is None:
        register_op(ATTENTION_OP, "a decode step's attention of one query row per head over a "
                    "static KV cache, the step's new key and value rows written into the caches "
                    "at pos first (in place): results (out [B, H, 1, E], the key cache, the "
                    "value cache); one Triton kernel (decode_attention.py), emitted by "
                    "cache-inplace{attention=true}", _attention_infer, _attention_run,
                    has_side_effects=True, aliasing="alias")


_register()


def _users(g: Graph) -> dict[Value, list[Node]]:
    out: dict[Value, list[Node]] = {}
    for n in g.nodes:
        for v in n.operands():
            out.setdefault(v, []).append(n)
    return out


def _perm_of(v: Value) -> tuple[Value, list[int]]:
    """(source, dims) where v = permute(source, dims); (v, identity) otherwise."""
    n = v.node
    if n is not None and n.op == PERMUTE and isinstance(n.args[0], Value):
        dims = n.kwargs["dims"]
        assert isinstance(dims, list)
        return n.args[0], [int(d) for d in dims]
    t = v.type
    return v, list(range(t.rank if isinstance(t, TensorType) else 0))


def _match(g: Graph, p: int, r: int, users: dict[Value, list[Node]]
           ) -> tuple[Node, Value, Value, list[int]] | str:
    """(scatter, index, src, perm) where output r is param p with rows index_copied in, the
    scatter's input param p (permuted by perm) read by nothing else; else why not."""
    if not 0 <= p < len(g.params) or not 0 <= r < len(g.outputs):
        return "the update's indices are out of range"
    x, out = g.params[p], g.outputs[r]
    s_val, back = _perm_of(out)
    s = s_val.node
    if s is None or s.op != SCATTER or int(s.kwargs.get("dim", -1)) != 0:  # type: ignore
        return "the result is not a scatter along the first dim (or a permute of one)"
    first, idx_b, src = s.args[:3]
    if not (isinstance(first, Value) and isinstance(idx_b, Value) and isinstance(src, Value)):
        return "the scatter's operands are not tensors"
    base, perm = _perm_of(first)
    if base is not x:
        return "the scatter does not write the updated input (or a permute of it)"
    if [perm[b] for b in back] != list(range(len(perm))):
        return f"the result's permute {back} does not undo the input's {perm}"
    b = idx_b.node
    if b is None or b.op != BROADCAST or b.kwargs.get("broadcast_dims") != [0] \
            or not isinstance(b.args[0], Value):
        return "the scatter's index is not one index per row (broadcast along the first dim)"
    idx = b.args[0]
    it, st = idx.type, src.type
    if not isinstance(it, TensorType) or it.rank != 1 or not isinstance(st, TensorType) \
            or list(idx_b.type.shape) != list(st.shape):  # type: ignore[union-attr]
        return "the scatter's index and src shapes are not an index_copy's"
    readers = [n for n in users.get(x, [])]
    if first is not x:
        if readers != [first.node] or users.get(first, []) != [s]:
            return "the input's old value is read by other nodes"
    elif readers != [s]:
        return "the input's old value is read by other nodes"
    if any(o is x for o in g.outputs):
        return "the input itself is a graph output"
    return s, idx, src, perm


def _rewrite(g: Graph, explain: bool) -> int:
    raw = g.attrs.get(REPLACED_INPUTS)
    if not isinstance(raw, list):
        return 0
    # one walk of the graph for the readers and one rebuild at the end: per update a full walk
    # made the pass quadratic in the layer count (13.8 s at 16 layers)
    users = _users(g)
    taken = value_names(g)
    subst: dict[Value, Value] = {}
    after: dict[int, list[Node]] = {}
    done = 0
    for pair in raw:
        if not isinstance(pair, list) or len(pair) != 2:
            continue
        p, r = pair
        if not isinstance(p, int) or not isinstance(r, int):
            continue
        got = _match(g, p, r, users)
        if isinstance(got, str):
            if explain:
                print(f"cache-inplace: @{g.name} input {p} <- result {r}: kept ({got})",
                      file=sys.stderr)
            continue
        s, idx, src, perm = got
        x = g.params[p]
        xt = x.type
        assert isinstance(xt, TensorType)
        inv = [perm.index(k) for k in range(len(perm))]
        new: list[Node] = []
        if inv != list(range(len(inv))):
            st = src.type
            assert isinstance(st, TensorType)
            sv = Value(fresh_name(f"{src.name}.rows", taken, ""),
                       dataclasses.replace(st, shape=tuple(st.shape[k] for k in inv),
                                           strides=None))
            sn = Node(PERMUTE, [src], {"dims": list(inv)}, [sv], s.loc)
            sv.node = sn
            new.append(sn)
            src = sv
        w = Value(fresh_name(f"{x.name}.inplace", taken, ""), xt)
        wn = Node(OP, [x, idx, src], {"dim": perm[0]}, [w], s.loc)
        w.node = wn
        new.append(wn)
        out = g.outputs[r]
        # the scatter's other readers read it as before: a permute of the written input
        rest = [u for u in users.get(s.results[0], []) if u is not out.node]
        if rest:
            pv = Value(fresh_name(f"{w.name}.perm", taken, ""), s.results[0].type)
            pn = Node(PERMUTE, [w], {"dims": list(perm)}, [pv], s.loc)
            pv.node = pn
            new.append(pn)
            subst[s.results[0]] = pv
        subst[out] = w
        after.setdefault(id(s), []).extend(new)
        done += 1
        if explain:
            print(f"cache-inplace: @{g.name} input {p} <- result {r}: rows written in place "
                  f"(index_copy_ along dim {perm[0]})", file=sys.stderr)
    if done:
        _apply(g, subst, after=after)
    return done


def _apply(g: Graph, subst: dict[Value, Value], *, after: dict[int, list[Node]] | None = None,
           instead: dict[int, Node] | None = None, drop: set[int] | None = None) -> None:
    """One rebuild of g: nodes `after` a node inserted behind it, a node replaced `instead`,
    nodes in `drop` removed; then every read (and output) of a key of `subst` reads its value."""
    from ember.ir.graph import map_args
    after, instead, drop = after or {}, instead or {}, drop or set()
    nodes: list[Node] = []
    for n in g.nodes:
        if id(n) in instead:
            nodes.append(instead[id(n)])
        elif id(n) not in drop:
            nodes.append(n)
        nodes.extend(after.get(id(n), ()))

    def sub(v: Value) -> Value:
        return subst.get(v, v)
    for n in nodes:
        n.args = [map_args(a, sub) for a in n.args]
        n.kwargs = {k: map_args(a, sub) for k, a in n.kwargs.items()}
    g.outputs = [subst.get(o, o) for o in g.outputs]
    g.nodes = nodes


def _arg(n: Node, at: int, name: str, default: Arg) -> Arg:
    return n.args[at] if len(n.args) > at else n.kwargs.get(name, default)


def _fuse_attention(g: Graph, a: Node, users: dict[Value, list[Node]], max_len: int,
                    taken: set[str]) -> Node | str:
    """The one-kernel decode attention replacing attention node `a` and the two in-place row
    writes it reads (a decode step: one query row, one new row per cache), or why not."""
    causal_at, bias_at = _ATTENTION_ARGS[a.op]
    if _arg(a, _DROPOUT_AT[a.op], "dropout_p", 0.0) not in (0, 0.0):
        return "dropout"
    if _arg(a, causal_at, "is_causal", False):
        return "is_causal (a top-left causal mask: not a decode step's)"
    q, k, v = a.args[:3]
    if not (isinstance(q, Value) and isinstance(k, Value) and isinstance(v, Value)):
        return "q, k, v are not tensors"
    wk, wv = k.node, v.node
    if wk is None or wv is None or wk.op != OP or wv.op != OP:
        return "k and v are not the caches written in place (cache-inplace)"
    if wk.kwargs.get("dim") != 2 or wv.kwargs.get("dim") != 2 or wk.args[1] is not wv.args[1]:
        return "the rows are not written along the length dim at one position"
    if any(r in users for r in a.results[1:]):
        return "the attention's other results are read"
    if [u for u in users.get(k, []) if u is not a] or [u for u in users.get(v, []) if u is not a]:
        return "the written caches have other readers"
    bias = _arg(a, bias_at, "attn_bias", None) if bias_at is not None else None
    args: list[Arg] = [q, wk.args[0], wv.args[0], wk.args[1], wk.args[2], wv.args[2]]
    if isinstance(bias, Value):
        args.append(bias)
    try:
        types = _attention_infer(None, args, {})
    except OpTypeError as e:
        return str(e)
    S = types[1].shape[2] if isinstance(types[1], TensorType) else None
    if not isinstance(S, int) or S > max_len:
        return f"a cache of {S} rows: one program per head is slower than torch's kernels " \
               f"past {max_len} (attention_max_len=)"
    scale = a.kwargs.get("scale")
    outs = [Value(fresh_name(f"{a.results[0].name}.decode", taken, ""), types[0]),
            Value(fresh_name(f"{k.name}.decode", taken, ""), types[1]),
            Value(fresh_name(f"{v.name}.decode", taken, ""), types[2])]
    f = Node(ATTENTION_OP, args, {} if scale is None else {"scale": scale}, outs, a.loc)
    for o in outs:
        o.node = f
    return f


def _fuse_attentions(g: Graph, explain: bool, max_len: int) -> int:
    users = _users(g)  # once: each fusion touches its own layer's nodes only
    taken = value_names(g)
    subst: dict[Value, Value] = {}
    instead: dict[int, Node] = {}
    drop: set[int] = set()
    done = 0
    for a in [n for n in g.nodes if n.op in _ATTENTION_ARGS]:
        got = _fuse_attention(g, a, users, max_len, taken)
        name = a.results[0].name
        if isinstance(got, str):
            if explain:
                print(f"cache-inplace: @{g.name} %{name}: attention kept ({got})", file=sys.stderr)
            continue
        k, v = a.args[1], a.args[2]
        assert isinstance(k, Value) and isinstance(v, Value)
        assert k.node is not None and v.node is not None
        instead[id(a)] = got
        drop |= {id(k.node), id(v.node)}
        subst.update({a.results[0]: got.results[0], k: got.results[1], v: got.results[2]})
        done += 1
        if explain:
            print(f"cache-inplace: @{g.name} %{name}: one decode-attention kernel (rows written, "
                  f"attention over the caches)", file=sys.stderr)
    if done:
        _apply(g, subst, instead=instead, drop=drop)
    return done


@register_pass("cache-inplace", "CPU and CUDA: an input the runtime replaces with an "
               "index_copy of it (a static KV cache's update) gets its new rows written in "
               "place by one extern (no copy of the cache, no write-back); CUDA's "
               "attention=true also makes a decode step's attention over two such caches (of "
               "at most attention_max_len rows) one Triton kernel with the row writes; "
               "explain=true says why each was or was not; dce after it drops the scatter")
def cache_inplace(module: Module, *, explain: bool = False, attention: bool = False,
                  attention_max_len: int = 512) -> Module:
    if not any(REPLACED_INPUTS in g.attrs for g in module.graphs.values()):
        return module  # (most graphs: nothing to do, no clone)
    out = module.clone()
    for g in out.graphs.values():
        if _rewrite(g, explain) and attention:
            _fuse_attentions(g, explain, attention_max_len)
    return out


def emit_extern(lw: Any, n: Node, args: list[Value]) -> None:
    """n as a `loop.extern` of its op on `args` (the lowered operands) and its kwargs, its
    results renamed fresh (the externs of this target and decode_rope.py)."""
    outs = lw.b.emit("loop.extern", args, {"op": n.op, **n.kwargs},
                     types=[r.type for r in n.results], names=[r.name for r in n.results],
                     loc=n.loc)
    lw.env.update(zip(n.results, outs, strict=True))


def lower_inplace(lw: Any, n: Node) -> None:
    """The op as an extern on the input itself and the index; its rows (src) a buffer of their
    own, written by a copy kernel where they are a view (a slice of the qkv projection), which
    `fuse` merges with the kernel computing the other heads' rows (rotary): no launch of its
    own, and the projection's bias add is not written for a strided read."""
    x, idx, src = n.args
    assert isinstance(x, Value) and isinstance(idx, Value) and isinstance(src, Value)
    rows = lw.materialize(src)  # (first: the order its kernel and the views are emitted in)
    emit_extern(lw, n, [lw.extern_operand(x), lw.extern_operand(idx), rows])


def lower_decode_attention(lw: Any, n: Node) -> None:
    """An extern on q, the caches, the position and the bias as they are (strided views), the
    new rows as buffers of their own (the rotary kernel writes them, as for lower_inplace)."""
    emit_extern(lw, n, [lw.materialize(a) if i in (4, 5) else lw.extern_operand(a)
                        for i, a in enumerate(n.args) if isinstance(a, Value)])


LOWERINGS = {OP: lower_inplace, ATTENTION_OP: lower_decode_attention}

__all__ = ["ATTENTION_OP", "LOWERINGS", "OP", "REPLACED_INPUTS", "cache_inplace",
           "lower_decode_attention", "lower_inplace"]
