"""The Triton matmul template with a fused pointwise epilogue (the CUDA target, max-autotune).

By default a matmul is an extern (torch's matmul: cuBLAS on the GPU) and the pointwise kernel
after it (bias, activation, residual add, ...) a separate Triton kernel that reads the product
back from memory. Here the two become one kernel: tiles of BLOCK_M x BLOCK_N outputs,
accumulated in f32 over BLOCK_K steps of K (`tl.dot`; f32 inputs in IEEE precision, as eager's
default matmul, no TF32), programs ordered in groups of GROUP_M row tiles (the "group-M
swizzle": neighbouring programs share A's rows and B's columns in L2), every load masked (any
M, N, K), and the epilogue's body rendered on the accumulator before the only store.

The pair is recognised on the loop IR (`epilogue_pairs`): a `loop.pointwise` whose body reads
the result of a 2-d `loop.extern(op="prims.matmul")` in its own order (`[i0, i1]`, or a
reshape: `[i0 * T + i1, i2]` after a [B, T, K] linear), that result
read by nothing else and not a graph output, no fused reduction in the body, static sizes. The
epilogue is whatever `fuse` put into that kernel, so bias, activation and residual adds need no
pattern of their own (the CPU target's epilogue.py matches per-channel affine chains after
convolutions only; nothing there describes a matmul's reader). Under max-autotune (autotune.py)
the pair is timed both ways and the template kept only where it wins: the pointwise node then
carries `cuda_matmul=[BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages]` and `cuda_warps` (they
dump, can be edited, and replay), and codegen-triton renders the two nodes as this kernel.
A template block launches through Triton's JIT (its strides are arguments of every call; it
has no bind(): launcher.py's fast path is for the loop kernels' ABI).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from ember.inductor.indexing import flat_offset, parse_index
from ember.inductor.sanitize import kernel_symbol, safe_text, short
from ember.inductor.targets.cuda.render import (
    INT32_LIMIT,
    CodegenError,
    Rendered,
    _Writer,
    prelude,
    tl_dtype,
)
from ember.ir import DType, Graph, Node, Ref, TensorType, Value

ATTR = "cuda_matmul"  # [BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages]
DTYPES = (DType.f32, DType.f16, DType.bf16)


@dataclass
class Pair:
    """A matmul extern and the pointwise kernel that is its epilogue."""

    mm: Node  # loop.extern(op="prims.matmul")
    epilogue: Node  # loop.pointwise reading mm's result at its own index
    position: int  # which of the epilogue's buffers (0-based, after the body) is the product


def _static(t: Any) -> bool:
    return isinstance(t, TensorType) and all(isinstance(d, int) for d in t.shape)


def epilogue_pairs(g: Graph, items: Mapping[str, Any]) -> list[Pair]:
    """The graph's (matmul extern, epilogue kernel) pairs the template can fuse."""
    readers: dict[Value, list[Node]] = {}
    for n in g.nodes:
        for v in n.operands():
            readers.setdefault(v, []).append(n)
    outputs = set(g.outputs)
    pairs: list[Pair] = []
    for n in g.nodes:
        if n.op != "loop.extern" or n.kwargs.get("op") != "prims.matmul" or len(n.args) != 2:
            continue
        v = n.results[0]
        a, b = n.args
        if not (isinstance(a, Value) and isinstance(b, Value) and _static(a.type)
                and _static(b.type) and _static(v.type)):
            continue
        at, bt, vt = a.type, b.type, v.type
        assert isinstance(at, TensorType) and isinstance(bt, TensorType) \
            and isinstance(vt, TensorType)
        if at.rank != 2 or bt.rank != 2 or vt.dtype not in DTYPES \
                or at.dtype != vt.dtype or bt.dtype != vt.dtype:
            continue
        rs = readers.get(v, [])
        if v in outputs or len(rs) != 1 or rs[0].op != "loop.pointwise":
            continue
        p = rs[0]
        bufs = p.args[1:]
        ranges = p.kwargs.get("ranges")
        m_, n_ = (int(d) for d in vt.shape)
        if sum(x is v for x in bufs) != 1 or len(p.results) != 1 \
                or not isinstance(ranges, list) or len(ranges) < 2 \
                or not all(isinstance(d, int) for d in ranges) or ranges[-1] != n_ \
                or math.prod(ranges[:-1]) != m_:
            continue
        ref = p.args[0]
        body = items.get(ref.name) if isinstance(ref, Ref) else None
        if not isinstance(body, Graph):
            continue
        pos = next(k for k, x in enumerate(bufs) if x is v)
        if _identity_reads(body, body.params[pos], ranges, [m_, n_]):
            pairs.append(Pair(n, p, pos))
    return pairs


def _identity_reads(body: Graph, param: Value, ranges: list[int], shape: list[int]) -> bool:
    """Whether the body reads `param` (of `shape`) only in the loop's own order (flat offset
    = the loop variables' row-major offset over `ranges`: [i0, i1], or a reshape such as
    [i0 * T + i1, i2] of a [B, T, N] epilogue), and holds no fused reduction (a row's values
    are not one tile's)."""
    own = sum(sympy.Symbol(f"i{k}") * math.prod(ranges[k + 1:]) for k in range(len(ranges)))
    for n in body.nodes:
        if n.op == "loop.reduce":
            return False
        if param in n.operands():
            if n.op != "loop.load":
                return False
            index = [parse_index(s) for s in n.kwargs["index"]]  # type: ignore[union-attr]
            got = flat_offset(index, shape)
            flat = sympy.Integer(got) if isinstance(got, int) else got
            # over plain symbols (parse_index's carry assumptions)
            flat = flat.subs({x: sympy.Symbol(str(x)) for x in flat.free_symbols})
            if sympy.expand(flat - own) != 0:
                return False
    return True


def read_config(node: Node) -> tuple[int, int, int, int, int] | None:
    """The node's cuda_matmul attribute, checked (None: not a template node)."""
    from ember.inductor.schedule import ScheduleError
    v = node.kwargs.get(ATTR)
    if v is None:
        return None
    xs = [x for x in v if isinstance(x, int) and not isinstance(x, bool)] \
        if isinstance(v, list) else []
    ok = len(xs) == 5 == len(v)  # type: ignore[arg-type]
    if ok:
        bm, bn, bk, gm, st = xs
        ok = all(16 <= x <= 256 and x & (x - 1) == 0 for x in (bm, bn, bk)) \
            and 1 <= gm <= 64 and 1 <= st <= 8
    if not ok:
        raise ScheduleError(f"{node.op}: {ATTR}={v!r} is not valid ([BLOCK_M, BLOCK_N, BLOCK_K, "
                            f"GROUP_M, num_stages]: blocks powers of two in 16..256, GROUP_M "
                            f"1..64, num_stages 1..8)")
    return (bm, bn, bk, gm, st)


class _EpilogueWriter(_Writer):
    """render.py's body writer, the product's loads replaced by the accumulator."""

    product: Value | None = None

    def rhs(self, n: Node, env: dict[Value, str], pre: str, mask: str, shape: str) -> str:
        if n.op == "loop.load" and n.args[0] is self.product:
            return "mm"
        return super().rhs(n, env, pre, mask, shape)


def render_matmul(name: str, pair: Pair, items: Mapping[str, Any], interpret: bool = False,
                  config: Sequence[int] | None = None, warps: int | None = None) -> Rendered:
    """The Triton module of the fused kernel: launch(a, b, epilogue buffers..., out)."""
    p, mm = pair.epilogue, pair.mm
    ref = p.args[0]
    assert isinstance(ref, Ref)
    body = items[ref.name]
    assert isinstance(body, Graph)
    a, b = mm.args
    assert isinstance(a, Value) and isinstance(b, Value)
    at, bt, vt, ot = a.type, b.type, mm.results[0].type, p.results[0].type
    assert isinstance(at, TensorType) and isinstance(bt, TensorType) \
        and isinstance(vt, TensorType) and isinstance(ot, TensorType)
    m, k = (int(d) for d in at.shape)
    n = int(bt.shape[1])
    if max(m * k, k * n, m * n) >= INT32_LIMIT:
        raise CodegenError("a matmul of 2**31 or more elements per operand (int32 tiles)")
    if any(not isinstance(d, int) for d in ot.shape):
        raise CodegenError("a matmul epilogue over symbolic sizes")
    bm, bn, bk, gm, stages = tuple(config) if config is not None else (
        read_config(p) or default_config(m, n, k))
    w0 = p.kwargs.get("cuda_warps")
    warps = warps or (w0 if isinstance(w0, int) else 4)
    w = _EpilogueWriter(name, dict(items), interpret=interpret)
    w.product = body.params[pair.position]
    others = [x for j, x in enumerate(p.args[1:]) if j != pair.position]
    ins = ["in0", "in1", *[f"in{2 + j}" for j in range(len(others))]]
    body_bufs = list(ins[2:])
    body_bufs.insert(pair.position, "in_mm")  # the product: never loaded (the accumulator)
    sym = kernel_symbol(name)
    dot_dt = vt.dtype
    prec = ", input_precision='ieee'" if dot_dt == DType.f32 else ""
    w.emit(0, f"def {sym}({', '.join([*ins, 'out0'])}, sam, sak, sbk, sbn, "
              f"BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, "
              f"GROUP_M: tl.constexpr):")
    for line in (
        "pid = tl.program_id(0)",
        f"grid_m = ({m} + BLOCK_M - 1) // BLOCK_M",
        f"grid_n = ({n} + BLOCK_N - 1) // BLOCK_N",
        "width = GROUP_M * grid_n  # programs of one group of GROUP_M row tiles",
        "first_m = (pid // width) * GROUP_M",
        "size_m = tl.minimum(grid_m - first_m, GROUP_M)",
        "pid_m = first_m + (pid % width) % size_m",
        "pid_n = (pid % width) // size_m",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)",
        f"for k0 in range(0, {k}, BLOCK_K):",
        "    rk = k0 + tl.arange(0, BLOCK_K)",
        f"    ta = tl.load(in0 + rm[:, None] * sam + rk[None, :] * sak, "
        f"mask=(rm[:, None] < {m}) & (rk[None, :] < {k}), other=0)",
        f"    tb = tl.load(in1 + rk[:, None] * sbk + rn[None, :] * sbn, "
        f"mask=(rk[:, None] < {k}) & (rn[None, :] < {n}), other=0)",
        f"    acc += tl.dot(ta, tb{prec})",
        *_row_vars(p),
        f"cmask = (rm[:, None] < {m}) & (rn[None, :] < {n})",
        # the product rounded to its dtype, as the extern's result is, then computed in f32
        f"mm = acc.to({tl_dtype(dot_dt)}).to(tl.float32)" if dot_dt != DType.f32 else "mm = acc",
    ):
        w.emit(1, line)
    vals = w.body(1, body, body_bufs, "cmask", "[BLOCK_M, BLOCK_N]")
    w.emit(1, f"tl.store(out0 + rm[:, None] * {n} + rn[None, :], "
              f"{vals[0]}.to({tl_dtype(ot.dtype)}), mask=cmask)")
    grid = f"(({m} + {bm} - 1) // {bm}) * (({n} + {bn} - 1) // {bn})"
    sched = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": gm, "num_stages": stages,
             "num_warps": warps}
    args = ", ".join([*ins, "out0"])
    launch = ["", "", f"SCHEDULE = {sched!r}", "", "", f"def launch({args}):",
              f"    {sym}[({grid},)]({args}, in0.stride(0), in0.stride(1), in1.stride(0), "
              f"in1.stride(1), BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, GROUP_M={gm}, "
              f"num_warps={warps}, num_stages={stages})", ""]
    if m * n == 0:
        launch[-2] = "    return None  # no elements"
    head = [f"# ember triton matmul template {safe_text('@' + short(name))}: "
            f"[{m}, {k}] x [{k}, {n}] with the epilogue {safe_text('@' + short(ref.name))}",
            prelude(interpret), "", "@triton.jit"]
    return Rendered("\n".join([*head, *w.lines, *launch]), sched, [])


def _row_vars(p: Node) -> list[str]:
    """The epilogue's loop variables over the tile: the leading ones from the row (a [B, T, N]
    epilogue's i0, i1 from rm = i0 * T + i1), the last one the column."""
    got = p.kwargs["ranges"]
    ranges = [int(d) for d in got if isinstance(d, int)] if isinstance(got, list) else []
    lead = ranges[:-1]
    out = []
    for k, d in enumerate(lead):
        stride = math.prod(lead[k + 1:])
        e = "rm[:, None]" if stride == 1 else f"(rm[:, None] // {stride})"
        out.append(f"i{k} = {e}" if k == 0 else f"i{k} = {e} % {d}")
    out.append(f"i{len(lead)} = rn[None, :]")
    return out


def default_config(m: int, n: int, k: int) -> tuple[int, int, int, int, int]:
    return (_clip(64, m), _clip(64, n), _clip(32, k), 8, 3)


def _clip(block: int, dim: int) -> int:
    """The block no larger than needed for `dim` (tl.dot needs 16 at least)."""
    want = 16
    while want < dim and want < block:
        want *= 2
    return want


def candidates(m: int, n: int, k: int, interpret: bool) -> list[tuple[tuple[int, ...], int]]:
    """(cuda_matmul, num_warps) candidates: a few tile shapes (TorchInductor's mm configs'
    spirit, clipped to the problem and deduplicated); the interpreter gets two (its timings
    test the choice logic only)."""
    table = [((64, 64, 32, 8, 3), 4), ((128, 64, 32, 8, 4), 4), ((64, 128, 32, 8, 4), 4),
             ((128, 128, 32, 8, 3), 8), ((32, 32, 32, 8, 2), 4), ((128, 128, 64, 8, 3), 8)]
    if interpret:
        table = [((16, 16, 16, 8, 1), 1), ((32, 32, 16, 8, 1), 2)]
    out: list[tuple[tuple[int, ...], int]] = []
    for (bm, bn, bk, gm, st), w in table:
        c = ((_clip(bm, m), _clip(bn, n), _clip(bk, k), gm, st), w)
        if c not in out:
            out.append(c)
    return out


def fused_externs(g: Graph) -> dict[Node, Node]:
    """Template epilogue node -> its matmul extern (nodes with cuda_matmul set; codegen)."""
    defs = {r: n for n in g.nodes for r in n.results}
    out: dict[Node, Node] = {}
    for n in g.nodes:
        if n.op == "loop.pointwise" and ATTR in n.kwargs:
            for x in n.args[1:]:
                d = defs.get(x) if isinstance(x, Value) else None
                if d is not None and d.op == "loop.extern" and d.kwargs.get("op") == "prims.matmul":
                    out[n] = d
                    break
    return out


__all__ = ["ATTR", "Pair", "candidates", "default_config", "epilogue_pairs", "fused_externs",
           "read_config", "render_matmul"]
