"""`loop.decode_attention_rope`: a decode step's GPT-NeoX rotary embedding of q and the new key
row folded into the decode attention kernel (decode-gemv{rope=true}).

After cache-inplace{attention=true} the attention extern reads q and the new key row from a
pointwise kernel of their own: transformers' `apply_rotary_pos_emb` on the first R dims
(`cat([x[:R] * cos + rotate_half(x[:R]) * sin, x[R:]])`, each product and the sum rounded to
bf16). `fold_rope` matches that form on both and hands the attention the unrotated rows (views
of the QKV projection), cos and sin (R values each): the kernel rotates them in registers with
the same roundings (decode_attention.py), so the cache rows are eager's bit for bit and the
rotary kernel's launch is gone. bf16 only; batch 1 (cos and sin of one position).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ember.inductor.targets.cuda.inplace import ATTENTION_OP, _attention_infer, emit_extern
from ember.ir import DType, Graph, Node, TensorType, Value
from ember.ir.graph import Arg
from ember.ir.registry import OpTypeError, default_registry, register_op
from ember.ir.types import Type

OP = "loop.decode_attention_rope"
VIEWS = ("prims.broadcast_in_dim", "prims.unsqueeze", "prims.reshape")


def _infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    if len(args) not in (8, 9):
        raise OpTypeError(f"{OP}: takes (q, k_cache, v_cache, pos, k_new, v_new, cos, sin"
                          f"[, bias])")
    cos, sin = args[6], args[7]
    for t in (cos, sin):
        if not isinstance(t, Value) or not isinstance(t.type, TensorType) \
                or t.type.dtype != DType.bf16:
            raise OpTypeError(f"{OP}: cos and sin must be bf16 tensors")
    return _attention_infer(ctx, [*args[:6], *args[8:]], kw)


def _run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    from ember.inductor.targets.cuda.decode_attention import decode_attention_
    q, kc, vc, pos, kn, vn, cos, sin = args[:8]
    bias = args[8] if len(args) > 8 else None
    out = decode_attention_(q, kc, vc, pos, kn, vn, bias, kw.get("scale"), rope=(cos, sin))
    return out, kc, vc


if default_registry().lookup(OP) is None:
    register_op(OP, "loop.decode_attention_inplace with GPT-NeoX's rotary embedding of q and "
                "the new key row (cos, sin of R values) done in the kernel (decode_rope.py; "
                "emitted by decode-gemv{rope=true})", _infer, _run, has_side_effects=True,
                aliasing="alias")


def _node(v: Any, op: str) -> Node | None:
    return v.node if isinstance(v, Value) and v.node is not None and v.node.op == op else None


def _conv(v: Any, dtype: DType) -> Any:
    """v's operand if v is convert_element_type(.., dtype), else None."""
    n = _node(v, "prims.convert_element_type")
    return n.args[0] if n is not None and n.kwargs.get("dtype") == dtype else None


def _source(v: Any) -> Any:
    """v through broadcasts, unsqueezes and reshapes."""
    while isinstance(v, Value) and v.node is not None and v.node.op in VIEWS:
        v = v.node.args[0]
    return v


def _slice_of(v: Any, lo: int, hi: int) -> Any:
    """x if v = slice(x) on its last dim [lo, hi) (all of the others), else None."""
    n = _node(v, "prims.slice")
    if n is None or not isinstance(n.args[0], Value) \
            or not isinstance(n.args[0].type, TensorType):
        return None
    x = n.args[0]
    shape = list(x.type.shape)  # type: ignore[union-attr]
    step = n.kwargs.get("step")
    if n.kwargs.get("start") != [0] * (len(shape) - 1) + [lo] \
            or n.kwargs.get("limit") != shape[:-1] + [hi] \
            or (step is not None and step != [1] * len(shape)):
        return None
    return x


def _two(cat: Node | None) -> tuple[Any, Any] | None:
    """The two parts of a concatenate node (None for another node or count)."""
    if cat is None or not isinstance(cat.args[0], list) or len(cat.args[0]) != 2:
        return None
    return cat.args[0][0], cat.args[0][1]


def _products(v: Any) -> tuple[Any, Any] | None:
    """(a, b) of convert(mul(a', b'), bf16) with a', b' f32 converts of a, b."""
    m = _node(_conv(v, DType.bf16), "prims.mul")
    if m is None:
        return None
    a, b = (_conv(x, DType.f32) for x in m.args[:2])
    return (a, b) if a is not None and b is not None else None


def _rope(v: Any) -> tuple[Value, Value, Value, int] | None:
    """(x, cos, sin, R) when v = cat([rope(x[..., :R]), x[..., R:]]) as transformers writes it."""
    cat = _node(v, "prims.concatenate")
    parts = _two(cat)
    if cat is None or parts is None or not isinstance(v.type, TensorType) \
            or v.type.dtype != DType.bf16 or cat.kwargs.get("dim") not in (v.type.rank - 1, -1):
        return None
    rot, rest = parts
    E = v.type.shape[-1]
    if not isinstance(rot, Value) or not isinstance(rot.type, TensorType):
        return None
    R = rot.type.shape[-1]
    if not isinstance(R, int) or R % 2 or not isinstance(E, int):
        return None
    x = _slice_of(rest, R, E)
    add = _node(_conv(rot, DType.bf16), "prims.add")
    if x is None or add is None:
        return None
    terms = [_products(_conv(t, DType.f32)) for t in add.args[:2]]
    if any(t is None for t in terms):
        return None
    got: dict[str, Any] = {}
    for a, b in terms:  # type: ignore[misc]
        for p, c in ((a, b), (b, a)):
            if _slice_of(p, 0, R) is x:
                got["cos"] = _source(c)
            two = _two(_node(p, "prims.concatenate"))
            if two is not None:
                neg, lo = two
                first = _node(neg, "prims.neg")
                h = R // 2
                if first is not None and _slice_of(first.args[0], h, R) is not None \
                        and _slice_of(_slice_of(first.args[0], h, R), 0, R) is x \
                        and _slice_of(lo, 0, h) is not None \
                        and _slice_of(_slice_of(lo, 0, h), 0, R) is x:
                    got["sin"] = _source(c)
    cos, sin = got.get("cos"), got.get("sin")
    for t in (cos, sin):
        if not isinstance(t, Value) or not isinstance(t.type, TensorType) \
                or t.type.dtype != DType.bf16 or list(t.type.shape)[:-1] != [1] * (
                    t.type.rank - 1) or t.type.shape[-1] != R:
            return None
    return x, cos, sin, R  # type: ignore[return-value]


def _identity_views(v: Any) -> Any:
    """v through permutes that compose to the identity (cache-inplace's `.rows` views)."""
    perm: list[int] | None = None
    while (n := _node(v, "prims.permute")) is not None:
        p = n.kwargs.get("dims")
        assert isinstance(p, list)
        perm = list(p) if perm is None else [p[i] for i in perm]
        v = n.args[0]
    return v if perm is None or perm == sorted(perm) else None


def swap_node(g: Graph, i: int, op: str, args: list[Arg], kwargs: dict[str, Arg]) -> None:
    """g's node i becomes op(args, kwargs) with the same results (and location)."""
    n = g.nodes[i]
    g.nodes[i] = Node(op, args, kwargs, list(n.results), n.loc)
    for r in n.results:
        r.node = g.nodes[i]


def fold_rope(g: Graph, explain: bool = False) -> int:
    """Rewrite each decode attention whose q and new key row are transformers' rotary of rows
    of one cos/sin into loop.decode_attention_rope; the count."""
    done = 0
    for i, n in enumerate(g.nodes):
        if n.op != ATTENTION_OP:
            continue
        q = _rope(n.args[0])
        k = _rope(_identity_views(n.args[4]))
        if q is None or k is None or q[1] is not k[1] or q[2] is not k[2]:
            if explain:
                print(f"decode-gemv: @{g.name} %{n.results[0].name}: rotary kept (not "
                      f"transformers' form on q and k with one cos/sin)", file=sys.stderr)
            continue
        args = [q[0], *n.args[1:4], k[0], n.args[5], q[1], q[2], *n.args[6:]]
        swap_node(g, i, OP, args, dict(n.kwargs))
        done += 1
        if explain:
            print(f"decode-gemv: @{g.name} %{n.results[0].name}: rotary ({q[3]} dims) in "
                  f"the attention kernel", file=sys.stderr)
    return done


def lower_decode_attention_rope(lw: Any, n: Node) -> None:
    """An extern on its operands as they are (strided views of the QKV projection)."""
    emit_extern(lw, n, [lw.extern_operand(a) for a in n.args if isinstance(a, Value)])


LOWERINGS = {OP: lower_decode_attention_rope}

__all__ = ["LOWERINGS", "OP", "fold_rope", "lower_decode_attention_rope", "swap_node"]
