"""`decode-gemv` (CUDA, before lower-loops): a one-row product against a weight as a Triton GEMV.

A batch-1 decode step's linears are [1, K] x [K, N] products against a weight stored [N, K]
(`permute(W, [1, 0])`): matrix-vector products that stream the weight once. torch's matmul runs
them through cuBLAS. This pass rewrites such a `prims.matmul` (one row, the second operand a
transposed [N, K] tensor, f16/bf16) into `loop.gemv(x, W)`, an extern running `gemv`: a Triton
kernel of one program per BLOCK_N rows of W, each reading its rows in BLOCK_K chunks along K
(contiguous, coalesced) and the vector once per chunk, accumulating in f32 and rounding once
(as cuBLAS does). On the H200 with cold weights it is 0-16% faster than cuBLAS on the dolly
decode step's five shapes (`MEASURED`). Its launch goes through Triton's Python dispatch (tens
of us of host time, where cuBLAS's is a few): `compile()` adds the pass only under CUDA graphs
(mode="reduce-overhead" / "max-autotune", `with_decode_gemv`), where launches cost no host time.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ember.inductor.targets.cuda.decode_rope import LOWERINGS as ROPE_LOWERINGS
from ember.inductor.targets.cuda.decode_rope import fold_rope, swap_node
from ember.inductor.targets.cuda.gemv_blocks import MEASURED, config
from ember.inductor.targets.cuda.gemv_group import LOWERINGS as GROUP_LOWERINGS
from ember.inductor.targets.cuda.gemv_group import group_gemvs
from ember.ir import DType, Graph, Module, Node, TensorType, Value
from ember.ir.graph import Arg, fresh_name, value_names
from ember.ir.passes import register_pass
from ember.ir.registry import OpTypeError, default_registry, register_op
from ember.ir.types import Type

OP = "loop.gemv"
# decode-gemv's default for `group` (gemv_group.py): on the H200 a GPT-NeoX layer's GEMVs as
# two launches with their epilogues took 24.2 + 19.0 us against 29.5 + 23.7 for four GEMVs and
# the epilogue kernel (benchmarks/results/2026-12-02-h200-decode-gemv-group.md)
GROUP = True
# decode-gemv's default for `rope` (decode_rope.py: GPT-NeoX's rotary of q and the new key row
# in the decode attention kernel): off until measured on the device
ROPE = False
LOWP = (DType.bf16, DType.f16)


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(x_ptr, w_ptr, y_ptr, N, sx, sw, K: tl.constexpr,  # type: ignore[no-untyped-def]
                    BN: tl.constexpr, BK: tl.constexpr):
        n = tl.program_id(0) * BN + tl.arange(0, BN)
        nm = n < N
        acc = tl.zeros([BN], tl.float32)
        for k0 in range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            km = k < K
            w = tl.load(w_ptr + n[:, None] * sw + k[None, :], mask=nm[:, None] & km[None, :],
                        other=0.0)
            x = tl.load(x_ptr + k * sx, mask=km, other=0.0)
            acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
        tl.store(y_ptr + n, acc.to(y_ptr.dtype.element_ty), mask=nm)

    return gemv_kernel


def gemv(x: torch.Tensor, w: torch.Tensor, *, triton: bool | None = None) -> torch.Tensor:
    """x [1, K] @ w.T for w [N, K] (rows contiguous): [1, N] in x's dtype."""
    N, K = w.shape
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != K:
        raise ValueError(f"gemv: x must be [1, {K}] for a [{N}, {K}] weight, got "
                         f"{list(x.shape)}")
    use = triton if triton is not None else (x.is_cuda or
                                             os.environ.get("TRITON_INTERPRET") == "1")
    if not use or w.stride(1) != 1:
        return torch.mm(x, w.t())
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    bn, bk, warps = config(N, K)
    _kernel()[(-(-N // bn),)](x, w, y, N, x.stride(1), w.stride(0), K=K, BN=bn, BK=bk,
                              num_warps=warps)
    return y


def _infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    if len(args) != 2 or not all(isinstance(a, Value) and isinstance(a.type, TensorType)
                                 for a in args):
        raise OpTypeError(f"{OP}: takes (x [1, K], w [N, K]) tensors")
    x, w = (a.type for a in args)  # type: ignore[union-attr]
    assert isinstance(x, TensorType) and isinstance(w, TensorType)
    if x.rank != 2 or w.rank != 2 or x.shape[0] != 1 or x.shape[1] != w.shape[1] \
            or x.dtype != w.dtype:
        raise OpTypeError(f"{OP}: x must be [1, K] and w [N, K] of one dtype, got {x}, {w}")
    return [TensorType(x.dtype, (1, w.shape[0]), None, x.device)]


def _run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    return gemv(args[0], args[1])


if default_registry().lookup(OP) is None:
    register_op(OP, "x [1, K] @ w.T for a weight w [N, K]: a Triton GEMV (gemv.py; emitted "
                "by decode-gemv)", _infer, _run, aliasing="fresh")


def _outer(n: Node, taken: set[str]) -> list[Node] | None:
    """An f32 product over a contraction of length 1 ([.., M, 1] x [.., 1, N], transformers'
    rotary `inv_freq @ position_ids`) as the exact broadcast multiply it is, which fuses into
    its reader (cuBLAS ran it as a GEMM launch of its own); None if n is not one."""
    x, b = n.args
    if not isinstance(x, Value) or not isinstance(b, Value):
        return None
    xt, bt, rt = x.type, b.type, n.results[0].type
    if not (isinstance(xt, TensorType) and isinstance(bt, TensorType)
            and isinstance(rt, TensorType)) or xt.rank != bt.rank or xt.rank < 2 \
            or xt.shape[-1] != 1 or bt.shape[-2] != 1 or xt.dtype != DType.f32 \
            or bt.dtype != DType.f32 or xt.shape[:-2] != bt.shape[:-2]:
        return None
    shape = list(rt.shape)
    dims = list(range(rt.rank))
    out: list[Node] = []
    wide = []
    for v in (x, b):
        w = Value(fresh_name(f"{v.name}.outer", taken, ""), dataclasses.replace(rt, strides=None))
        out.append(Node("prims.broadcast_in_dim", [v], {"shape": list(shape),
                                                         "broadcast_dims": list(dims)},
                        [w], n.loc))
        w.node = out[-1]
        wide.append(w)
    out.append(Node("prims.mul", list(wide), {}, list(n.results), n.loc))
    for r in n.results:
        r.node = out[-1]
    return out


def _rewrite(g: Graph, explain: bool, group: bool = True) -> int:
    done = 0
    taken = value_names(g)
    nodes: list[Node] = []
    for n in g.nodes:
        outer = _outer(n, taken) if n.op == "prims.matmul" and len(n.args) == 2 else None
        if outer is not None:
            nodes += outer
            done += 1
            if explain:
                print(f"decode-gemv: @{g.name} %{n.results[0].name}: a contraction of 1, a "
                      f"broadcast multiply", file=sys.stderr)
            continue
        nodes.append(n)
    g.nodes = nodes
    for i, n in enumerate(g.nodes):
        if n.op != "prims.matmul" or len(n.args) != 2:
            continue
        x, b = n.args
        if not isinstance(x, Value) or not isinstance(b, Value) or b.node is None:
            continue
        xt, bt = x.type, b.type
        if not isinstance(xt, TensorType) or not isinstance(bt, TensorType) \
                or xt.rank != 2 or xt.shape[0] != 1 or xt.dtype not in LOWP:
            continue
        p = b.node
        if p.op != "prims.permute" or p.kwargs.get("dims") != [1, 0] \
                or not isinstance(p.args[0], Value):
            if explain:
                print(f"decode-gemv: @{g.name} %{n.results[0].name}: kept (the weight is not "
                      f"a transposed [N, K] tensor)", file=sys.stderr)
            continue
        w = p.args[0]
        swap_node(g, i, OP, [x, w], {})
        done += 1
        if explain:
            print(f"decode-gemv: @{g.name} %{n.results[0].name}: Triton GEMV "
                  f"{list(xt.shape)} x {list(bt.shape)}", file=sys.stderr)
    if group and done:
        group_gemvs(g, explain)
    return done


@register_pass("decode-gemv", "CUDA: a one-row f16/bf16 product against a transposed [N, K] "
               "weight becomes a Triton GEMV extern (loop.gemv; with group=true "
               "loop.gemv_group: its bias and erf-GELU epilogues absorbed, two independent "
               "GEMVs to a launch; with rope=true transformers' rotary of q and the new key "
               "row in the decode attention kernel, loop.decode_attention_rope), an f32 "
               "product over a contraction of 1 a broadcast multiply; explain=true says "
               "which")
def decode_gemv(module: Module, *, explain: bool = False, group: bool = GROUP,
                rope: bool = ROPE) -> Module:
    from ember.ir.passes.utils import live_values
    out = module.clone()
    reg = default_registry()
    for g in out.graphs.values():
        if (_rewrite(g, explain, group) and group) | (rope and fold_rope(g, explain) > 0):
            # the epilogues' absorbed nodes (the bias's f32 convert) would still be lowered
            # as kernels writing what nothing reads: no dce runs before lower-loops
            live = live_values(g, reg, out)
            g.nodes = [n for n in g.nodes if any(r in live for r in n.results)]
    return out


def with_decode_gemv(pipeline: str) -> str:
    """`pipeline` with decode-gemv before lower-loops, where it is a Triton pipeline (the CUDA
    target's) without it; else unchanged."""
    from ember.ir.passes import expand_pipeline
    stages = re.split(r",(?![^{]*})", expand_pipeline(pipeline))
    if "decode-gemv" in stages or "lower-loops" not in stages or not any(
            st.startswith("codegen-triton") for st in stages):
        return pipeline
    stages.insert(stages.index("lower-loops"), "decode-gemv")
    return ",".join(stages)


def lower_gemv(lw: Any, n: Node) -> None:
    """An extern on strided views of x and the weight (no copies)."""
    lw.passthrough(n, n.op)


LOWERINGS = {OP: lower_gemv, **GROUP_LOWERINGS, **ROPE_LOWERINGS}

__all__ = ["LOWERINGS", "MEASURED", "OP", "config", "decode_gemv", "gemv", "lower_gemv",
           "with_decode_gemv"]
