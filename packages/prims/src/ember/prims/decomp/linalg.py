"""Decompositions of the matmul family (mm, bmm, addmm, baddbmm, matmul, dot, mv, linear) and of
scaled dot-product attention (the math form and the device forms capture records).

Every contraction is one `prims.matmul`: `[*B, M, K] x [*B, K, N]` with equal batch dims, so
batch dims are broadcast explicitly first. A plain product runs in its operands' dtype (the
prim accumulates as eager's kernels do: f16/bf16 in f32, rounded once). Where eager fuses a
product with an epilogue (addmm, baddbmm: `beta * self + alpha * (a @ b)` in one f32 pass for
f16/bf16), the decomposition computes in the opmath dtype and rounds once at the end, as
torch's own decomposition of addmm does.

Attention computes in f32 for f16/bf16 inputs (eager's math form and its CPU flash kernel do),
with a softmax that gives zeros for rows whose every score is -inf (`_safe_softmax`, and the
fused kernels): `p = exp(s - m) / sum(exp(s - m))` with the row max `m` replaced by 0 on such
rows. `dropout_p > 0` is not decomposed: it needs ember's random numbers (native_dropout) and,
in the fused forms, the kernels' own RNG layout; the decompositions raise a clear error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ember.ir import DType, TensorType, Value
from ember.ir.expr import Dim, FloorDiv, as_sympy, simplify_dim
from ember.ir.verifier import dims_equal
from ember.prims.decomp.context import DecompContext, DecompositionError
from ember.prims.decomp.pointwise import opmath, scalar_as, scale
from ember.prims.decomp.table import register_decomposition
from ember.prims.rules import broadcast_shape

Shape = tuple[Dim, ...]


# ---- building blocks (conv.py and others may use them) -------------------------------------


def _same(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b, strict=True))


def _prod(dims: Sequence[Dim]) -> Dim:
    n: Any = 1
    for d in dims:
        n = n * d if isinstance(n, int) and isinstance(d, int) else as_sympy(n) * as_sympy(d)
    return n if isinstance(n, int) else simplify_dim(n)


def reshape(ctx: DecompContext, x: Value, shape: Sequence[Dim]) -> Value:
    return x if _same(ctx.shape(x), shape) else ctx.prim("reshape", x, shape=list(shape))


def expand(ctx: DecompContext, x: Value, shape: Sequence[Dim]) -> Value:
    """x broadcast (numpy rules: leading dims added, 1s stretched) to shape."""
    return ctx.broadcast_to(x, shape)


def transpose_last(ctx: DecompContext, x: Value) -> Value:
    """x with its last two dims swapped."""
    r = ctx.rank(x)
    return ctx.prim("permute", x, dims=[*range(r - 2), r - 1, r - 2])


def batched_matmul(ctx: DecompContext, a: Value, b: Value) -> Value:
    """`[*A, M, K] @ [*B, K, N]` with the batch dims A and B broadcast (ranks >= 2)."""
    sa, sb = ctx.shape(a), ctx.shape(b)
    batch = broadcast_shape(ctx.node.op, sa[:-2], sb[:-2])
    a = expand(ctx, a, (*batch, *sa[-2:]))
    b = expand(ctx, b, (*batch, *sb[-2:]))
    return ctx.prim("matmul", a, b)


def matmul_any(ctx: DecompContext, a: Value, b: Value) -> Value:
    """torch.matmul's semantics for operands of rank >= 1: a 1-D lhs is a row and a 1-D rhs a
    column (their dims dropped after), batch dims broadcast. A batched lhs times a matrix folds
    the batch into the rows (one 2-D product, as eager does)."""
    ra, rb = ctx.rank(a), ctx.rank(b)
    if ra == 0 or rb == 0:
        raise DecompositionError(f"{ctx.node.op}: both operands need at least one dim")
    if ra >= 3 and rb <= 2:
        sa = ctx.shape(a)
        rows = reshape(ctx, a, [_prod(sa[:-1]), sa[-1]])
        col = ctx.prim("unsqueeze", b, dims=[1]) if rb == 1 else b
        out = ctx.prim("matmul", rows, col)
        return reshape(ctx, out, [*sa[:-1]] + ([] if rb == 1 else [ctx.shape(b)[-1]]))
    x = ctx.prim("unsqueeze", a, dims=[0]) if ra == 1 else a
    y = ctx.prim("unsqueeze", b, dims=[1]) if rb == 1 else b
    out = batched_matmul(ctx, x, y)
    r = ctx.rank(out)
    drop = ([r - 2] if ra == 1 else []) + ([r - 1] if rb == 1 else [])
    return ctx.prim("squeeze", out, dims=drop) if drop else out


def _check_float_or_int(ctx: DecompContext, *xs: Value) -> DType:
    dts = {ctx.dtype(x) for x in xs}
    if len(dts) != 1:
        raise DecompositionError(f"{ctx.node.op}: operand dtypes differ "
                                 f"({sorted(d.name for d in dts)})")
    dt = dts.pop()
    if dt == DType.b8:
        raise DecompositionError(f"{ctx.node.op}: bool operands are not supported (as in eager)")
    return dt


# ---- the matmul family ----------------------------------------------------------------------


@register_decomposition("aten.mm.default", "aten.bmm.default")
def mm(ctx: DecompContext, self: Value, mat2: Value) -> Value:
    _check_float_or_int(ctx, self, mat2)
    return ctx.prim("matmul", self, mat2)


@register_decomposition("aten.dot.default")
def dot(ctx: DecompContext, self: Value, tensor: Value) -> Value:
    _check_float_or_int(ctx, self, tensor)
    out = ctx.prim("matmul", ctx.prim("unsqueeze", self, dims=[0]),
                   ctx.prim("unsqueeze", tensor, dims=[1]))
    return ctx.prim("squeeze", out, dims=[0, 1])


@register_decomposition("aten.mv.default")
def mv(ctx: DecompContext, self: Value, vec: Value) -> Value:
    _check_float_or_int(ctx, self, vec)
    out = ctx.prim("matmul", self, ctx.prim("unsqueeze", vec, dims=[1]))
    return ctx.prim("squeeze", out, dims=[1])


@register_decomposition("aten.matmul.default")
def matmul(ctx: DecompContext, self: Value, other: Value) -> Value:
    _check_float_or_int(ctx, self, other)
    return matmul_any(ctx, self, other)


def _beta_alpha(dt: DType, beta: Any, alpha: Any) -> tuple[Any, Any]:
    """Scalars as eager reads them for dt (integer tensors truncate them)."""
    return scalar_as(dt, beta), scalar_as(dt, alpha)


def _add_product(ctx: DecompContext, self: Value, a: Value, b: Value, beta: Any, alpha: Any, *,
                 skip_zero_alpha: bool) -> Value:
    """`beta * self + alpha * (a @ b)` in the opmath dtype, rounded once. beta == 0 ignores
    self (NaN and inf in it do not propagate), as eager documents. `skip_zero_alpha`: eager's
    f32/f64 addmm (BLAS gemm) does not compute the product when alpha == 0, so NaN and inf in
    the factors do not propagate either."""
    out = ctx.out_dtype()
    dt = _check_float_or_int(ctx, a, b)
    comp = opmath(dt)
    beta, alpha = _beta_alpha(dt, beta, alpha)
    shape = (*ctx.shape(a)[:-1], ctx.shape(b)[-1])
    if skip_zero_alpha and alpha == 0 and dt in (DType.f32, DType.f64):
        if beta == 0:
            return ctx.full(shape, 0, out, ctx.device(a))
        c = ctx.convert(expand(ctx, self, shape), comp)
        kept: Value = scale(ctx, c, beta)
        return ctx.convert(kept, out)
    prod: Value = scale(ctx, ctx.prim("matmul", ctx.convert(a, comp), ctx.convert(b, comp)),
                        alpha)
    if beta == 0:
        return ctx.convert(prod, out)
    c = ctx.convert(expand(ctx, self, shape), comp)
    return ctx.convert(ctx.prim("add", scale(ctx, c, beta), prod), out)


@register_decomposition("aten.addmm.default")
def addmm(ctx: DecompContext, self: Value, mat1: Value, mat2: Value, beta: Any = 1,
          alpha: Any = 1) -> Value:
    return _add_product(ctx, self, mat1, mat2, beta, alpha, skip_zero_alpha=True)


@register_decomposition("aten.baddbmm.default")
def baddbmm(ctx: DecompContext, self: Value, batch1: Value, batch2: Value, beta: Any = 1,
            alpha: Any = 1) -> Value:
    return _add_product(ctx, self, batch1, batch2, beta, alpha, skip_zero_alpha=False)


@register_decomposition("aten.linear.default")
def linear(ctx: DecompContext, input: Value, weight: Value, bias: Value | None = None
           ) -> Value:
    """`input @ weight.T + bias`; a composite op capture sees as t + addmm/matmul, decomposed
    here for hand-written graphs. f16/bf16 with a bias add in f32 and round once, as addmm."""
    dt = _check_float_or_int(ctx, input, weight)
    wt = ctx.prim("permute", weight, dims=[1, 0]) if ctx.rank(weight) == 2 else weight
    if bias is None:
        return matmul_any(ctx, input, wt)
    comp = opmath(dt)
    y = matmul_any(ctx, ctx.convert(input, comp), ctx.convert(wt, comp))
    b = ctx.convert(ctx.broadcast_to(bias, ctx.shape(y)), comp)
    return ctx.convert(ctx.prim("add", y, b), ctx.out_dtype())


# ---- attention --------------------------------------------------------------------------------


def _scale_of(ctx: DecompContext, q: Value, scale: float | None) -> Any:
    """The softmax scale: `scale`, or 1/sqrt(E) (a 0-dim tensor when E is symbolic)."""
    if scale is not None:
        return float(scale)
    e = ctx.shape(q)[-1]
    if isinstance(e, int):
        return 1.0 / math.sqrt(e) if e else math.inf
    return ctx.prim("rsqrt", ctx.full([], e, ctx.dtype(q), ctx.device(q)))


def _times(ctx: DecompContext, x: Value, factor: Any) -> Value:
    if ctx.is_tensor(factor):
        factor = ctx.broadcast_to(factor, ctx.shape(x))
    y: Value = scale(ctx, x, factor)
    return y


def _repeat_heads(ctx: DecompContext, x: Value, hq: Dim) -> Value:
    """`x.repeat_interleave(hq // hk, dim=-3)` (GQA: each of the hk key/value heads serves
    hq // hk query heads). Static head counts: a broadcast and a reshape; symbolic ones: a
    gather of head `h * hk // hq` (exact for any sizes, where the reshape's size is not)."""
    s = ctx.shape(x)
    h = ctx.rank(x) - 3
    hk = s[h]
    if dims_equal(hq, hk):
        return x
    if isinstance(hq, int) and isinstance(hk, int):
        if hk == 0 or hq % hk:
            raise DecompositionError(f"{ctx.node.op}: GQA needs query heads ({hq}) to be a "
                                     f"multiple of key/value heads ({hk})")
        groups = hq // hk
        wide = ctx.prim("broadcast_in_dim", x, shape=[*s[:h + 1], groups, *s[h + 1:]],
                        broadcast_dims=[*range(h + 1), *range(h + 2, len(s) + 1)])
        return reshape(ctx, wide, [*s[:h], hq, *s[h + 1:]])
    heads = ctx.prim("iota", length=hq, dtype=DType.i64, device=ctx.device(x))
    heads = ctx.prim("div", ctx.prim("mul", heads, hk), hq)
    out = [*s[:h], hq, *s[h + 1:]]
    index = ctx.prim("broadcast_in_dim", heads, shape=out, broadcast_dims=[h])
    return ctx.prim("gather", x, index, dim=h)


def causal_mask(ctx: DecompContext, L: Dim, S: Dim, device: str, *,
                bottom_right: bool = False) -> Value:
    """b8[L, S]: row i attends to columns j <= i (torch's top-left aligned tril), or with
    `bottom_right` to j <= i + S - L (the CUDA flash kernel's alignment)."""
    rows = ctx.prim("iota", length=L, dtype=DType.i64, device=device)
    if bottom_right and not dims_equal(L, S):
        rows = ctx.prim("add", rows, simplify_dim(as_sympy(S) - as_sympy(L)))
    cols = ctx.prim("iota", length=S, dtype=DType.i64, device=device)
    return ctx.prim("ge", ctx.prim("broadcast_in_dim", rows, shape=[L, S], broadcast_dims=[0]),
                    ctx.prim("broadcast_in_dim", cols, shape=[L, S], broadcast_dims=[1]))


def attention(ctx: DecompContext, query: Value, key: Value, value: Value,
              attn_mask: Value | None, dropout_p: float, is_causal: bool, scale: float | None,
              enable_gqa: bool = False, causal_bottom_right: bool = False
              ) -> tuple[Value, Value]:
    """softmax(q @ k^T * scale + mask) @ v over the last two dims, batch dims broadcast.
    Returns the output (in query's dtype) and the f32/f64 logsumexp of each row's masked
    scores (`-inf` on fully masked rows; the caller chooses what its kernel stores there)."""
    if dropout_p != 0:
        raise DecompositionError(
            f"{ctx.node.op}: dropout_p={dropout_p} is not decomposed (it needs random numbers; "
            f"capture in eval mode or with dropout_p=0)")
    if is_causal and attn_mask is not None:
        raise DecompositionError(f"{ctx.node.op}: attn_mask and is_causal=True together")
    out_dt = ctx.dtype(query)
    comp = opmath(out_dt)
    if enable_gqa and ctx.rank(query) >= 3:
        hq = ctx.shape(query)[-3]
        key, value = _repeat_heads(ctx, key, hq), _repeat_heads(ctx, value, hq)
    q, k, v = (ctx.convert(t, comp) for t in (query, key, value))
    s = _times(ctx, batched_matmul(ctx, q, transpose_last(ctx, k)), _scale_of(ctx, q, scale))
    shape = ctx.shape(s)
    L, S = shape[-2], shape[-1]
    if is_causal:
        allowed = ctx.broadcast_to(causal_mask(ctx, L, S, ctx.device(q),
                                               bottom_right=causal_bottom_right), shape)
        s = ctx.prim("where", allowed, s, -math.inf)
    elif attn_mask is not None:
        s, mask = ctx.broadcast(s, attn_mask)
        shape = ctx.shape(s)
        if ctx.dtype(mask) == DType.b8:
            s = ctx.prim("where", mask, s, -math.inf)
        else:
            s = ctx.prim("add", s, ctx.convert(mask, comp))
    rows = list(shape[:-1])
    last = len(shape) - 1
    if S == 0:  # nothing to attend to: zeros, as eager's math form
        lse = ctx.full(rows, -math.inf, comp, ctx.device(q))
        v_shape = ctx.shape(v)
        o = ctx.full([*rows, v_shape[-1]], 0, comp, ctx.device(q))
        return ctx.convert(o, out_dt), lse
    m = ctx.prim("amax", s, dims=[last])
    masked = ctx.prim("eq", m, -math.inf)
    m = ctx.prim("where", masked, 0.0, m)
    e = ctx.prim("exp", ctx.prim("sub", s, ctx.prim("broadcast_in_dim", m, shape=list(shape),
                                                   broadcast_dims=list(range(last)))))
    total = ctx.prim("sum", e, dims=[last])
    p = ctx.prim("div", e, ctx.prim("broadcast_in_dim", total, shape=list(shape),
                                    broadcast_dims=list(range(last))))
    p = ctx.prim("where", ctx.prim("broadcast_in_dim", masked, shape=list(shape),
                                   broadcast_dims=list(range(last))), 0.0, p)
    o = batched_matmul(ctx, p, v)
    lse = ctx.prim("add", m, ctx.prim("log", total))
    return ctx.convert(o, out_dt), lse


def _lse_masked_rows(ctx: DecompContext, lse: Value, value: float) -> Value:
    """lse with fully masked rows (-inf) replaced by `value`."""
    if value == -math.inf:
        return lse
    return ctx.prim("where", ctx.prim("eq", lse, -math.inf), value, lse)


def _as_result(ctx: DecompContext, x: Value, i: int) -> Value:
    """x converted to result i's declared dtype."""
    return ctx.convert(x, ctx.out_dtype(i))


@register_decomposition("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(ctx: DecompContext, query: Value, key: Value, value: Value,
                                 attn_mask: Value | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Value:
    """The composite op (capture sees its device form; hand-written graphs use it)."""
    return attention(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale,
                     enable_gqa)[0]


@register_decomposition("aten._scaled_dot_product_flash_attention_for_cpu.default")
def flash_attention_for_cpu(ctx: DecompContext, query: Value, key: Value, value: Value,
                            dropout_p: float = 0.0, is_causal: bool = False,
                            attn_mask: Value | None = None, scale: float | None = None
                            ) -> tuple[Value, Value]:
    """(output, logsumexp f32[B, H, L]); the CPU kernel stores 0 as the logsumexp of a fully
    masked row (and zeros as its output). Fewer key/value heads than query heads is GQA: the
    kernel groups them itself (sdpa's enable_gqa=True arrives so on CPU)."""
    gqa = ctx.rank(query) >= 3 and not dims_equal(ctx.shape(key)[-3], ctx.shape(query)[-3])
    out, lse = attention(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale,
                         enable_gqa=gqa)
    return out, _as_result(ctx, _lse_masked_rows(ctx, lse, 0.0), 1)


def _lse_rows_padded(ctx: DecompContext, lse: Value, width: Dim) -> Value:
    """lse [.., L] padded with +inf to `width` columns (the CUDA kernels' aligned layout)."""
    L = ctx.shape(lse)[-1]
    extra = simplify_dim(as_sympy(width) - as_sympy(L))
    if extra == 0:
        return lse
    config = [[0, 0, 0] for _ in ctx.shape(lse)]
    config[-1] = [0, extra, 0]
    return ctx.prim("pad", lse, math.inf, config=config)


@register_decomposition("aten._scaled_dot_product_efficient_attention.default")
def efficient_attention(ctx: DecompContext, query: Value, key: Value, value: Value,
                        attn_bias: Value | None, compute_log_sumexp: bool,
                        dropout_p: float = 0.0, is_causal: bool = False,
                        scale: float | None = None) -> tuple[Value, Value, Value, Value]:
    """The CUDA memory-efficient kernel's form: (output, logsumexp f32[B, H, ceil(L/32)*32]
    padded with +inf (or [B, H, 0] without compute_log_sumexp), philox seed, philox offset).
    A fully masked row has zeros and logsumexp 0. Without dropout the seed and offset are
    unused placeholders (0 here). Checked against the CUDA kernel on an H200 (torch 2.11)."""
    out, lse = attention(ctx, query, key, value, attn_bias, dropout_p, is_causal, scale)
    lse = _lse_masked_rows(ctx, lse, 0.0)  # the kernel stores 0 for a fully masked row
    want = ctx.out_types[1]
    assert isinstance(want, TensorType)
    if compute_log_sumexp:
        L = ctx.shape(query)[-2]
        width: Dim = (((L + 31) // 32) * 32 if isinstance(L, int)
                      else simplify_dim(FloorDiv(as_sympy(L) + 31, 32) * 32))
        lse_out = _as_result(ctx, _lse_rows_padded(ctx, lse, width), 1)
    else:
        lse_out = ctx.full([*ctx.shape(lse)[:-1], 0], 0, want.dtype, want.device)
    seed = ctx.full([], 0, ctx.out_dtype(2), ctx.device(query))
    offset = ctx.full([], 0, ctx.out_dtype(3), ctx.device(query))
    return out, lse_out, seed, offset


def _fused_rest(ctx: DecompContext, results: list[Any], query: Value, key: Value
                ) -> list[Any]:
    """The fused kernels' trailing results after output and logsumexp: tensors (rng state,
    philox seed/offset, debug mask) are placeholders without dropout, zeros here (the kernels
    leave them unset); scalars are max_q and max_k, the sequence lengths, given as literals
    (their uses take them; prims make no scalars). cum_seq_q/cum_seq_k are None for dense
    inputs, so the node has no results for them."""
    sizes = iter([ctx.shape(query)[-2], ctx.shape(key)[-2]])
    for t in ctx.out_types[len(results):]:
        if isinstance(t, TensorType):
            results.append(ctx.full(list(t.shape), 0, t.dtype, t.device))
        else:
            results.append(next(sizes))
    return results


@register_decomposition("aten._scaled_dot_product_flash_attention.default")
def flash_attention(ctx: DecompContext, query: Value, key: Value, value: Value,
                    dropout_p: float = 0.0, is_causal: bool = False,
                    return_debug_mask: bool = False, scale: float | None = None
                    ) -> list[Any]:
    """The CUDA flash kernel's form: (output, logsumexp f32[B, H, L], max_q, max_k, rng_state,
    unused, debug_attn_mask). is_causal aligns the mask bottom-right (row i sees keys
    j <= i + S - L; sdpa sends it square shapes only); a row that sees no key has zeros and
    logsumexp +inf. Checked against the CUDA kernel on an H200 (torch 2.11)."""
    if return_debug_mask:
        raise DecompositionError(f"{ctx.node.op}: return_debug_mask=True is not decomposed")
    out, lse = attention(ctx, query, key, value, None, dropout_p, is_causal, scale,
                         causal_bottom_right=True)
    lse = _lse_masked_rows(ctx, lse, math.inf)
    return _fused_rest(ctx, [out, _as_result(ctx, lse, 1)], query, key)


@register_decomposition("aten._scaled_dot_product_cudnn_attention.default")
def cudnn_attention(ctx: DecompContext, query: Value, key: Value, value: Value,
                    attn_bias: Value | None, compute_log_sumexp: bool, dropout_p: float = 0.0,
                    is_causal: bool = False, return_debug_mask: bool = False,
                    scale: float | None = None) -> list[Any]:
    """The cuDNN kernel's form (what sdpa picks for f16/bf16 on Hopper): (output, logsumexp
    f32[B, H, L, 1], max_q, max_k, philox seed, philox offset). is_causal aligns top-left; a
    fully masked row has zeros and logsumexp -inf. Checked against the CUDA kernel on an H200
    (torch 2.11)."""
    if return_debug_mask:
        raise DecompositionError(f"{ctx.node.op}: return_debug_mask=True is not decomposed")
    out, lse = attention(ctx, query, key, value, attn_bias, dropout_p, is_causal, scale)
    lse = ctx.prim("unsqueeze", lse, dims=[ctx.rank(lse)])  # -inf on fully masked rows
    return _fused_rest(ctx, [out, _as_result(ctx, lse, 1)], query, key)


@register_decomposition("aten._scaled_dot_product_flash_attention_for_cpu_backward.default")
def flash_attention_for_cpu_backward(ctx: DecompContext, grad_out: Value, query: Value,
                                     key: Value, value: Value, out: Value, logsumexp: Value,
                                     dropout_p: float, is_causal: bool,
                                     attn_mask: Value | None = None, scale: float | None = None
                                     ) -> tuple[Value, Value, Value]:
    """The CPU flash kernel's backward (the VJP rule of its forward emits it; the inductor on
    CPU keeps it as one extern): the probabilities recomputed from the saved logsumexp,
    `p = exp(s - lse)` (0 at masked scores and on fully masked rows, whose stored logsumexp is
    0), then `dv = p^T do`, `ds = p * (do v^T - rowsum(do * out))`, `dq = ds k * scale`,
    `dk = ds^T q * scale`, in f32 for f16/bf16; shared key/value heads (GQA) sum their
    groups' gradients."""
    if dropout_p != 0:
        raise DecompositionError(f"{ctx.node.op}: dropout_p={dropout_p} is not decomposed (its "
                                 f"forward's random numbers are the kernel's own)")
    if is_causal and attn_mask is not None:
        raise DecompositionError(f"{ctx.node.op}: attn_mask and is_causal=True together")
    comp = opmath(ctx.dtype(query))
    hq = ctx.shape(query)[-3] if ctx.rank(query) >= 3 else None
    hk = ctx.shape(key)[-3] if ctx.rank(key) >= 3 else None
    groups = 1
    if hq is not None and hk is not None and not dims_equal(hq, hk):
        if not (isinstance(hq, int) and isinstance(hk, int) and hk and hq % hk == 0):
            raise DecompositionError(f"{ctx.node.op}: GQA needs static query heads ({hq}) that "
                                     f"are a multiple of key/value heads ({hk})")
        groups = hq // hk
        key, value = _repeat_heads(ctx, key, hq), _repeat_heads(ctx, value, hq)
    q, k, v, do, o = (ctx.convert(t, comp) for t in (query, key, value, grad_out, out))
    factor = _scale_of(ctx, q, scale)
    s = _times(ctx, batched_matmul(ctx, q, transpose_last(ctx, k)), factor)
    shape = ctx.shape(s)
    if is_causal:
        allowed = ctx.broadcast_to(causal_mask(ctx, shape[-2], shape[-1], ctx.device(q)), shape)
        s = ctx.prim("where", allowed, s, -math.inf)
    elif attn_mask is not None:
        s, mask = ctx.broadcast(s, attn_mask)
        if not _same(ctx.shape(s), shape):
            raise DecompositionError(f"{ctx.node.op}: an attn_mask that broadcasts the scores "
                                     f"to a larger shape is not decomposed")
        if ctx.dtype(mask) == DType.b8:
            s = ctx.prim("where", mask, s, -math.inf)
        else:
            s = ctx.prim("add", s, ctx.convert(mask, comp))
    rows = list(range(len(shape) - 1))
    lse = ctx.prim("broadcast_in_dim", ctx.convert(logsumexp, comp), shape=list(shape),
                   broadcast_dims=rows)
    p = ctx.prim("exp", ctx.prim("sub", s, lse))
    dv = batched_matmul(ctx, transpose_last(ctx, p), do)
    dp = batched_matmul(ctx, do, transpose_last(ctx, v))
    d = ctx.prim("sum", ctx.prim("mul", do, o), dims=[len(shape) - 1])
    ds = ctx.prim("mul", p, ctx.prim("sub", dp, ctx.prim("broadcast_in_dim", d,
                                                           shape=list(shape),
                                                           broadcast_dims=rows)))
    dq = _times(ctx, batched_matmul(ctx, ds, k), factor)
    dk = _times(ctx, batched_matmul(ctx, transpose_last(ctx, ds), q), factor)
    if groups > 1:  # head h = kv head h // groups: sum each kv head's group
        dk, dv = (_sum_groups(ctx, g, groups) for g in (dk, dv))
    got = [dq, dk, dv]
    for g, x in zip(got, (query, key if groups == 1 else None, value if groups == 1 else None),
                    strict=True):
        if x is not None and not _same(ctx.shape(g), ctx.shape(x)):
            raise DecompositionError(f"{ctx.node.op}: query, key and value with broadcast "
                                     f"batch dims are not decomposed")
    return _as_result(ctx, dq, 0), _as_result(ctx, dk, 1), _as_result(ctx, dv, 2)


def _sum_groups(ctx: DecompContext, g: Value, groups: int) -> Value:
    """[*B, hk * groups, S, E] -> [*B, hk, S, E]: each kv head's queries' gradients summed
    (the inverse of `_repeat_heads`'s static form)."""
    s = ctx.shape(g)
    h = len(s) - 3
    hq = s[h]
    assert isinstance(hq, int)
    split = reshape(ctx, g, [*s[:h], hq // groups, groups, *s[h + 1:]])
    return ctx.prim("sum", split, dims=[h + 1])
