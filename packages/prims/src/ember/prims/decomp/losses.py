"""Decompositions of losses: nll_loss_forward, nll_loss2d_forward and their backward ops.

`F.cross_entropy` reaches ember as `_log_softmax` (norms.py) then `nll_loss_forward` (or
`nll_loss2d_forward` for [N, C, H, W] inputs); label smoothing is composite (mul/sum/where
around the same two ops), so these complete cross entropy in every form.

The input is [C] with a 0-d target, or [N, C, *] with target [N, *]; the class dim is 1 (0 for a
1-d input). Each target element picks -input[..t..] * weight[t] (weight 1 when absent); an
element whose target equals `ignore_index` gives 0 and adds nothing to `total_weight`, the sum
of the weights picked. reduction 0 ('none') returns the per-element losses and total_weight 0
(a 1-d input's total_weight is still its one weight, as eager's kernel); 2 ('sum') their sum;
1 ('mean') their sum / total_weight (NaN when every target is ignored, as eager).

The pick of the target's element is pushed through the ops that made the input, where they are
add/sub/convert of values of the input's shape or broadcast along the class dim: cross
entropy's `log_softmax(x)[t]` becomes `(x[t] - max) - log(sum)` (the same operations on the same
elements, so the same bits), so the [N, C] log-probabilities are never computed when nothing
else reads them, and the gradient reaches `log(sum)` without a row sum of a one-hot.

Targets outside [0, C) other than ignore_index are not checked: eager raises IndexError, the
decomposition's result is undefined (as ember's other indexing decompositions, indexing.py).

The backward ops follow eager's CPU kernels: grad_input is 0 everywhere but at each target's
class, where it is -grad * weight[t] (grad divided by total_weight first for 'mean'); a one-hot
compare with the class index (not a scatter into zeros times grad, which would spread a NaN
gradient over the whole row as torch's Python decomposition does).
"""

from __future__ import annotations

from typing import Any

from ember.ir import DType, Node, Value
from ember.prims.decomp.context import DecompContext, DecompositionError, EagerRuntimeError
from ember.prims.decomp.pointwise import opmath
from ember.prims.decomp.table import register_decomposition

_REDUCTIONS = (0, 1, 2)  # none, mean, sum (torch's Reduction enum)


class _Layout:
    """Where the class dim is, and the target laid against the input (checked as eager)."""

    def __init__(self, ctx: DecompContext, self_: Value, target: Value, weight: Value | None,
                 reduction: int, ignore_index: int):
        op = ctx.node.op
        if ctx.dtype(target) != DType.i64:  # (torch's meta kernels refuse u8 too)
            raise EagerRuntimeError(f"{op}: expected target dtype to be Long, but got "
                                    f"{ctx.dtype(target).name}")
        rank, trank = ctx.rank(self_), ctx.rank(target)
        if rank == 0 or trank != max(rank - 1, 0):
            raise DecompositionError(f"{op}: input of rank {rank} with a target of rank "
                                     f"{trank}; expected [C] with [] or [N, C, *] with [N, *]")
        if weight is not None and ctx.rank(weight) != 1:
            raise DecompositionError(f"{op}: the weight must be 1-d")
        self.rank = rank
        self.cd = 1 if rank >= 2 else 0  # the class dim
        self.shape = list(ctx.shape(self_))
        self.tshape = list(ctx.shape(target))
        self.target = target
        self.valid = ctx.prim("ne", target, ignore_index)
        # ignored targets read class 0 (any in-range index); their losses are masked out
        self.safe = ctx.prim("where", self.valid, target, 0)

    def index(self, ctx: DecompContext) -> Value:
        """The safe target as a gather index into the input: the class dim of size 1."""
        return ctx.prim("unsqueeze", self.safe, dims=[self.cd])

    def pick(self, ctx: DecompContext, x: Value) -> Value:
        """x[..target..] along the class dim, in the target's shape."""
        return ctx.prim("reshape", ctx.prim("gather", x, self.index(ctx), dim=self.cd),
                        shape=self.tshape)

    def along_classes(self, ctx: DecompContext, w: Value) -> Value:
        """The 1-d weight broadcast to the input's shape along the class dim."""
        return ctx.prim("broadcast_in_dim", w, shape=self.shape, broadcast_dims=[self.cd])

    def over_input(self, ctx: DecompContext, v: Value) -> Value:
        """A value of the target's shape (or 0-d) broadcast to the input's shape."""
        if ctx.rank(v) == 0:
            return ctx.prim("broadcast_in_dim", v, shape=self.shape, broadcast_dims=[])
        dims = [d for d in range(self.rank) if d != self.cd]
        return ctx.prim("broadcast_in_dim", v, shape=self.shape, broadcast_dims=dims)


# ops a pick along the class dim commutes with (elementwise: the op of the picked elements)
_PICK_THROUGH = ("prims.add", "prims.sub", "prims.convert_element_type")


def _producer(ctx: DecompContext, v: Value) -> Node | None:
    for n in reversed(ctx.b.nodes):
        if v in n.results:
            return n
    return None


def _picked(ctx: DecompContext, lay: _Layout, v: Value, depth: int = 0) -> Value:
    """v[..target..] along the class dim (v of the input's shape), the pick pushed through the
    add/sub/convert ops that made v down to the one operand of v's shape (a row value
    broadcast along the class dim is its own pick): see the module docstring."""
    n = _producer(ctx, v)
    if n is not None and n.op in _PICK_THROUGH and depth < 16:
        # numbers and row values as they are; one operand of the input's shape picked in turn
        # (with two, each would need a pick of its own: the op's result is picked instead)
        args: list[Any] = [a if not isinstance(a, Value) else _row_of(ctx, lay, a)
                           for a in n.args]
        full = [i for i, a in enumerate(args) if a is None]
        if len(full) == 1 and list(ctx.shape(n.args[full[0]])) == lay.shape:
            inner = n.args[full[0]]
            assert isinstance(inner, Value)
            args[full[0]] = _picked(ctx, lay, inner, depth + 1)
            return ctx.b.op(n.op, args, dict(n.kwargs))
    return lay.pick(ctx, v)


def _row_of(ctx: DecompContext, lay: _Layout, v: Value) -> Value | None:
    """The per-row value (target-shaped) that v broadcasts along the class dim, if it is one."""
    n = _producer(ctx, v)
    if n is None or n.op != "prims.broadcast_in_dim" or not isinstance(n.args[0], Value):
        return None
    src = n.args[0]
    dims = [d for d in range(lay.rank) if d != lay.cd]
    if n.kwargs.get("broadcast_dims") != dims or list(ctx.shape(src)) != lay.tshape:
        return None
    return src


def _all(ctx: DecompContext, v: Value) -> Value:
    return ctx.prim("sum", v, dims=list(range(ctx.rank(v)))) if ctx.rank(v) else v


def _nll_forward(ctx: DecompContext, self: Value, target: Value, weight: Value | None,
                 reduction: int, ignore_index: int) -> tuple[Value, Value]:
    lay = _Layout(ctx, self, target, weight, reduction, ignore_index)
    out = ctx.out_dtype()
    comp = opmath(out)
    x = ctx.convert(self, comp)
    picked = _picked(ctx, lay, x)
    if weight is not None:
        w = lay.pick(ctx, lay.along_classes(ctx, ctx.convert(weight, comp)))
        loss = ctx.prim("neg", ctx.prim("mul", picked, w))
        wsum = ctx.prim("where", lay.valid, w, 0.0)
    else:
        loss = ctx.prim("neg", picked)
        wsum = ctx.convert(lay.valid, comp)
    # where, not a multiply by the mask: an ignored element's NaN/inf input is never read
    loss = ctx.prim("where", lay.valid, loss, 0.0)
    tw_dtype = ctx.out_dtype(1)
    if reduction == 0 and lay.rank >= 2:
        return (ctx.convert(loss, out),
                ctx.full([], 0.0, tw_dtype, ctx.device(self)))
    total = _all(ctx, wsum)
    if reduction == 0:
        result = loss
    elif reduction == 2:
        result = _all(ctx, loss)
    else:
        result = ctx.prim("div", _all(ctx, loss), total)
    return ctx.convert(result, out), ctx.convert(total, tw_dtype)


@register_decomposition("aten.nll_loss_forward.default")
def nll_loss_forward(ctx: DecompContext, self: Value, target: Value, weight: Value | None,
                     reduction: int, ignore_index: int) -> tuple[Value, Value]:
    if ctx.rank(self) > 2:
        raise DecompositionError(f"{ctx.node.op}: input tensor should be 1D or 2D, got "
                                 f"{ctx.rank(self)}D")
    return _nll_forward(ctx, self, target, weight, reduction, ignore_index)


@register_decomposition("aten.nll_loss2d_forward.default")
def nll_loss2d_forward(ctx: DecompContext, self: Value, target: Value, weight: Value | None,
                       reduction: int, ignore_index: int) -> tuple[Value, Value]:
    return _nll_forward(ctx, self, target, weight, reduction, ignore_index)


def _nll_backward(ctx: DecompContext, grad_output: Value, self: Value, target: Value,
                  weight: Value | None, reduction: int, ignore_index: int,
                  total_weight: Value) -> Value:
    lay = _Layout(ctx, self, target, weight, reduction, ignore_index)
    out = ctx.out_dtype()
    comp = opmath(out)
    g = ctx.convert(grad_output, comp)
    if ctx.rank(g) and (reduction != 0 or lay.rank < 2):
        g = ctx.prim("reshape", g, shape=[])  # a one-element gradient of a reduced loss
    if reduction == 1:
        g = ctx.prim("div", g, ctx.convert(total_weight, comp))
    val = ctx.prim("neg", lay.over_input(ctx, g))
    if weight is not None:
        val = ctx.prim("mul", val, lay.along_classes(ctx, ctx.convert(weight, comp)))
    # the class each element's gradient lands on; -1 (no class) where the target is ignored
    hit_class = lay.over_input(ctx, ctx.prim("where", lay.valid, lay.target, -1))
    classes = ctx.prim("iota", length=lay.shape[lay.cd], start=0, step=1, dtype=DType.i64,
                       device=ctx.device(self))
    hit = ctx.prim("eq", lay.along_classes(ctx, classes), hit_class)
    return ctx.convert(ctx.prim("where", hit, val, 0.0), out)


@register_decomposition("aten.nll_loss_backward.default")
def nll_loss_backward(ctx: DecompContext, grad_output: Value, self: Value, target: Value,
                      weight: Value | None, reduction: int, ignore_index: int,
                      total_weight: Value) -> Value:
    return _nll_backward(ctx, grad_output, self, target, weight, reduction, ignore_index,
                         total_weight)


@register_decomposition("aten.nll_loss2d_backward.default")
def nll_loss2d_backward(ctx: DecompContext, grad_output: Value, self: Value, target: Value,
                        weight: Value | None, reduction: int, ignore_index: int,
                        total_weight: Value) -> Value:
    return _nll_backward(ctx, grad_output, self, target, weight, reduction, ignore_index,
                         total_weight)

