"""`matmul-lowp` (CUDA): a linear's product in its operands' bf16/f16, not in f32.

The decompositions of addmm and linear compute `beta * self + alpha * (a @ b)` in f32 for
f16/bf16 operands and round once, as eager's fused cuBLAS epilogue does (prims/decomp/linalg.py):

    %1 = prims.convert_element_type(%x, dtype=f32)      # bf16 -> f32: a copy kernel
    %2 = prims.convert_element_type(%wt, dtype=f32)     # the weight too, every call
    %3 = prims.matmul(%1, %2) : f32[..]                 # f32 GEMM: no bf16 tensor cores
    %4 = prims.add(%3, %bias32) ; %5 = convert(%4, dtype=bf16)

On the GPU that is two copy kernels per linear and a GEMM at a fraction of the bf16 rate. This
pass (before lower-loops) rewrites such a product into the low-precision GEMM (it accumulates in
f32 and rounds its result once) read back as f32:

    %3.lowp = prims.matmul(%x, %wt) : bf16[..]   ;   %3 = convert(%3.lowp, dtype=f32)

where every operand of the matmul is an upcast of one f16/bf16 dtype to f32 (through views:
reshape, permute, broadcast, squeeze, unsqueeze), and the product only reaches a rounding back to
that dtype through views, adds, subtracts and multiplies (the addmm/linear epilogue): the product
is rounded once more before the bias add, as TorchInductor's mm + pointwise epilogue does (at
most one more rounding of the dtype). A rounding straight back (`convert(%3, dtype=bf16)`, no
epilogue: a weight's gradient in training) reads the GEMM's result itself, exactly: no copy
kernel, and no second buffer of the product alive beside it. A product that flows on in f32 (attention's scores into a
softmax) keeps its f32 GEMM: rounding scores to bf16 would change the softmax by percents.
`matmul-lowp{explain=true}` prints why each f32 matmul was kept (stderr).
"""

from __future__ import annotations

import dataclasses
import sys

from ember.ir import DType, Graph, Module, Node, TensorType, Value
from ember.ir.graph import fresh_name, value_names
from ember.ir.passes import register_pass
from ember.ir.passes.utils import replace_uses

LOWP = (DType.bf16, DType.f16)
VIEWS = ("prims.reshape", "prims.permute", "prims.broadcast_in_dim", "prims.squeeze",
         "prims.unsqueeze")
EPILOGUE = ("prims.add", "prims.sub", "prims.mul")
CONVERT = "prims.convert_element_type"
MAX_DEPTH = 8  # epilogue nodes followed from a product before giving up


def _tt(v: Value) -> TensorType | None:
    return v.type if isinstance(v.type, TensorType) else None


def _upcast_source(v: Value) -> tuple[Value, list[Node]] | None:
    """(x, views) where v is views[-1](...views[0](convert(x -> f32))) with x f16/bf16."""
    views: list[Node] = []
    while v.node is not None and v.node.op in VIEWS:
        views.append(v.node)
        a = v.node.args[0]
        if not isinstance(a, Value):
            return None
        v = a
    n = v.node
    if n is None or n.op != CONVERT or not isinstance(n.args[0], Value):
        return None
    src, out = _tt(n.args[0]), _tt(v)
    if src is None or out is None or src.dtype not in LOWP or out.dtype != DType.f32:
        return None
    return n.args[0], views[::-1]


def _rounds_back(v: Value, dt: DType, users: dict[Value, list[Node]], outputs: set[Value],
                 depth: int = 0) -> str | None:
    """None if every use of v ends in a rounding to dt through the linear epilogue's ops, else
    the use that does not."""
    if v in outputs:
        return f"%{v.name} is a graph output in f32"
    if depth > MAX_DEPTH:
        return "the epilogue is longer than the matmul-lowp pass follows"
    for u in users.get(v, []):
        if u.op == CONVERT:
            if u.kwargs.get("dtype") != dt:
                return f"%{v.name} is converted to {u.kwargs.get('dtype')}, not {dt.name}"
            continue
        if u.op not in VIEWS + EPILOGUE:
            return f"%{v.name} is read by {u.op} in f32"
        why = _rounds_back(u.results[0], dt, users, outputs, depth + 1)
        if why is not None:
            return why
    return None


def _rewrite(g: Graph, explain: bool) -> int:
    users: dict[Value, list[Node]] = {}
    for n in g.nodes:
        for v in set(n.operands()):
            users.setdefault(v, []).append(n)
    outputs = set(g.outputs)
    taken = value_names(g)
    same: dict[Value, Value] = {}  # roundings of a product back to its GEMM's dtype
    done = 0
    new_nodes: list[Node] = []
    for n in g.nodes:
        res = n.results[0] if n.results else None
        rt = _tt(res) if res is not None else None
        if n.op != "prims.matmul" or res is None or rt is None or rt.dtype != DType.f32:
            new_nodes.append(n)
            continue
        srcs = [_upcast_source(a) if isinstance(a, Value) else None for a in n.args]
        dts = {_tt(s[0]).dtype for s in srcs if s is not None}  # type: ignore[union-attr]
        # every operand an upcast: an f32 operand rounded to bf16 would round attention's
        # probabilities, and its q/k/v upcasts then split off the kernel that makes them (one
        # more kernel per layer, which costs more than the f32 P @ V at these sizes)
        why = "an operand is not an upcast of f16/bf16" if None in srcs else \
            "its operands are upcasts of different dtypes" if len(dts) != 1 else None
        if why is None:
            dt = dts.pop()
            why = _rounds_back(res, dt, users, outputs)
        if why is not None:
            if explain:
                print(f"matmul-lowp: @{g.name} %{res.name} kept in f32: {why}", file=sys.stderr)
            new_nodes.append(n)
            continue
        args: list[Value] = []
        for src in srcs:
            assert src is not None
            x, views = src
            for vn in views:  # the same views, on the f16/bf16 value
                old = vn.results[0]
                t = _tt(old)
                assert t is not None
                nv = Value(fresh_name(f"{old.name}.lowp", taken, ""), dataclasses.replace(t, dtype=dt))
                node = Node(vn.op, [x, *vn.args[1:]], dict(vn.kwargs), [nv], vn.loc, vn.pos)
                nv.node = node
                new_nodes.append(node)
                x = nv
            args.append(x)
        low = Value(fresh_name(f"{res.name}.lowp", taken, ""), dataclasses.replace(rt, dtype=dt))
        mm = Node("prims.matmul", list(args), dict(n.kwargs), [low], n.loc, n.pos)
        low.node = mm
        up = Node(CONVERT, [low], {"dtype": DType.f32}, [res], n.loc, n.pos)
        res.node = up
        new_nodes += [mm, up]
        # a rounding straight back (no epilogue: a weight's gradient) is the GEMM's own result:
        # bf16 -> f32 -> bf16 is exact, and a copy kernel would hold a second buffer of it
        for u in users.get(res, []):
            if u.op == CONVERT and u.kwargs.get("dtype") == dt:
                same[u.results[0]] = low
        done += 1
    g.nodes = new_nodes
    replace_uses(g, same)
    return done


@register_pass("matmul-lowp", "CUDA: a product of f16/bf16 operands upcast to f32 whose result "
               "is rounded back to that dtype by a linear's epilogue runs as the f16/bf16 GEMM "
               "(f32 accumulation), read back as f32; explain=true says why others stay f32")
def matmul_lowp(module: Module, *, explain: bool = False) -> Module:
    out = module.clone()
    for g in out.graphs.values():
        _rewrite(g, explain)
    return out


__all__ = ["matmul_lowp"]
