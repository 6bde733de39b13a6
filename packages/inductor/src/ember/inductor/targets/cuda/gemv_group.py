"""`loop.gemv_group`: decode-step GEMVs with their epilogues, two to a launch (decode-gemv's
second half; the kernel is gemv_fused.py's).

After decode-gemv makes one-row products `loop.gemv`, `group_gemvs` rewrites a graph:

1. **epilogues**: a linear's bias add as matmul-lowp leaves it (`convert(y, f32)` +
   `convert(broadcast(b, [1, N], [1]), f32)` -> `convert(.., bf16)`) and an erf GELU reading
   only that (`u = convert(r, f32)`, `(u * 0.5) * (1 + erf(u * 0.7071067811865476))` ->
   `convert(.., bf16)`, r the linear or a reshape of it) move into the GEMV's epilogue: the
   pointwise kernel that ran them (a launch of its own after h_to_4h) goes away.
2. **pairs**: a GEMV and a later one whose input does not depend on it become one launch at
   the first one's place; the pure nodes computing the second one's input that sit between
   them move up before it (a GPT-NeoX layer: QKV with h_to_4h, which reads the other
   layernorm of the same residual; the attention's dense with 4h_to_h).

Each rewrite leaves the graph's values as they were but for the rounding of the bias add
(once, in f32, as cuBLAS's bias epilogue and eager's linear do, where the unfused form rounded
the product first).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ember.ir import DType, Graph, Node, TensorType, Value
from ember.ir.graph import Arg, fresh_name, value_names
from ember.ir.registry import OpTypeError, default_registry, register_op
from ember.ir.types import Type

OP = "loop.gemv_group"
EPILOGUES = ("none", "bias", "gelu", "bias+gelu")
GELU_C = 0.7071067811865476
# launch the group kernels with programmatic dependent launch (gemv_fused.py: the weight
# stream starts before the previous kernel ends; 0.3-0.9 us a launch on the H200);
# decode_attention.py signals its dependents
PDL = True


def _segments(args: Sequence[Any], kw: Mapping[str, Any]) -> list[tuple[Any, Any, Any, str]]:
    """(x, w, bias or None, epilogue) per product, from the flat args."""
    eps = kw.get("epilogues")
    if not isinstance(eps, list) or not 1 <= len(eps) <= 2 or any(e not in EPILOGUES
                                                                    for e in eps):
        raise OpTypeError(f"{OP}: epilogues must be a list of 1 or 2 of {list(EPILOGUES)}, "
                          f"got {eps!r}")
    out = []
    i = 0
    for e in eps:
        has_b = e.startswith("bias")
        need = 3 if has_b else 2
        if i + need > len(args):
            raise OpTypeError(f"{OP}: too few operands for epilogues {eps}")
        out.append((args[i], args[i + 1], args[i + 2] if has_b else None, e))
        i += need
    if i != len(args):
        raise OpTypeError(f"{OP}: {len(args)} operands for epilogues {eps} (want {i})")
    return out


def _infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    res: list[Type] = []
    for x, w, b, _ in _segments(args, kw):
        ts = [v.type if isinstance(v, Value) else None for v in (x, w, b) if v is not None]
        if not all(isinstance(t, TensorType) for t in ts):
            raise OpTypeError(f"{OP}: takes tensors (x [1, K], w [N, K], bias [N])")
        xt, wt = x.type, w.type
        if xt.rank != 2 or wt.rank != 2 or xt.shape[0] != 1 or xt.shape[1] != wt.shape[1] \
                or xt.dtype != wt.dtype:
            raise OpTypeError(f"{OP}: x must be [1, K] and w [N, K] of one dtype, got {xt}, "
                              f"{wt}")
        if b is not None and (b.type.rank != 1 or b.type.shape[0] != wt.shape[0]
                              or b.type.dtype != xt.dtype):
            raise OpTypeError(f"{OP}: the bias must be [{wt.shape[0]}] {xt.dtype}, got "
                              f"{b.type}")
        res.append(TensorType(xt.dtype, (1, wt.shape[0]), None, xt.device))
    return res


def _run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    from ember.inductor.targets.cuda.gemv_fused import gemv_pair
    segs = _segments(args, kw)
    flat: list[Any] = []
    for x, w, b, e in segs:
        flat += [x, w, b, "gelu" if e.endswith("gelu") else None]
    out = gemv_pair(*flat, pdl=PDL)
    return out[0] if len(out) == 1 else out


if default_registry().lookup(OP) is None:
    register_op(OP, "one or two one-row products x @ w.T (+ bias, erf GELU) in one Triton "
                "launch (gemv_fused.py; emitted by decode-gemv)", _infer, _run,
                aliasing="fresh")


def _uses(g: Graph) -> dict[int, list[Node | None]]:
    """id(value) -> the nodes reading it (None for a graph output)."""
    out: dict[int, list[Node | None]] = {}
    for n in g.nodes:
        for v in n.operands():
            out.setdefault(id(v), []).append(n)
    for v in g.outputs:
        out.setdefault(id(v), []).append(None)
    return out


def _only(uses: dict[int, list[Node | None]], v: Value, op: str) -> Node | None:
    """The one node reading v, if it is an `op` node (and v no graph output)."""
    us = uses.get(id(v), [])
    if len(us) != 1 or us[0] is None or us[0].op != op:
        return None
    return us[0]


def _convert_to(n: Node | None, dtype: DType) -> bool:
    return n is not None and n.op == "prims.convert_element_type" and n.kwargs.get(
        "dtype") == dtype


def _other(n: Node, v: Value) -> Any:
    """The other operand of a binary node reading v (None if v is not exactly one of them)."""
    a, b = n.args[0], n.args[1]
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


def _is_num(a: Any, want: float) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and float(a) == want


def _bias(uses: dict[int, list[Node | None]], y: Value) -> tuple[Value, list[Node], Node] | None:
    """(bias, the nodes it absorbs, the node whose result is the biased bf16 output)."""
    up = _only(uses, y, "prims.convert_element_type")
    if not _convert_to(up, DType.f32):
        return None
    assert up is not None
    add = _only(uses, up.results[0], "prims.add")
    if add is None:
        return None
    p = _other(add, up.results[0])
    if not isinstance(p, Value) or not _convert_to(p.node, DType.f32):
        return None
    assert p.node is not None
    bc = p.node.args[0]
    if not isinstance(bc, Value) or bc.node is None or bc.node.op != "prims.broadcast_in_dim":
        return None
    b = bc.node.args[0]
    yt = y.type
    assert isinstance(yt, TensorType)
    if not isinstance(b, Value) or not isinstance(b.type, TensorType) or b.type.rank != 1 \
            or b.type.shape[0] != yt.shape[1] or b.type.dtype != yt.dtype \
            or bc.node.kwargs.get("broadcast_dims") != [1]:
        return None
    down = _only(uses, add.results[0], "prims.convert_element_type")
    if not _convert_to(down, yt.dtype):
        return None
    assert down is not None
    return b, [up, add], down


def _gelu(uses: dict[int, list[Node | None]], y: Value) -> tuple[list[Node], Node] | None:
    """(the nodes an erf GELU of y absorbs, the node whose result is its bf16 output)."""
    eaten: list[Node] = []
    r = y
    rs = _only(uses, r, "prims.reshape")
    if rs is not None:
        eaten.append(rs)
        r = rs.results[0]
    up = _only(uses, r, "prims.convert_element_type")
    if not _convert_to(up, DType.f32):
        return None
    assert up is not None
    u = up.results[0]
    us = uses.get(id(u), [])
    if len(us) != 2 or any(n is None or n.op != "prims.mul" for n in us):
        return None
    m1 = next((n for n in us if n is not None and _is_num(_other(n, u), GELU_C)), None)
    half = next((n for n in us if n is not None and _is_num(_other(n, u), 0.5)), None)
    if m1 is None or half is None or m1 is half:
        return None
    erf = _only(uses, m1.results[0], "prims.erf")
    if erf is None:
        return None
    one = _only(uses, erf.results[0], "prims.add")
    if one is None or not _is_num(_other(one, erf.results[0]), 1.0):
        return None
    prod = _only(uses, one.results[0], "prims.mul")
    if prod is None or _other(prod, one.results[0]) is not half.results[0] \
            or _only(uses, half.results[0], "prims.mul") is not prod:
        return None
    down = _only(uses, prod.results[0], "prims.convert_element_type")
    if not isinstance(y.type, TensorType) or not _convert_to(down, y.type.dtype):
        return None
    assert down is not None
    return [*eaten, up, m1, half, erf, one, prod], down


def _absorb(g: Graph, i: int, taken: set[str], explain: bool) -> None:
    """g.nodes[i], a loop.gemv, as a one-product loop.gemv_group with the epilogue it absorbs."""
    n = g.nodes[i]
    x, w = n.args
    y = n.results[0]
    uses = _uses(g)
    eaten: list[Node] = []
    args: list[Arg] = [x, w]
    epi = "none"
    last: Node | None = None
    got = _bias(uses, y)
    if got is not None:
        b, nodes, last = got
        eaten += nodes
        args.append(b)
        epi = "bias"
        y = last.results[0]
    act = _gelu(uses, y)
    if act is not None:
        if last is not None:  # the biased output is the GELU's input only
            eaten.append(last)
        nodes, last = act
        eaten += nodes
        epi = "gelu" if epi == "none" else "bias+gelu"
    if last is None:  # nothing to absorb: it stays a loop.gemv (a pair may take it)
        return
    out = last.results[0]
    ot = out.type
    assert isinstance(ot, TensorType) and isinstance(y.type, TensorType)
    flat = TensorType(ot.dtype, (1, ot.shape[-1]), None, ot.device)
    if ot.shape == flat.shape:
        res = out
        drop = {id(m) for m in [*eaten, last]}
    else:  # the GELU read a reshape: the output keeps its shape through a view
        res = Value(fresh_name(f"{out.name}.gemv", taken, ""), flat)
        last.op, last.args, last.kwargs = "prims.reshape", [res], {"shape": list(ot.shape)}
        drop = {id(m) for m in eaten}
    node = Node(OP, args, {"epilogues": [epi]}, [res], n.loc)
    res.node = node
    g.nodes = [node if m is n else m for m in g.nodes if id(m) not in drop]
    if explain:
        print(f"decode-gemv: @{g.name} %{res.name}: the {epi} epilogue in the GEMV",
              file=sys.stderr)


def _deps(g: Graph, lo: int, hi: int, target: Node) -> set[int] | None:
    """The indices in (lo, hi) of the nodes `target` depends on (transitively); None when one
    of them is g.nodes[lo] itself or a node that may not move (side effects, a GEMV)."""
    pos = {id(r): k for k, m in enumerate(g.nodes) for r in m.results}
    reg = default_registry()
    need: set[int] = set()
    todo = [target]
    while todo:
        m = todo.pop()
        for v in m.operands():
            k = pos.get(id(v))
            if k is None or k < lo or k in need:
                continue
            if k == lo:
                return None
            p = g.nodes[k]
            d = reg.lookup(p.op)
            if p.op in (OP, "loop.gemv") or d is None or d.has_side_effects:
                return None
            need.add(k)
            todo.append(p)
    return need


def _reorders_effects(moved: list[Node], rest: list[Node]) -> bool:
    """Whether a moved node reads a value that a node it would move above writes in place."""
    reg = default_registry()
    written = {id(v) for m in rest if (d := reg.lookup(m.op)) is None or d.has_side_effects
               for v in m.operands()}
    return any(id(v) in written for m in moved for v in m.operands())


def _eps(n: Node) -> list[Arg]:
    """The epilogues of a group node, or a plain loop.gemv's (none); [] for any other node."""
    if n.op == "loop.gemv":
        x = n.args[0]
        one_row = isinstance(x, Value) and isinstance(x.type, TensorType) and x.type.shape[0] == 1
        return ["none"] if one_row else []
    e = n.kwargs.get("epilogues") if n.op == OP else None
    return e if isinstance(e, list) else []


def _pair(g: Graph, explain: bool) -> int:
    done = 0
    i = 0
    while i < len(g.nodes):
        a = g.nodes[i]
        if len(_eps(a)) != 1:
            i += 1
            continue
        xt = a.args[0].type  # type: ignore[union-attr]
        for j in range(i + 1, len(g.nodes)):
            b = g.nodes[j]
            if len(_eps(b)) != 1 \
                    or b.args[0].type.dtype != xt.dtype:  # type: ignore[union-attr]
                continue
            need = _deps(g, i, j, b)
            if need is None:
                continue
            node = Node(OP, [*a.args, *b.args], {"epilogues": [*_eps(a), *_eps(b)]},
                        [*a.results, *b.results], a.loc)
            for r in node.results:
                r.node = node
            moved = [g.nodes[k] for k in sorted(need)]
            rest = [m for k, m in enumerate(g.nodes[i + 1:j], i + 1) if k not in need]
            if _reorders_effects(moved, rest):
                continue
            g.nodes = [*g.nodes[:i], *moved, node, *rest, *g.nodes[j + 1:]]
            i += len(moved)
            done += 1
            if explain:
                print(f"decode-gemv: @{g.name} %{a.results[0].name} and "
                      f"%{b.results[0].name}: one launch", file=sys.stderr)
            break
        i += 1
    return done


def group_gemvs(g: Graph, explain: bool = False) -> None:
    """The rewrite of the module docstring on g, in place."""
    taken = value_names(g)
    for n in [m for m in g.nodes if m.op == "loop.gemv"]:
        if isinstance(n.args[0], Value) and isinstance(n.args[0].type, TensorType) \
                and n.args[0].type.dtype in (DType.bf16, DType.f16) \
                and n.args[0].type.shape[0] == 1:
            _absorb(g, g.nodes.index(n), taken, explain)
    _pair(g, explain)


def lower_gemv_group(lw: Any, n: Node) -> None:
    """An extern on strided views of x, the weights and the biases (no copies)."""
    lw.passthrough(n, n.op)


LOWERINGS = {OP: lower_gemv_group}

__all__ = ["EPILOGUES", "LOWERINGS", "OP", "group_gemvs", "lower_gemv_group"]
