"""The stop-gradient marker: where `detach` (and capture's `no_grad` regions) cut gradients.

`aten.detach` decomposes to its operand (values are immutable, so a prims graph has no use for
it), which would let a joint graph built after decomposition differentiate through it. The
training path therefore decomposes with `training_table(table)`, in which `aten.detach` (what
capture records for `.detach()` and for values computed under `torch.no_grad()`) becomes
`graph.stop_gradient(%x)`: the identity, which the joint graph never differentiates through.
The marker lives only between decomposition and the split: `strip_stop_gradients` replaces it by
its operand in @forward/@backward, so no backend ever sees it. (It is in the builtin `graph`
dialect, not a prim: decompose keeps it as it keeps `graph.call`, and the prims set stays closed.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ember.autograd.vjp import VJPError
from ember.ir import DType, Graph, InferContext, OpTypeError, TensorType, Value
from ember.ir.graph import Arg, map_args
from ember.ir.registry import default_registry, register_op
from ember.ir.types import Type
from ember.prims.decomp import norms
from ember.prims.decomp.context import DecompContext
from ember.prims.decomp.pointwise import opmath
from ember.prims.decomp.table import DECOMPOSITIONS, DecompositionTable

STOP_GRADIENT = "graph.stop_gradient"
DETACH_OPS = ("aten.detach.default", "aten.detach_copy.default")


def _infer(ctx: InferContext, args: Sequence[Arg], kwargs: Mapping[str, Arg]) -> list[Type]:
    if len(args) != 1 or kwargs or not isinstance(args[0], Value):
        raise OpTypeError(f"{STOP_GRADIENT} takes one value")
    return [args[0].type]


def _run(interp: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    return x.detach() if hasattr(x, "detach") else x


if default_registry().lookup(STOP_GRADIENT) is None:
    register_op(STOP_GRADIENT, "the identity, through which no gradient flows (detach; "
                "ember.autograd's training path only)", _infer, _run,
                aliasing="alias")  # its result is a detached view of its operand


def _stop(ctx: DecompContext, self: Value) -> Value:
    return ctx.b.op(STOP_GRADIENT, [self])


def _embedding(inner: Any) -> Any:
    """aten.embedding whose padding row gets no gradient (eager's padding_idx): the weight's
    padding row is read through the marker; its value is unchanged."""

    def embedding(ctx: DecompContext, weight: Value, indices: Value, padding_idx: Any = -1,
                  scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
        if scale_grad_by_freq:
            raise VJPError("no VJP rule for aten.embedding with scale_grad_by_freq=True")
        t = weight.type
        if isinstance(padding_idx, int) and padding_idx >= 0 and isinstance(t, TensorType) \
                and t.rank == 2:
            rows = ctx.prim("iota", length=t.shape[0], start=0, step=1, dtype=DType.i64,
                            device=t.device)
            is_pad = ctx.prim("broadcast_in_dim", ctx.prim("eq", rows, padding_idx),
                              shape=list(t.shape), broadcast_dims=[0])
            weight = ctx.prim("where", is_pad, _stop(ctx, weight), weight)
        return inner(ctx, weight, indices, padding_idx, scale_grad_by_freq, sparse)

    return embedding


def _softmax(log: bool) -> Any:
    """aten._softmax / aten._log_softmax whose row max is read through the marker: the result
    does not depend on the shift, so its gradient through the max is zero in exact arithmetic;
    differentiated, it would cost the backward a tie count and two more row sums (eager's
    softmax backward has none of them)."""

    def decomposition(ctx: DecompContext, self: Value, dim: int, half_to_float: bool) -> Value:
        out = ctx.out_dtype()
        return ctx.convert(norms.softmax(ctx, ctx.convert(self, opmath(out)), dim, log,
                                         shift=_stop), out)

    return decomposition


SOFTMAX_OPS = {"aten._softmax.default": False, "aten._log_softmax.default": True}


def training_table(table: DecompositionTable) -> DecompositionTable:
    """`table` with detach decomposing to the stop-gradient marker (and embedding's padding
    row reading the weight through it, softmax's row max too)."""
    out = table.copy(f"{table.name or 'unnamed'}+stop_gradient")
    for op in DETACH_OPS:
        if op in out:
            out.replace(op, _stop)
        else:
            out.register(op)(_stop)
    emb = out.get("aten.embedding.default")
    if emb is not None:
        out.replace("aten.embedding.default", _embedding(emb))
    for op, log in SOFTMAX_OPS.items():
        # only over ember's own decomposition: a table that replaced it keeps its own
        if out.get(op) is DECOMPOSITIONS.get(op):
            out.replace(op, _softmax(log))
    # batch norm's statistics read through the marker: its closed-form gradient (norms.py)
    for op, fn in norms.training_batch_norms(_stop).items():
        if out.get(op) is DECOMPOSITIONS.get(op):
            out.replace(op, fn)
    return out


def strip_stop_gradients(graph: Graph) -> Graph:
    """`graph` with every marker replaced by its operand (in place; returned for chaining)."""
    sub: dict[Value, Value] = {}
    keep = []
    for n in graph.nodes:
        if n.op == STOP_GRADIENT:
            x = n.args[0]
            assert isinstance(x, Value)
            sub[n.results[0]] = sub.get(x, x)
            continue
        if sub:
            n.args = [map_args(a, lambda v: sub.get(v, v)) for a in n.args]
            n.kwargs = {k: map_args(a, lambda v: sub.get(v, v)) for k, a in n.kwargs.items()}
        keep.append(n)
    graph.nodes = keep
    graph.outputs = [sub.get(v, v) for v in graph.outputs]
    return graph
