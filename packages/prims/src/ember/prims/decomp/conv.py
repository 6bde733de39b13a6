"""Decompositions of convolution and pooling: aten.convolution (1-d/2-d/3-d, stride, padding,
dilation, groups, bias, transposed with output_padding), max_pool2d_with_indices, avg_pool2d
and adaptive average pooling.

Convolution is `prims.convolution` (cross-correlation, zero padding, groups, no bias) plus a
broadcast bias add. A transposed convolution is the gradient of one: the input dilated by the
stride (`prims.pad`'s interior padding), padded by `dilation * (k - 1) - padding` (plus
`output_padding` after; a negative amount crops), convolved at stride 1 with the weight's
in/out channels swapped per group and its spatial dims reversed. One difference from eager's
direct kernel: an inf or NaN in a transposed convolution's weight also meets the zeros of the
dilation and padding (0 * inf = NaN), where eager only multiplies it with input elements.

Pooling reads each window position as a strided slice of the padded input: kernel offset
`(i, j)` gives `x[.., i*d : .. : s, j*d : .. : s]`, one `[.., OH, OW]` slice per offset.
Max pooling stacks them on a last dim and reduces (`amax`, `argmax`), with eager's index rules:
the first maximum in window order, the last NaN if any, positions in the padding never chosen,
an index into the input's `H * W` plane. Average pooling sums the slices (in f32 for f16/bf16)
and divides by eager's divisor (`divisor_override`, or the window clipped to the padded input,
or, without `count_include_pad`, to the input). Spatial sizes must be static (window arithmetic
and ceil_mode decide on them); batch and channel dims may be symbolic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ember.ir import DType, Value
from ember.ir.expr import Dim, FloorDiv, as_sympy, simplify_dim
from ember.prims.decomp.context import DecompContext, DecompositionError
from ember.prims.decomp.linalg import reshape
from ember.prims.decomp.pointwise import opmath
from ember.prims.decomp.table import register_decomposition

# ---- convolution -----------------------------------------------------------------------------


def _per_dim(ctx: DecompContext, v: Sequence[int] | int, n: int, what: str) -> list[int]:
    """A conv/pool parameter with one entry per spatial dim (one value is repeated)."""
    vals = [v] if isinstance(v, int) else list(v)
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n:
        raise DecompositionError(f"{ctx.node.op}: {what} needs {n} entries, got {vals}")
    return vals


def _add_bias(ctx: DecompContext, y: Value, bias: Value | None) -> Value:
    """y + bias over the channel dim (1); f16/bf16 add in f32 and round once."""
    if bias is None:
        return y
    out = ctx.out_dtype()
    comp = opmath(out)
    b = ctx.prim("broadcast_in_dim", ctx.convert(bias, comp), shape=list(ctx.shape(y)),
                 broadcast_dims=[1])
    return ctx.convert(ctx.prim("add", ctx.convert(y, comp), b), out)


def _transposed_weight(ctx: DecompContext, w: Value, groups: int) -> Value:
    """[Cin, Cout/g, *k] -> [Cout, Cin/g, *k] (channels swapped within each group), spatial
    dims reversed."""
    s = ctx.shape(w)
    cin, cout_g, k = s[0], s[1], list(s[2:])
    n = len(k)
    if groups == 1:
        wt = ctx.prim("permute", w, dims=[1, 0, *range(2, 2 + n)])
    else:
        cin_g = cin // groups if isinstance(cin, int) else simplify_dim(
            FloorDiv(as_sympy(cin), groups))
        g = reshape(ctx, w, [groups, cin_g, cout_g, *k])
        g = ctx.prim("permute", g, dims=[0, 2, 1, *range(3, 3 + n)])
        cout = cout_g * groups if isinstance(cout_g, int) else simplify_dim(
            as_sympy(cout_g) * groups)
        wt = reshape(ctx, g, [cout, cin_g, *k])
    return ctx.prim("rev", wt, dims=list(range(2, 2 + n)))


@register_decomposition("aten.convolution.default")
def convolution(ctx: DecompContext, input: Value, weight: Value, bias: Value | None,
                stride: list[int], padding: list[int], dilation: list[int], transposed: bool,
                output_padding: list[int], groups: int) -> Value:
    n = ctx.rank(input) - 2
    if n < 1 or ctx.rank(weight) != n + 2:
        raise DecompositionError(f"{ctx.node.op}: input {ctx.ttype(input)} and weight "
                                 f"{ctx.ttype(weight)} need the same rank >= 3 (batched)")
    if ctx.dtype(input) != ctx.dtype(weight):
        raise DecompositionError(f"{ctx.node.op}: input and weight dtypes differ")
    st, pd, dl = (_per_dim(ctx, v, n, w) for v, w in ((stride, "stride"),
                                                      (padding, "padding"),
                                                      (dilation, "dilation")))
    if not transposed:
        y = ctx.prim("convolution", input, weight, stride=st, padding=pd, dilation=dl,
                     groups=groups)
        return _add_bias(ctx, y, bias)
    op = _per_dim(ctx, output_padding, n, "output_padding")
    ks = ctx.shape(weight)[2:]
    config: list[list[Any]] = [[0, 0, 0], [0, 0, 0]]
    for i in range(n):
        edge = simplify_dim(as_sympy(ks[i]) * dl[i] - dl[i] - pd[i])
        config.append([edge, simplify_dim(as_sympy(edge) + op[i]), st[i] - 1])
    x = input
    if any(c != [0, 0, 0] for c in config):
        x = ctx.prim("pad", input, 0, config=config)
    y = ctx.prim("convolution", x, _transposed_weight(ctx, weight, groups), stride=[1] * n,
                 padding=[0] * n, dilation=dl, groups=groups)
    return _add_bias(ctx, y, bias)


@register_decomposition("aten._convolution.default")
def convolution_(ctx: DecompContext, input: Value, weight: Value, bias: Value | None,
                 stride: list[int], padding: list[int], dilation: list[int], transposed: bool,
                 output_padding: list[int], groups: int, benchmark: bool, deterministic: bool,
                 cudnn_enabled: bool, allow_tf32: bool) -> Value:
    """The backend-selection form: the flags choose kernels, not results."""
    y: Value = convolution(ctx, input, weight, bias, stride, padding, dilation, transposed,
                           output_padding, groups)
    return y


@register_decomposition("aten.convolution_backward.default")
def convolution_backward(ctx: DecompContext, grad_output: Value, input: Value, weight: Value,
                         bias_sizes: list[int] | None, stride: list[int], padding: list[int],
                         dilation: list[int], transposed: bool, output_padding: list[int],
                         groups: int, output_mask: list[bool]) -> list[Value]:
    """Kept whole: torch's backward kernel as one extern call, what prims.convolution's VJP rule
    emits (ember.autograd.vjp.contraction: in prims the weight gradient is a convolution with an
    image-sized kernel, 2-5x slower than the kernel). Its results are the gradients output_mask
    asks for, in order (the others are not results)."""
    return ctx.b.emit(ctx.node.op, [grad_output, input, weight, bias_sizes, stride, padding,
                                    dilation, transposed, output_padding, groups, output_mask])


# ---- pooling windows -------------------------------------------------------------------------


def _static(ctx: DecompContext, d: Dim, what: str) -> int:
    if not isinstance(d, int):
        raise DecompositionError(f"{ctx.node.op}: the {what} size {d} must be static (pooling "
                                 f"windows are laid out at decomposition time)")
    return d


def pool_out(ctx: DecompContext, size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """eager's pooling_output_shape."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    if out < 0 or span < 0:
        raise DecompositionError(f"{ctx.node.op}: input size {size} too small for the window")
    return out


def _windows(ctx: DecompContext, x: Value, ks: Sequence[int], st: Sequence[int],
             pd: Sequence[int], dl: Sequence[int], outs: Sequence[int], fill: Any
             ) -> list[Value]:
    """One slice per kernel offset (row-major over the kernel): element [.., oh, ow] of slice
    (i, j) is the padded input at (oh*s + i*d, ow*s + j*d). Padding holds `fill`."""
    shape = ctx.shape(x)
    lead = len(shape) - 2
    config: list[list[Any]] = [[0, 0, 0] for _ in range(lead)]
    for a in range(2):
        need = (outs[a] - 1) * st[a] + dl[a] * (ks[a] - 1) + 1  # padded extent read
        config.append([pd[a], need - shape[lead + a] - pd[a], 0])
    padded = ctx.prim("pad", x, fill, config=config) if any(
        c != [0, 0, 0] for c in config) else x
    pshape = ctx.shape(padded)
    out: list[Value] = []
    for i in range(ks[0]):
        for j in range(ks[1]):
            start = [0] * lead + [i * dl[0], j * dl[1]]
            limit = list(pshape[:lead]) + [i * dl[0] + (outs[0] - 1) * st[0] + 1,
                                           j * dl[1] + (outs[1] - 1) * st[1] + 1]
            out.append(ctx.prim("slice", padded, start=start, limit=limit,
                                step=[1] * lead + list(st)))
    return out


def _iota(ctx: DecompContext, n: int, start: int, step: int, device: str) -> Value:
    return ctx.prim("iota", length=n, start=start, step=step, dtype=DType.i64, device=device)


def _grid(ctx: DecompContext, v: Value, shape: Sequence[int], dim: int) -> Value:
    return ctx.prim("broadcast_in_dim", v, shape=list(shape), broadcast_dims=[dim])


def _pool_params(ctx: DecompContext, self: Value, kernel_size: list[int], stride: list[int],
                 padding: list[int] | int, dilation: list[int] | int
                 ) -> tuple[list[int], list[int], list[int], list[int], tuple[int, int]]:
    if ctx.rank(self) not in (3, 4):
        raise DecompositionError(f"{ctx.node.op}: expected a 3-D or 4-D input")
    ks = _per_dim(ctx, kernel_size, 2, "kernel_size")
    st = _per_dim(ctx, stride, 2, "stride") if stride else ks
    pd = _per_dim(ctx, padding, 2, "padding")
    dl = _per_dim(ctx, dilation, 2, "dilation")
    h, w = (_static(ctx, d, "spatial") for d in ctx.shape(self)[-2:])
    return ks, st, pd, dl, (h, w)


# ---- max pooling -----------------------------------------------------------------------------


def _lowest(dt: DType) -> Any:
    if dt.is_floating:
        return -math.inf
    if dt == DType.b8:
        return False
    return int(torch.iinfo(dt.torch).min)


@register_decomposition("aten.max_pool2d_with_indices.default")
def max_pool2d_with_indices(ctx: DecompContext, self: Value, kernel_size: list[int],
                            stride: list[int] | None = None, padding: list[int] | int = 0,
                            dilation: list[int] | int = 1, ceil_mode: bool = False
                            ) -> tuple[Value, Value]:
    ks, st, pd, dl, (h, w) = _pool_params(ctx, self, kernel_size, stride or [], padding,
                                          dilation)
    outs = [pool_out(ctx, n, k, s, p, d, ceil_mode)
            for n, k, s, p, d in zip((h, w), ks, st, pd, dl, strict=True)]
    dt = ctx.dtype(self)
    dev = ctx.device(self)
    lead = list(ctx.shape(self)[:-2])
    kk = ks[0] * ks[1]
    wins = _windows(ctx, self, ks, st, pd, dl, outs, _lowest(dt))
    grid = [*lead, *outs]
    r = len(grid)
    stack = ctx.prim("concatenate", [ctx.prim("unsqueeze", v, dims=[r]) for v in wins], dim=r)
    full = [*grid, kk]
    values = ctx.prim("amax", stack, dims=[r])
    # which offsets lie inside the input: rows oh*s - p + i*d in [0, h), columns likewise
    base_h = _iota(ctx, outs[0], -pd[0], st[0], dev)
    base_w = _iota(ctx, outs[1], -pd[1], st[1], dev)
    offs = _iota(ctx, kk, 0, 1, dev)
    off_h = ctx.prim("mul", ctx.prim("div", offs, ks[1]), dl[0])
    off_w = ctx.prim("mul", ctx.prim("remainder", offs, ks[1]), dl[1])
    table = [outs[0], outs[1], kk]
    ih = ctx.prim("add", _grid(ctx, base_h, table, 0), _grid(ctx, off_h, table, 2))
    iw = ctx.prim("add", _grid(ctx, base_w, table, 1), _grid(ctx, off_w, table, 2))
    past_start = ctx.prim("bitwise_and", ctx.prim("ge", ih, 0), ctx.prim("ge", iw, 0))
    inside = ctx.prim("bitwise_and", past_start,
                      ctx.prim("bitwise_and", ctx.prim("lt", ih, h), ctx.prim("lt", iw, w)))
    inside, past_start = (ctx.prim("broadcast_in_dim", t, shape=full,
                                   broadcast_dims=[r - 2, r - 1, r])
                          for t in (inside, past_start))
    at_max = ctx.prim("eq", stack, ctx.prim("broadcast_in_dim", values, shape=full,
                                             broadcast_dims=list(range(r))))
    hit = ctx.prim("bitwise_and", at_max, inside)
    # the first maximum inside the input; a window of padding only (dilation lets one skip the
    # input) keeps eager's starting index: the first offset past the leading padding
    key = ctx.prim("add", ctx.prim("mul", ctx.convert(hit, DType.i32), 2),
                   ctx.convert(past_start, DType.i32))
    first = ctx.prim("argmax", key, dim=r)
    k = first
    if dt.is_floating:  # a NaN window: eager keeps the last NaN
        nan_in = ctx.prim("bitwise_and", ctx.prim("ne", stack, stack), inside)
        last_rev = ctx.prim("argmax", ctx.convert(ctx.prim("rev", nan_in, dims=[r]), DType.i32),
                            dim=r)
        last = ctx.prim("sub", kk - 1, last_rev)
        k = ctx.prim("where", ctx.prim("ne", values, values), last, first)
    # flat index into the H*W plane: (oh*s - p + (k // kw)*d) * W + ow*s - p + (k % kw)*d
    row = ctx.prim("add", _grid(ctx, base_h, grid, r - 2),
                   ctx.prim("mul", ctx.prim("div", k, ks[1]), dl[0]))
    col = ctx.prim("add", _grid(ctx, base_w, grid, r - 1),
                   ctx.prim("mul", ctx.prim("remainder", k, ks[1]), dl[1]))
    index = ctx.prim("add", ctx.prim("mul", row, w), col)
    return values, index


# ---- average pooling -------------------------------------------------------------------------


def _sum_all(ctx: DecompContext, xs: Sequence[Value]) -> Value:
    """A balanced sum (shorter dependency chains than a running sum)."""
    xs = list(xs)
    while len(xs) > 1:
        xs = [ctx.prim("add", xs[i], xs[i + 1]) if i + 1 < len(xs) else xs[i]
              for i in range(0, len(xs), 2)]
    return xs[0]


def _window_counts(size: int, out: int, k: int, s: int, p: int, include_pad: bool
                   ) -> list[int]:
    """eager's divisor per output position along one dim."""
    counts = []
    for o in range(out):
        start = o * s - p
        end = min(start + k, size + p)
        if include_pad:
            counts.append(end - start)
        else:
            counts.append(min(end, size) - max(start, 0))
    return counts


def _counts_vector(ctx: DecompContext, counts: list[int], dev: str) -> Value:
    """A vector holding `counts`, from iota arithmetic (the IR has no tensor literals): the
    counts are a middle value with a few edge positions different; built as a sum of
    indicator vectors."""
    n = len(counts)
    common = max(set(counts), key=counts.count)
    v = ctx.full([n], common, DType.i64, dev)
    idx = _iota(ctx, n, 0, 1, dev)
    for i, c in enumerate(counts):
        if c != common:
            v = ctx.prim("where", ctx.prim("eq", idx, i), c, v)
    return v


@register_decomposition("aten.avg_pool2d.default")
def avg_pool2d(ctx: DecompContext, self: Value, kernel_size: list[int],
               stride: list[int] | None = None, padding: list[int] | int = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Value:
    ks, st, pd, dl, (h, w) = _pool_params(ctx, self, kernel_size, stride or [], padding, 1)
    outs = [pool_out(ctx, n, k, s, p, 1, ceil_mode)
            for n, k, s, p in zip((h, w), ks, st, pd, strict=True)]
    out_dt = ctx.out_dtype()
    comp = opmath(out_dt)
    dev = ctx.device(self)
    x = ctx.convert(self, comp)
    total = _sum_all(ctx, _windows(ctx, x, ks, st, pd, dl, outs, 0))
    grid = list(ctx.shape(total))
    r = len(grid)
    if divisor_override:
        y = ctx.prim("div", total, divisor_override)
    else:
        ch = _window_counts(h, outs[0], ks[0], st[0], pd[0], count_include_pad)
        cw = _window_counts(w, outs[1], ks[1], st[1], pd[1], count_include_pad)
        if len(set(ch)) <= 1 and len(set(cw)) <= 1:
            y = ctx.prim("div", total, (ch or [1])[0] * (cw or [1])[0])
        else:
            div = ctx.prim("mul", _grid(ctx, _counts_vector(ctx, ch, dev), outs, 0),
                           _grid(ctx, _counts_vector(ctx, cw, dev), outs, 1))
            div = ctx.prim("broadcast_in_dim", ctx.convert(div, comp), shape=grid,
                           broadcast_dims=[r - 2, r - 1])
            y = ctx.prim("div", total, div)
    return ctx.convert(y, out_dt)


def _adaptive_dim(ctx: DecompContext, x: Value, dim: int, out: int) -> tuple[Value, list[int]]:
    """Sum x over adaptive windows along dim: window i is [floor(i*n/out), ceil((i+1)*n/out)).
    Returns the sums (dim now of size out) and each window's length."""
    shape = list(ctx.shape(x))
    n = _static(ctx, shape[dim], "spatial")
    starts = [(i * n) // out for i in range(out)]
    ends = [-(-((i + 1) * n) // out) for i in range(out)]
    lengths = [e - s for s, e in zip(starts, ends, strict=True)]
    if n % out == 0:  # equal, disjoint windows: a reshape and a sum
        k = n // out
        split = reshape(ctx, x, [*shape[:dim], out, k, *shape[dim + 1:]])
        return ctx.prim("sum", split, dims=[dim + 1]), lengths
    dev = ctx.device(x)
    pos = _iota(ctx, n, 0, 1, dev)
    table = [out, n]
    # window membership by iota arithmetic: start_i = (i*n) // out, end_i = ceil((i+1)*n/out)
    i = _iota(ctx, out, 0, 1, dev)
    lo = ctx.prim("div", ctx.prim("mul", i, n), out)
    hi = ctx.prim("div", ctx.prim("add", ctx.prim("mul", i, n), n + out - 1), out)
    p = _grid(ctx, pos, table, 1)
    member = ctx.prim("bitwise_and", ctx.prim("ge", p, _grid(ctx, lo, table, 0)),
                      ctx.prim("lt", p, _grid(ctx, hi, table, 0)))
    wide = [*shape[:dim], out, *shape[dim:]]
    xb = ctx.prim("broadcast_in_dim", x, shape=wide,
                  broadcast_dims=[*range(dim), *range(dim + 1, len(wide))])
    mb = ctx.prim("broadcast_in_dim", member, shape=wide, broadcast_dims=[dim, dim + 1])
    picked = ctx.prim("where", mb, xb, 0)
    return ctx.prim("sum", picked, dims=[dim + 1]), lengths


@register_decomposition("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(ctx: DecompContext, self: Value, output_size: list[Dim]) -> Value:
    if ctx.rank(self) not in (3, 4):
        raise DecompositionError(f"{ctx.node.op}: expected a 3-D or 4-D input")
    oh, ow = (_static(ctx, d, "output") for d in _per_dim(ctx, output_size, 2, "output_size"))
    out_dt = ctx.out_dtype()
    comp = opmath(out_dt)
    r = ctx.rank(self)
    shape = list(ctx.shape(self))
    if oh == 0 or ow == 0:
        return ctx.full([*shape[:-2], oh, ow], 0, out_dt, ctx.device(self))
    x = ctx.convert(self, comp)
    x, lh = _adaptive_dim(ctx, x, r - 2, oh)
    x, lw = _adaptive_dim(ctx, x, r - 1, ow)
    if len(set(lh)) == 1 and len(set(lw)) == 1:
        y = ctx.prim("div", x, lh[0] * lw[0])
    else:
        dev = ctx.device(self)
        div = ctx.prim("mul", _grid(ctx, _counts_vector(ctx, lh, dev), [oh, ow], 0),
                       _grid(ctx, _counts_vector(ctx, lw, dev), [oh, ow], 1))
        div = ctx.prim("broadcast_in_dim", ctx.convert(div, comp), shape=list(ctx.shape(x)),
                       broadcast_dims=[r - 2, r - 1])
        y = ctx.prim("div", x, div)
    return ctx.convert(y, out_dt)
