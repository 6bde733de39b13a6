"""Which inputs a CPU pointwise kernel may overwrite with its outputs (`kernels.call`'s
`inplace=`).

A bias + activation after a GEMM (`gelu(x @ w.T + b)`) reads the product once, at the element
it writes, and the product dies there. Written into new memory, every call allocated a
buffer of the product's size whose first touches were page faults (1.6 MB per layer on
CLIP's MLP) and whose writes went to cold lines; TorchInductor writes such kernels in place.
`inplace_inputs` finds, per output, a body input of the output's dtype and element count
that the kernel loads only at that output's own element (the same row-major offset, outside
any fused reduction); `codegen-cpp` declares that input and output without `__restrict__`
(they may be one array) and records `inplace=[k, ...]` on the call (per output: the operand
index, -1 for none). `plan-buffers` then hands the output the operand's storage where the
operand is a buffer of the graph's own that dies at this call.

Each element is loaded before the store of the same element in the same iteration (a vector
iteration loads its lanes before storing them), and no other element reads it, so the
kernel's result is the same whether or not the two share storage.
"""

from __future__ import annotations

import math

import sympy

from ember.inductor.indexing import flat_offset, ivar, parse_index
from ember.ir import Graph, Node, TensorType, Value
from ember.ir.expr import as_sympy


def _static(shape: object) -> list[int] | None:
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
        return None
    return [int(d) for d in shape]


def inplace_inputs(node: Node, body: Graph) -> list[int]:
    """Per result of the loop node: the index of an operand (after the body reference) the
    kernel reads only at that result's own element, with its dtype and element count; -1
    where there is none. Only pointwise kernels without fused reductions, static sizes."""
    none = [-1] * len(node.results)
    ranges = _static(node.kwargs.get("ranges"))
    if node.op != "loop.pointwise" or ranges is None \
            or any(n.op == "loop.reduce" for n in body.nodes):
        return none
    here = sympy.expand(as_sympy(flat_offset([ivar(k) for k in range(len(ranges))], ranges)))
    ok: list[int] = []
    for k, p in enumerate(body.params):
        t = p.type
        shape = _static(t.shape) if isinstance(t, TensorType) else None
        loads = [n for n in body.nodes if n.op == "loop.load" and n.args and n.args[0] is p]
        if shape is None or math.prod(shape) != math.prod(ranges) or not loads \
                or any(_uses(n, p) for n in body.nodes if n.op != "loop.load"):
            continue
        if all(_reads_at(n, shape, here) for n in loads):
            ok.append(k)
    out = list(none)
    for j, r in enumerate(node.results):
        rt = r.type
        if not isinstance(rt, TensorType):
            continue
        for k in ok:
            pt = body.params[k].type
            if k not in out and isinstance(pt, TensorType) and pt.dtype == rt.dtype:
                out[j] = k
                break
    return out


def _reads_at(load: Node, shape: list[int], here: sympy.Expr) -> bool:
    """The load reads the element at flat offset `here`. Its index is a list of expressions,
    or of strings where the graph came from ir-v1.0 text (parse_index reads both)."""
    index = load.kwargs.get("index")
    if not isinstance(index, list):
        return False
    dims = [parse_index(i) for i in index]
    return bool(sympy.expand(as_sympy(flat_offset(dims, shape))) == here)


def _uses(n: Node, p: Value) -> bool:
    return any(a is p for a in n.args)


__all__ = ["inplace_inputs"]
