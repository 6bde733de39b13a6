"""`window-reduce`: a reduction over a stack of windows as an elementwise chain.

The decompositions of pooling (`max_pool2d`, `avg_pool2d`) stack the K shifted, strided views of
the (padded) input along a new last dim and reduce it:

    %w = prims.concatenate([unsqueeze(%s0, dims=[4]), ..., unsqueeze(%s8, dims=[4])], dim=4)
    %y = prims.amax(%w, dims=[4])

Lowered as written, the stack is a [N, C, H, W, K] buffer written by a kernel whose every
element evaluates all K branches of the concatenate's `where` chain (K loads each), then read
again by the reduction: a 3×3 max pool of ResNet's stem was 26% of its call (one thread). The
same value is `maximum(%s0, maximum(%s1, ...))`: one pointwise kernel with K loads per
output element, which fuses with its producers and readers. amax/amin become NaN-propagating
maximum/minimum chains (as amax/amin propagate NaN); a float sum becomes an add chain in the
stack's order (a different summation order than a loop reduction: within f32 tolerances).
Only a stack with no other reader is rewritten (and then removed, with its unsqueezes).

A max pool of a ReLU's result (GoogLeNet's stem: conv -> BN -> ReLU -> max pool, twice) is
`max_k relu(y_k)` = `max(0, max_k y_k)`: where the windows are slices of the ReLU (or of its
-inf pad) read by nothing else, the slices read `y` and the chain starts from `maximum(%s0, 0)`,
so the ReLU is computed once per output, where it was recomputed at each of the K loads of
`y` (the ReLU, a convolution's epilogue kernel, fused into the pool's kernel: a 3x3 window
evaluated it 9 times). Both NaN-propagating: NaN in a window gives NaN either way. The pad's
-inf elements are dropped by the 0 only where every window holds an element of `y` (else such
a window gave -inf, now 0): checked on the slices (their starts a grid, per dim each output
position reaching one unpadded element), as torch's pools always satisfy. (A window whose
largest element is -0.0 may give -0.0 where the ReLU first gave 0.0: equal as numbers.)
"""

from __future__ import annotations

import itertools
import math

from ember.ir import Arg, Graph, Module, Node, TensorType, Value
from ember.ir.graph import fresh_name
from ember.ir.passes import register_pass

CHAIN = {"prims.amax": "prims.maximum", "prims.amin": "prims.minimum", "prims.sum": "prims.add"}
MAX_PIECES = 64  # beyond this a loop reduction is the better kernel


@register_pass("window-reduce", "a reduction over a concatenate of size-1 pieces along the "
               "reduced dim (pooling's stacked windows) becomes an elementwise chain over the "
               "pieces: no [.., K] window buffer")
def window_reduce(module: Module) -> Module:
    out = module.clone()
    for g in out.graphs.values():
        _rewrite(g)
    return out


def _readers(g: Graph) -> dict[Value, int]:
    count: dict[Value, int] = {}
    for n in g.nodes:
        for v in set(n.operands()):
            count[v] = count.get(v, 0) + 1
    for v in g.outputs:
        count[v] = count.get(v, 0) + 1
    return count


def _pieces(cat: Node, d: int) -> list[Value] | None:
    """The stacked values without their size-1 dim `d`, or None if the concatenate is not a
    stack of unsqueezes along `d`."""
    args = cat.args[0] if cat.args else None
    if not isinstance(args, list) or not 1 < len(args) <= MAX_PIECES:
        return None
    out: list[Value] = []
    for a in args:
        u = a.node if isinstance(a, Value) else None
        if u is None or u.op != "prims.unsqueeze" or u.kwargs.get("dims") != [d] \
                or not isinstance(u.args[0], Value):
            return None
        out.append(u.args[0])
    return out


def _rewrite(g: Graph) -> None:
    readers = _readers(g)
    names = {v.name for n in g.nodes for v in n.results} | {p.name for p in g.params}
    new: dict[int, list[Node]] = {}
    dead: set[int] = set()  # the stacks rewritten, and their unsqueezes read nowhere else
    for n in g.nodes:
        op = CHAIN.get(n.op)
        x = n.args[0] if n.args else None
        t = n.results[0].type if len(n.results) == 1 else None
        dims = n.kwargs.get("dims")
        if op is None or not isinstance(x, Value) or x.node is None \
                or x.node.op != "prims.concatenate" or readers.get(x, 0) != 1 \
                or not isinstance(t, TensorType) or not isinstance(x.type, TensorType) \
                or not isinstance(dims, list) or len(dims) != 1 \
                or x.node.kwargs.get("dim") != dims[0] or len(n.kwargs) != 1:
            continue
        if n.op == "prims.sum" and not t.dtype.is_floating:
            continue
        pieces = _pieces(x.node, dims[0])
        if pieces is None or any(not isinstance(p.type, TensorType) or p.type.dtype != t.dtype
                                 or list(p.type.shape) != list(t.shape) for p in pieces):
            continue
        chain: list[Node] = []
        acc = pieces[0]
        res = n.results[0]
        relu = _relu_under(pieces, readers) if op == "prims.maximum" else None
        if relu is not None:  # max(relu(y_k)) = max(max(y_0, 0), y_1, ...): the ReLU once
            users, r, y, zero = relu
            for u in users:
                u.args = [y, *u.args[1:]]
            dead.add(id(r.node))
            v0 = Value(fresh_name(f"{res.name}.w0", names), t)
            first = Node(op, [acc, zero], {}, [v0], n.loc, n.pos)
            v0.node = first
            chain.append(first)
            acc = v0
        for k, p in enumerate(pieces[1:], 1):
            last = k == len(pieces) - 1
            name = res.name if last else fresh_name(f"{res.name}.w{k}", names)
            v = res if last else Value(name, t)
            node = Node(op, [acc, p], {}, [v], n.loc, n.pos)
            v.node = node
            chain.append(node)
            acc = v
        new[id(n)] = chain
        dead.add(id(x.node))
        for a in x.node.args[0]:  # type: ignore[union-attr]
            if isinstance(a, Value) and readers.get(a, 0) == 1 and a.node is not None:
                dead.add(id(a.node))
    if new:
        g.nodes = [m for n in g.nodes if id(n) not in dead for m in new.get(id(n), [n])]


def _relu_under(pieces: list[Value], readers: dict[Value, int]
                ) -> tuple[list[Node], Value, Value, Arg] | None:
    """Where the pieces are slices (each read once) of one value read by them only, that
    value being the ReLU `r = maximum(y, 0)` or a -inf pad of it whose windows each reach an
    element of `r` (the pad alone reading `r`): the nodes reading `r` (the pad, or the
    slices), `r`, `y` and the ReLU's zero. Else None."""
    slices = [p.node for p in pieces]
    src = slices[0].args[0] if slices[0] is not None and slices[0].args else None
    if not isinstance(src, Value) or readers.get(src, 0) != len(pieces) \
            or any(s is None or s.op != "prims.slice" or s.args[0] is not src
                   or readers.get(p, 0) != 1 for s, p in zip(slices, pieces, strict=True)):
        return None
    pad = src.node if src.node is not None and src.node.op == "prims.pad" else None
    r = pad.args[0] if pad is not None else src
    if not isinstance(r, Value) or r.node is None or r.node.op != "prims.maximum" \
            or r.node.kwargs or len(r.node.args) != 2 \
            or (pad is not None and readers.get(r, 0) != 1):
        return None
    a, b = r.node.args
    y, zero = (a, b) if isinstance(a, Value) else (b, a)
    if not isinstance(y, Value) or y.type != r.type or isinstance(zero, bool) \
            or not isinstance(zero, (int, float)) or zero != 0:
        return None
    if pad is not None and not _windows_reach(pad, [s for s in slices if s is not None]):
        return None
    return ([pad] if pad is not None else [s for s in slices if s is not None]), r, y, zero


def _windows_reach(pad: Node, slices: list[Node]) -> bool:
    """The -inf pad's slices form a grid of window offsets (one stride), and along each dim
    every output position's window reaches an unpadded element: no window is all padding."""
    x, value = pad.args[0], pad.args[1] if len(pad.args) > 1 else None
    cfg = pad.kwargs.get("config")
    out = slices[0].results[0].type
    if not isinstance(x, Value) or not isinstance(x.type, TensorType) \
            or not isinstance(value, float) or not (math.isinf(value) and value < 0) \
            or not isinstance(out, TensorType) or not isinstance(cfg, list) \
            or len(cfg) != x.type.rank \
            or not all(isinstance(d, int) for d in (*x.type.shape, *out.shape)):
        return False
    rank = x.type.rank
    starts, steps = [], set()
    for s in slices:
        st, sp = s.kwargs.get("start"), s.kwargs.get("step") or [1] * rank
        if not isinstance(st, list) or not isinstance(sp, list) or len(st) != rank \
                or s.results[0].type != out:
            return False
        starts.append(tuple(st))
        steps.add(tuple(sp))
    offsets = [sorted({st[d] for st in starts}) for d in range(rank)]
    if len(steps) != 1 or len(set(starts)) != len(starts) \
            or set(starts) != set(itertools.product(*offsets)):
        return False
    step = steps.pop()
    for d in range(rank):
        c = cfg[d]
        if not isinstance(c, list) or len(c) != 3 or c[2] != 0 or c[0] < 0 or c[1] < 0:
            return False
        lo, size = c[0], x.type.shape[d]
        if not all(any(lo <= o + i * step[d] < lo + size for o in offsets[d])
                   for i in range(out.shape[d])):
            return False
    return True


__all__ = ["window_reduce"]
