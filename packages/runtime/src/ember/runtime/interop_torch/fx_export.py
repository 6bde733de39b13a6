"""ember IR -> torch.fx: one captured aten graph as an FX GraphModule that torch's tools accept.

`to_fx(module)` gives a GraphModule with a placeholder per graph parameter, one `call_function`
node per IR node (its torch `OpOverload`, arguments converted by the operator's schema exactly as
ember's interpreter converts them), `operator.getitem` nodes where an op has several results,
and an output node returning every graph result as a tuple. Nothing is re-traced: the FX graph
is the IR graph, node for node, so a layer's A/B test against torch compares the same program.

`input_updates` are not FX's business: the exported graph returns the updated values as plain
results and whoever runs it writes them back (ember's runtime, or the `torch-inductor` IR
backend for `ember run`).
"""

from __future__ import annotations

import operator
import re
from typing import Any

import sympy
import torch
from torch import fx

from ember.ir import Module, Ref, Value
from ember.ir.graph import Arg, Node
from ember.ir.torch_ops import convert_args, resolve


class ExportError(Exception):
    """The graph has something FX cannot express as torch operator calls."""


def _ident(name: str) -> str:
    """A Python identifier for an IR value name (FX names its placeholders after them)."""
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else f"v_{s}"


def to_fx(module: Module, graph: str | None = None) -> fx.GraphModule:
    """The graph `graph` (default: the module's first) of `module` as an FX GraphModule."""
    g = module.graph(graph)
    fg = fx.Graph()
    env: dict[Value, fx.Node] = {}
    for p in g.params:
        env[p] = fg.placeholder(_ident(p.name))

    def bind(a: Arg, node: Node) -> Any:
        if isinstance(a, Value):
            return env[a]
        if isinstance(a, list):
            return [bind(x, node) for x in a]
        if isinstance(a, Ref):
            raise ExportError(f"{node.op}: a reference to @{a.name} has no FX form")
        if isinstance(a, sympy.Expr):
            if a.is_Integer:
                return int(a)
            if a.is_Number:
                return float(a)
            raise ExportError(f"{node.op}: the symbolic size {a} is not exported yet (ember "
                              f"specializes shapes; this graph was built with symbols)")
        return a

    for n in g.nodes:
        op = resolve(n.op)
        if op is None:
            raise ExportError(f"{n.op} is not a torch operator (only aten-level graphs export; "
                              f"this one may have been lowered already)")
        args, kwargs = convert_args(op, [bind(a, n) for a in n.args],
                                    {k: bind(v, n) for k, v in n.kwargs.items()})
        out = fg.call_function(op, tuple(args), kwargs)
        _bind_results(fg, n, op, out, env)
    fg.output(tuple(env[o] for o in g.outputs))
    gm = fx.GraphModule(torch.nn.Module(), fg, class_name=_ident(g.name))
    gm.graph.lint()
    return gm


def _bind_results(fg: fx.Graph, n: Node, op: torch._ops.OpOverload, out: fx.Node,
                  env: dict[Value, fx.Node]) -> None:
    """Map the IR node's flat results onto the op's return structure: a single return is the
    node itself; several are `out[k]`; a list return (`Tensor[]`, e.g. split) takes whatever
    results the fixed returns leave, `out[k][j]`."""
    returns = op._schema.returns
    if not n.results:
        return
    lists = [k for k, r in enumerate(returns) if isinstance(r.real_type, torch.ListType)]
    if len(lists) > 1:
        raise ExportError(f"{n.op}: an op with {len(lists)} list results has no unambiguous "
                          f"flat form")
    single = len(returns) == 1
    i = 0
    for k, r in enumerate(returns):
        item = out if single else fg.call_function(operator.getitem, (out, k))
        if k in lists:
            count = len(n.results) - (len(returns) - 1)
            for j in range(count):
                env[n.results[i]] = fg.call_function(operator.getitem, (item, j))
                i += 1
        else:
            if i >= len(n.results):
                raise ExportError(f"{n.op}: the node has {len(n.results)} results, the schema "
                                  f"returns {len(returns)} ({r})")
            env[n.results[i]] = item
            i += 1
    if i != len(n.results):
        raise ExportError(f"{n.op}: the node has {len(n.results)} results, the schema returns "
                          f"{len(returns)}")
