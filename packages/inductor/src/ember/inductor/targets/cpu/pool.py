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
"""

from __future__ import annotations

from ember.ir import Graph, Module, Node, TensorType, Value
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


__all__ = ["window_reduce"]
