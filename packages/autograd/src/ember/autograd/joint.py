"""The joint forward+backward graph, its save-what-the-backward-reads split, and the `joint` pass.

`joint_graph(module, graph, inputs=, outputs=)` differentiates a prims graph with the VJP rules:

    graph @joint(%x.., %ct_y..) -> (y.., grad_x..)
        attrs(forward_outputs=K, tangents=[output indices], grad_inputs=[param indices], ...)

its parameters are the forward's, then one cotangent per output in `tangents`; its results
are the forward's K results, then the gradient of each parameter in `grad_inputs`, in order.
Cotangents of a value used several times are summed; an input no gradient reaches gets zeros
of its shape; integer and bool values carry no gradient; ops in NO_DERIVATIVE stop it (philox
seed and offset, comparisons, rounding). The forward graph's attrs (philox, input_updates) are
kept, their indices stay valid: parameters and results are only appended.

`split_joint(module, joint)` cuts it in two:

    graph @forward(%x..) -> (y.., saved..)              attrs(saved=S, ...)
    graph @backward(saved.., %ct_y..) -> (grad_x..)     attrs(saved=S, tangents=.., grad_inputs=..)

The forward is every node its results need (and every random draw); the backward is the rest
of what the gradients need, so cheap values the forward did not keep (a `cos` for `sin`'s
gradient, zeros) are recomputed there from saved ones, and `saved` is exactly the forward values
the backward reads. A size symbol the backward needs but cannot bind from its parameters' shapes
travels as a zero-element tensor `%size_<sym>: b8[<sym>, 0]` among the saved values (what
AOTAutograd saves as a SymInt). That is the `save-all` policy; `recompute-all` and `min-cut`
(partition.py) trade saving for recomputation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sympy

from ember.autograd.partition import (
    POLICIES,
    PartitionReport,
    backward_nodes,
    choose_keep,
    nbytes,
)
from ember.autograd.stop import STOP_GRADIENT
from ember.autograd.vjp import NO_DERIVATIVE, VJP_RULES, VJPContext, VJPError, is_float_tensor
from ember.ir import Builder, DType, Graph, Module, Node, TensorType, Value
from ember.ir.expr import free_symbol_names, symbol
from ember.ir.graph import iter_values, map_args
from ember.ir.passes import PipelineError, register_pass
from ember.ir.registry import OpRegistry
from ember.ir.verifier import dims_equal

# attrs the joint graph adds (removed again by the split)
JOINT_ATTRS = ("forward_outputs", "tangents", "grad_inputs")
RANDOM_OPS = frozenset({"prims.philox_uniform"})
# ops listed in NO_DERIVATIVE whose eager derivative is not zero: a gradient reaching one is an
# error (a zero would be a silently wrong gradient), so the runtime falls back honestly
MISSING_DERIVATIVE = frozenset({"prims.digamma"})


def _stops(op: str) -> bool:
    """Whether `op` stops gradients (no derivative, or the detach marker)."""
    return (op in NO_DERIVATIVE and op not in MISSING_DERIVATIVE) or op == STOP_GRADIENT


def _float_indices(values: Sequence[Value]) -> list[int]:
    return [i for i, v in enumerate(values) if is_float_tensor(v)]


def _select(what: str, values: Sequence[Value], chosen: Iterable[int | str] | None
            ) -> list[int]:
    """Indices of the chosen values (by index or parameter name); default every float tensor."""
    if chosen is None:
        return _float_indices(values)
    names = {v.name: i for i, v in enumerate(values)}
    out: list[int] = []
    for c in chosen:
        i = names.get(c) if isinstance(c, str) else c
        if isinstance(c, str) and c.lstrip("-").isdigit():
            i = int(c)
        if i is None or not -len(values) <= i < len(values):
            raise VJPError(f"no {what} {c!r} (there are {len(values)})")
        i %= len(values)
        if not is_float_tensor(values[i]):
            raise VJPError(f"{what} {c!r} is {values[i].type}: only floating tensors have "
                           f"gradients")
        if i not in out:
            out.append(i)
    return out


def _requires_grad(g: Graph, inputs: list[int]) -> set[Value]:
    rg = {g.params[i] for i in inputs}
    for n in g.nodes:
        if _stops(n.op) or not any(v in rg for v in n.operands()):
            continue
        rg.update(r for r in n.results if is_float_tensor(r))
    return rg


def requires_grad_values(g: Graph, inputs: list[int]) -> set[Value]:
    """The values of `g` that depend differentiably on the parameters `inputs` (what eager
    would give a grad_fn)."""
    return _requires_grad(g, inputs)


def _same_shape(a: TensorType, b: TensorType) -> bool:
    return a.rank == b.rank and all(dims_equal(x, y) for x, y in zip(a.shape, b.shape,
                                                                      strict=True))


def joint_graph(module: Module, graph: str | None = None, *,
                inputs: Iterable[int | str] | None = None,
                outputs: Iterable[int | str] | None = None, name: str = "joint") -> Graph:
    """The joint graph of `module`'s graph (not added to the module). `inputs`: the parameters
    that get gradients, `outputs`: the results that get cotangents (indices or names; default:
    every floating tensor)."""
    g = module.graph(graph).clone()
    want = _select("input", g.params, inputs)
    tangents = _select("output", g.outputs, outputs)
    rg = _requires_grad(g, want)
    b = Builder(module, taken=(v.name for v in g.values()))
    ctx = VJPContext(b, rg)
    ct_params = [Value(b.fresh(f"ct_{g.outputs[i].name}"), _plain(g.outputs[i].type))
                 for i in tangents]
    grads: dict[Value, Value] = {}

    def accumulate(v: Value, ct: Value, op: str) -> None:
        vt, ctt = v.type, ct.type
        assert isinstance(vt, TensorType)
        if not (isinstance(ctt, TensorType) and ctt.dtype == vt.dtype and _same_shape(vt, ctt)):
            raise VJPError(f"the VJP rule of {op} gave a cotangent {ctt} for %{v.name}: {vt}")
        grads[v] = b.op("prims.add", [grads[v], ct]) if v in grads else ct

    for i, ct in zip(tangents, ct_params, strict=True):
        if g.outputs[i] in rg:
            accumulate(g.outputs[i], ct, "the graph's return")
    for n in reversed(g.nodes):
        cts = [grads.get(r) for r in n.results]
        if all(c is None for c in cts) or _stops(n.op) \
                or not any(v in rg for v in n.operands()):
            continue
        rule = VJP_RULES.get(n.op)
        if rule is None:
            where = f" (line {n.pos.line})" if n.pos else ""
            why = f": {NO_DERIVATIVE[n.op]}" if n.op in NO_DERIVATIVE else \
                "; decompose the graph to prims first"
            raise VJPError(f"no VJP rule for {n.op}{where}{why}")
        b.loc = n.loc  # backward nodes point at the source of their forward op
        got = rule(ctx, n, cts)
        if len(got) != len(n.args):
            raise VJPError(f"the VJP rule of {n.op} gave {len(got)} cotangents for "
                           f"{len(n.args)} arguments")
        for arg, grad in zip(n.args, got, strict=True):
            pairs: list[tuple[Any, Any]] = list(zip(arg, grad, strict=True)) \
                if isinstance(arg, list) and isinstance(grad, list) else [(arg, grad)]
            for a, c in pairs:
                if isinstance(a, Value) and a in rg and isinstance(c, Value):
                    accumulate(a, c, n.op)
    b.loc = None
    results = []
    for i in want:
        p = g.params[i]
        results.append(grads[p] if p in grads else ctx.zeros(_plain(p.type)))
    attrs = dict(g.attrs)
    attrs.update(forward_outputs=len(g.outputs), tangents=list(tangents), grad_inputs=list(want))
    nodes = g.nodes + _live(b.nodes, results)
    outs = g.outputs + results
    return Graph(name, g.params + ct_params, [o.type for o in outs], nodes, outs, attrs)


def _plain(t: Any) -> TensorType:
    """A tensor type without a layout (cotangents and gradients have none)."""
    assert isinstance(t, TensorType)
    return TensorType(t.dtype, t.shape, None, t.device)


def _live(nodes: list[Node], roots: Iterable[Value]) -> list[Node]:
    """The nodes that `roots` need, in order."""
    need = set(roots)
    keep: list[Node] = []
    for n in reversed(nodes):
        if any(r in need for r in n.results):
            keep.append(n)
            need.update(n.operands())
    return keep[::-1]


def _int_list(v: Any) -> list[int]:
    return [int(x) for x in v] if isinstance(v, list) else []


def split_joint(module: Module, joint: Graph, policy: str = "save-all"
                ) -> tuple[Graph, Graph]:
    """`@forward` and `@backward` from a joint graph (see the module doc); `policy` is the
    partitioner's (partition.py)."""
    fwd, bwd, _ = partition_joint(module, joint, policy)
    return fwd, bwd


def partition_joint(module: Module, joint: Graph, policy: str = "save-all"
                    ) -> tuple[Graph, Graph, PartitionReport]:
    """`split_joint`, with the partitioner's report (what the forward saves)."""
    j = joint.clone()
    k = j.attrs.get("forward_outputs")
    tangents, grad_inputs = _int_list(j.attrs.get("tangents")), _int_list(j.attrs.get(
        "grad_inputs"))
    if not isinstance(k, int):
        raise VJPError(f"@{joint.name} is not a joint graph (no forward_outputs attribute)")
    n_fwd = len(j.params) - len(tangents)
    fwd_params, ct_params = j.params[:n_fwd], j.params[n_fwd:]
    fwd_outs, grad_outs = j.outputs[:k], j.outputs[k:]

    fwd_nodes = _live(j.nodes, fwd_outs + [r for n in j.nodes if n.op in RANDOM_OPS
                                          for r in n.results])
    in_fwd = set(fwd_params) | {r for n in fwd_nodes for r in n.results}
    fwd_ids = set(map(id, fwd_nodes))
    hints = module.hints()
    keep = choose_keep(policy, j, fwd_params, fwd_nodes, hints)
    bwd_nodes, copies = backward_nodes(j, grad_outs, keep, in_fwd, fwd_ids)
    produced = {r for n in bwd_nodes for r in n.results}
    saved: list[Value] = []
    for v in [*(x for n in bwd_nodes for x in n.operands()), *grad_outs]:
        if v in in_fwd and v not in produced and v not in saved:
            saved.append(v)

    # sizes the backward cannot bind from its parameters' shapes travel as empty tensors
    b = Builder(module, taken=(v.name for v in j.values()))
    carriers = []
    for s in sorted(_needed_symbols(bwd_nodes, grad_outs) - _bare_symbols(saved + ct_params)):
        carriers.append(b.op("prims.full", [], {"shape": [symbol(s), 0],
                                                "value": False, "dtype": DType.b8},
                             name=f"size_{s}"))
    fwd_nodes = fwd_nodes + b.nodes
    saved += carriers

    attrs = {a: v for a, v in j.attrs.items() if a not in JOINT_ATTRS}
    f_outs = fwd_outs + saved
    forward = Graph("forward", fwd_params, [o.type for o in f_outs], fwd_nodes, f_outs,
                    dict(attrs, saved=len(saved)))
    sub = {v: Value(v.name, v.type) for v in saved}
    for c in copies:  # a recomputed forward op defines its own values in the backward
        sub.update((r, Value(r.name, r.type)) for r in c.results)
        c.results = [sub[r] for r in c.results]
    for n in bwd_nodes:  # backward nodes belong to the clone `j` alone: remap them in place
        n.args = [map_args(a, lambda v: sub.get(v, v)) for a in n.args]
        n.kwargs = {key: map_args(a, lambda v: sub.get(v, v)) for key, a in n.kwargs.items()}
    b_outs = [sub.get(v, v) for v in grad_outs]
    backward = Graph("backward", [sub[v] for v in saved] + ct_params, [o.type for o in b_outs],
                     bwd_nodes, b_outs, {"saved": len(saved), "tangents": tangents,
                                         "grad_inputs": grad_inputs})
    inputs = set(fwd_params)
    report = PartitionReport(policy, len(saved), sum(nbytes(v, hints) for v in saved),
                             len(copies), sum(nbytes(v, hints) for v in saved
                                              if v not in inputs))
    return forward, backward, report


def _dims_of(args: Any) -> Iterable[Any]:
    if isinstance(args, list):
        for a in args:
            yield from _dims_of(a)
    elif isinstance(args, (int, sympy.Expr)) and not isinstance(args, bool):
        yield args


def _needed_symbols(nodes: list[Node], outs: list[Value]) -> set[str]:
    need: set[str] = set()
    for n in nodes:
        for r in n.results:
            if isinstance(r.type, TensorType):
                for d in r.type.shape:
                    need |= free_symbol_names(d)
        for a in list(n.kwargs.values()) + n.args:
            for d in _dims_of(a):
                need |= free_symbol_names(d)
    for v in [*outs, *(x for n in nodes for x in iter_values(n.args))]:
        if isinstance(v.type, TensorType):
            for d in v.type.shape:
                need |= free_symbol_names(d)
    return need


def _bare_symbols(values: list[Value]) -> set[str]:
    return {d.name for v in values if isinstance(v.type, TensorType)
            for d in v.type.shape if isinstance(d, sympy.Symbol)}


def build_joint(module: Module, graph: str | None = None, *,
                inputs: Iterable[int | str] | None = None,
                outputs: Iterable[int | str] | None = None, split: bool = True,
                partitioner: str = "save-all") -> Module:
    """A copy of `module` with the graph replaced by `@forward` and `@backward` (or, without
    `split`, by `@joint`); `partitioner` picks what the forward saves (partition.py)."""
    src = module.graph(graph)
    out = module.clone()
    joint = joint_graph(out, src.name, inputs=inputs, outputs=outputs)
    new = list(split_joint(out, joint, partitioner)) if split else [joint]
    clash = [gr.name for gr in new if gr.name in out.items and gr.name != src.name]
    if clash:
        raise VJPError(f"the module already has @{clash[0]}; rename it first")
    items = dict(out.items)
    out.items.clear()
    for key, item in items.items():
        if key == src.name:
            for gr in new:
                out.items[gr.name] = gr
        else:
            out.items[key] = item
    return out


def _option_list(text: str) -> list[int | str] | None:
    if not text:
        return None
    return [int(t) if t.lstrip("-").isdigit() else t for t in text.split(":") if t]


@register_pass("joint", "differentiate a prims graph: @forward (outputs + saved values) and "
               "@backward (saved values + cotangents -> input gradients); inputs=/outputs= "
               "pick parameters/results by index or name, separated by ':' (default: every "
               "floating tensor); split=false emits one @joint graph; partitioner=save-all|"
               "recompute-all|min-cut picks what @forward saves")
def joint_pass(module: Module, *, graph: str = "", inputs: str = "", outputs: str = "",
               split: bool = True, partitioner: str = "save-all",
               registry: OpRegistry) -> Module:
    if partitioner not in POLICIES:
        raise PipelineError(f"joint: unknown partitioner {partitioner!r}; choose one of "
                            f"{', '.join(POLICIES)}")
    return build_joint(module, graph or None, inputs=_option_list(inputs),
                       outputs=_option_list(outputs), split=split, partitioner=partitioner)
