"""VJP rules of the shape, reduction, scan and sorting prims.

Shape ops move cotangents back where the elements came from (broadcast sums, slice pads with
zeros, pad slices). Reductions follow torch: amax/amin share the gradient evenly among the
elements equal to the result (a NaN result gives NaN, as torch's scale_grad_by_count); prod and
cumprod are exact where factors are zero (products of the other factors, no division).
"""

from __future__ import annotations

from typing import Any

from ember.autograd.vjp.core import Grad, VJPContext, attr_list, kept_dims, vjp
from ember.ir import DType, Node, Value
from ember.ir.expr import Dim, as_sympy, simplify_dim


def _x_ct(node: Node, cts: list[Value | None]) -> tuple[Value, Value]:
    x, ct = node.args[0], cts[0]
    assert isinstance(x, Value) and ct is not None
    return x, ct


@vjp("prims.broadcast_in_dim")
def _broadcast(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, ct = _x_ct(node, cts)
    xs, out = ctx.shape(x), ctx.shape(ct)
    bdims = attr_list(node, "broadcast_dims")
    # sum over the new dims and over the operand's size-1 dims that were expanded
    expanded = [i for i, b in enumerate(bdims) if xs[i] == 1 and out[b] != 1]
    reduced = sorted(set(kept_dims(len(out), bdims)) | {bdims[i] for i in expanded})
    g = ctx.p("sum", ct, dims=reduced) if reduced else ct
    left = [b for b in range(len(out)) if b not in reduced]  # in the output's order
    want = [b for i, b in enumerate(bdims) if i not in expanded]  # in the operand's order
    if left != want:
        g = ctx.p("permute", g, dims=[left.index(b) for b in want])
    if expanded:
        g = ctx.p("unsqueeze", g, dims=expanded)
    return [g]


@vjp("prims.reshape")
def _reshape(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, ct = _x_ct(node, cts)
    return [ctx.p("reshape", ct, shape=list(ctx.shape(x)))]


@vjp("prims.permute")
def _permute(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    _, ct = _x_ct(node, cts)
    dims = attr_list(node, "dims")
    inverse = [dims.index(i) for i in range(len(dims))]
    return [_transposed_product(ctx, ct, inverse) or ctx.p("permute", ct, dims=inverse)]


def _is_swap_last(dims: list[int]) -> bool:
    r = len(dims)
    return r >= 2 and dims == [*range(r - 2), r - 1, r - 2]


def _transposed_product(ctx: VJPContext, ct: Value, dims: list[int]) -> Value | None:
    """`(a @ b)^T` as `b^T @ a^T` where `ct` is a backward matmul (a weight's gradient through
    the forward's `x @ W^T`): the product comes out in the layout it is returned in, instead of
    a transposed view that a kernel (or autograd's accumulation into `.grad`) copies. A swap of
    a swap is the value itself, so `(x^T @ g)^T` is `g^T @ x`, reading `x` as it is. A product
    rounded to f16/bf16 (`convert(a @ b)`: a low-precision linear computes in f32 and rounds
    once) is swapped under its rounding: without that the bf16 weight gradient came out
    transposed, and the copy putting it in the weight's layout lived beside it (a bf16 MLP
    training step's peak 1.7x eager's on the H200)."""
    if not _is_swap_last(dims):
        return None
    n = ctx.producer(ct)
    dtype = None
    if n is not None and n.op == "prims.convert_element_type" and isinstance(n.args[0], Value):
        dtype = n.kwargs.get("dtype")
        n = ctx.producer(n.args[0])
    if n is None or n.op != "prims.matmul":
        return None
    a, b = n.args
    if not (isinstance(a, Value) and isinstance(b, Value)
            and len(ctx.shape(a)) == len(ctx.shape(b)) == len(dims)):
        return None
    prod = ctx.p("matmul", _swapped(ctx, b, dims), _swapped(ctx, a, dims))
    return ctx.convert(prod, dtype) if isinstance(dtype, DType) else prod


def _swapped(ctx: VJPContext, x: Value, dims: list[int]) -> Value:
    n = ctx.producer(x)
    if n is not None and n.op == "prims.permute" and attr_list(n, "dims") == dims:
        src = n.args[0]
        assert isinstance(src, Value)
        return src
    return ctx.p("permute", x, dims=dims)


@vjp("prims.squeeze")
def _squeeze(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    _, ct = _x_ct(node, cts)
    dims = sorted(attr_list(node, "dims"))
    return [ctx.p("unsqueeze", ct, dims=dims) if dims else ct]


@vjp("prims.unsqueeze")
def _unsqueeze(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    _, ct = _x_ct(node, cts)
    dims = sorted(attr_list(node, "dims"))
    return [ctx.p("squeeze", ct, dims=dims) if dims else ct]


@vjp("prims.rev")
def _rev(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    _, ct = _x_ct(node, cts)
    return [ctx.p("rev", ct, dims=attr_list(node, "dims"))]


def _span(n: Dim, step: int) -> Dim:
    """How many positions n elements taken every `step` cover."""
    if isinstance(n, int) and n == 0:
        return 0
    return simplify_dim(as_sympy(n) + (as_sympy(n) - 1) * (step - 1))


@vjp("prims.slice")
def _slice(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, ct = _x_ct(node, cts)
    xs, out = ctx.shape(x), ctx.shape(ct)
    start = attr_list(node, "start")
    step = attr_list(node, "step", None) if node.kwargs.get("step") else [1] * len(xs)
    if any(isinstance(n, int) and n == 0 for n in out):
        return [ctx.zeros(ctx.t(x))]
    # the taken elements back at start, start + step, ...; zeros everywhere else
    config = [[s, simplify_dim(as_sympy(n) - as_sympy(s) - as_sympy(_span(m, st))), st - 1]
              for s, n, m, st in zip(start, xs, out, step, strict=True)]
    return [ctx.p("pad", ct, 0.0, config=config)]


@vjp("prims.pad")
def _pad(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, ct = _x_ct(node, cts)
    config: list[Any] = attr_list(node, "config")
    if any(isinstance(n, int) and n == 0 for n in ctx.shape(x)):
        return [ctx.zeros(ctx.t(x)), None]
    # undo lo/hi (a negative one cropped x's dilated form: pad the cotangent with zeros
    # there), then take every (interior + 1)-th element
    undo = [[simplify_dim(-as_sympy(lo)), simplify_dim(-as_sympy(hi)), 0]
            for lo, hi, _ in config]
    g = ct
    if any(lo != 0 or hi != 0 for lo, hi, _ in undo):
        g = ctx.p("pad", g, 0.0, config=undo)
    if any(c[2] for c in config):
        dilated = ctx.shape(g)
        g = ctx.p("slice", g, start=[0] * len(dilated), limit=list(dilated),
                  step=[int(c[2]) + 1 for c in config])
    return [g, None]


@vjp("prims.concatenate")
def _concatenate(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    xs = node.args[0]
    ct = cts[0]
    assert isinstance(xs, list) and ct is not None
    dim = node.kwargs["dim"]
    assert isinstance(dim, int)
    out = ctx.shape(ct)
    grads: list[Value | None] = []
    at: Any = 0
    for x in xs:
        n = ctx.shape(x)[dim]
        start = [simplify_dim(as_sympy(at)) if i == dim else 0 for i in range(len(out))]
        at = simplify_dim(as_sympy(at) + as_sympy(n))
        limit = [at if i == dim else d for i, d in enumerate(out)]
        grads.append(ctx.p("slice", ct, start=start, limit=limit, step=[1] * len(out)))
    return [grads]


# ---- reductions ---------------------------------------------------------------------------

def _dims(node: Node) -> list[int]:
    return sorted(attr_list(node, "dims"))


def _restore(ctx: VJPContext, r: Value, x: Value, dims: list[int]) -> Value:
    """A reduced value broadcast back over the reduced dims of x."""
    xs = ctx.shape(x)
    return ctx.bcast(r, xs, kept_dims(len(xs), dims)) if dims else r


@vjp("prims.sum")
def _sum(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, ct = _x_ct(node, cts)
    return [_restore(ctx, ct, x, _dims(node))]


def _amax_rule(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    # torch: (grad / mask.sum(dims)) * mask with mask = (x == result): ties share evenly
    x, ct = _x_ct(node, cts)
    dims = _dims(node)
    if not dims:
        return [ct]
    dt = ctx.t(x).dtype
    mask = ctx.convert(ctx.p("eq", x, _restore(ctx, node.results[0], x, dims)), dt)
    count = ctx.p("sum", mask, dims=dims)
    return [ctx.mul(_restore(ctx, ctx.div(ct, count), x, dims), mask)]


vjp("prims.amax", "prims.amin")(_amax_rule)


def _to_last(ctx: VJPContext, x: Value, dims: list[int]) -> tuple[Value, list[int]]:
    """x with `dims` moved to the end and flattened into one; and the permutation."""
    xs = ctx.shape(x)
    perm = kept_dims(len(xs), dims) + dims
    y = ctx.p("permute", x, dims=perm) if perm != list(range(len(xs))) else x
    n: Any = 1
    for d in dims:
        n = as_sympy(n) * as_sympy(xs[d])
    shape = [xs[d] for d in kept_dims(len(xs), dims)] + [simplify_dim(n)]
    if len(dims) != 1:
        y = ctx.p("reshape", y, shape=shape)
    return y, perm


def _exclusive_prod(ctx: VJPContext, x: Value, dim: int, reverse: bool) -> Value:
    """prod of the elements before each one along dim (after it, with `reverse`)."""
    if reverse:
        x = ctx.p("rev", x, dims=[dim])
    rank = len(ctx.shape(x))
    config = [[1, -1, 0] if i == dim else [0, 0, 0] for i in range(rank)]
    e = ctx.p("cumprod", ctx.p("pad", x, 1.0, config=config), dim=dim)
    return ctx.p("rev", e, dims=[dim]) if reverse else e


@vjp("prims.prod")
def _prod(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    # the product of every other factor: exclusive prefix times exclusive suffix products,
    # exact with zeros (torch's prod_safe_zeros_backward)
    x, ct = _x_ct(node, cts)
    dims = _dims(node)
    if not dims:
        return [ct]
    xs = ctx.shape(x)
    if any(isinstance(xs[d], int) and xs[d] == 0 for d in dims):
        return [ctx.zeros(ctx.t(x))]
    flat, perm = _to_last(ctx, x, dims)
    last = len(ctx.shape(flat)) - 1
    others = ctx.mul(_exclusive_prod(ctx, flat, last, False),
                     _exclusive_prod(ctx, flat, last, True))
    if len(dims) != 1:
        permuted = [xs[d] for d in perm]
        others = ctx.p("reshape", others, shape=permuted)
    if perm != list(range(len(xs))):
        others = ctx.p("permute", others, dims=[perm.index(i) for i in range(len(xs))])
    return [ctx.mul(_restore(ctx, ct, x, dims), others)]


# ---- scans ---------------------------------------------------------------------------------

@vjp("prims.cumsum")
def _cumsum(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    _, ct = _x_ct(node, cts)
    dim = node.kwargs["dim"]
    r = ctx.p("rev", ct, dims=[dim])
    return [ctx.p("rev", ctx.p("cumsum", r, dim=dim), dims=[dim])]


@vjp("prims.cumprod")
def _cumprod(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    # grad[k] = sum_{j >= k} ct[j] * prod_{i <= j, i != k} x[i], built on an [.., k, j, ..]
    # square (O(n^2) in the scanned dim; exact with zeros, as torch's cumprod_backward)
    x, ct = _x_ct(node, cts)
    dim = node.kwargs["dim"]
    assert isinstance(dim, int)
    xs = ctx.shape(x)
    n = xs[dim]
    if isinstance(n, int) and n <= 1:
        return [ct]
    tt = ctx.t(x)
    sq = list(xs[:dim + 1]) + [n] + list(xs[dim + 1:])  # dim: k, dim + 1: i (or j)
    keep = [d if d <= dim else d + 1 for d in range(len(xs))]
    i_idx = ctx.p("iota", length=n, start=0, step=1, dtype=DType.i64, device=tt.device)
    k_is_i = ctx.p("eq", ctx.bcast(i_idx, sq, [dim]), ctx.bcast(i_idx, sq, [dim + 1]))
    xk = ctx.bcast(x, sq, [d if d != dim else dim + 1 for d in keep])  # x[i] along dim + 1
    c = ctx.p("cumprod", ctx.where(k_is_i, 1.0, xk), dim=dim + 1)  # [k, j]
    j_ge_k = ctx.p("ge", ctx.bcast(i_idx, sq, [dim + 1]), ctx.bcast(i_idx, sq, [dim]))
    ctj = ctx.bcast(ct, sq, [d if d != dim else dim + 1 for d in keep])
    terms = ctx.where(j_ge_k, ctx.mul(ctj, c), 0.0)
    return [ctx.p("sum", terms, dims=[dim + 1])]


# ---- sorting -------------------------------------------------------------------------------

def _scatter_back(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    """sort/topk: the values' cotangent goes back to where each value came from."""
    x, ct = node.args[0], cts[0]
    assert isinstance(x, Value)
    if ct is None:
        return [None]
    idx = node.results[1]
    return [ctx.p("scatter_add", ctx.zeros(ctx.t(x)), idx, ct, dim=node.kwargs["dim"])]


vjp("prims.sort", "prims.topk")(_scatter_back)
