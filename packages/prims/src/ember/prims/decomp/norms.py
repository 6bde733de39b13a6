"""Decompositions of normalization: _softmax, _log_softmax, _safe_softmax, native_layer_norm,
native_batch_norm and its _native_batch_norm_legit forms, native_group_norm.

All compute in opmath (f16/bf16 -> f32) and convert each result to its declared dtype (the
saved statistics of norms are f32 when the parameters are f32 and the input is half). Statistics
are two-pass: the mean, then the mean of squared deviations (biased); rstd = rsqrt(var + eps).

Batch norm in the pure IR never mutates: `native_batch_norm` and `_native_batch_norm_legit`
(whose running stats eager updates in place in training) return only their three results and
leave the running stats alone. Capture's functionalization emits
`_native_batch_norm_legit_functional` for modules that track running stats; its decomposition
returns the updated stats (momentum * batch stat + (1 - momentum) * running stat, the variance
unbiased) as results 3 and 4.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from ember.ir import DType, TensorType, Value
from ember.ir.expr import FloorDiv, as_sympy, simplify_dim
from ember.prims.decomp.context import DecompContext, DecompositionError
from ember.prims.decomp.pointwise import opmath
from ember.prims.decomp.reductions import (
    all_of,
    as_vector,
    divide,
    expand_back,
    moments,
    reduce,
    reduced_count,
)
from ember.prims.decomp.table import register_decomposition

# ---- softmax --------------------------------------------------------------------------------


def softmax(ctx: DecompContext, x: Value, dim: int, log: bool,
            shift: Callable[[DecompContext, Value], Value] | None = None) -> Value:
    """softmax (or log_softmax) of x along dim, in x's dtype: exp(x - max) / sum, with eager's
    NaN for rows that are all -inf or hold +inf. `shift` wraps the row max (the training path
    passes a stop-gradient: the result does not depend on the shift, so no gradient goes
    through the max, as in eager's softmax backward)."""
    rank = ctx.rank(x)
    if rank == 0:
        return ctx.prim("reshape", softmax(ctx, as_vector(ctx, x), 0, log, shift), shape=[])
    d = ctx.norm_dim(dim, rank)
    shape = ctx.shape(x)
    if shape[d] == 0:  # an empty result: there is no max to take
        return x
    m = ctx.prim("amax", x, dims=[d])
    z = ctx.prim("sub", x, expand_back(ctx, m if shift is None else shift(ctx, m), shape, [d]))
    e = ctx.prim("exp", z)
    s = ctx.prim("sum", e, dims=[d])
    if log:
        return ctx.prim("sub", z, expand_back(ctx, ctx.prim("log", s), shape, [d]))
    return ctx.prim("div", e, expand_back(ctx, s, shape, [d]))


@register_decomposition("aten._softmax.default")
def _softmax(ctx: DecompContext, self: Value, dim: int, half_to_float: bool) -> Value:
    out = ctx.out_dtype()
    return ctx.convert(softmax(ctx, ctx.convert(self, opmath(out)), dim, False), out)


@register_decomposition("aten._log_softmax.default")
def _log_softmax(ctx: DecompContext, self: Value, dim: int, half_to_float: bool) -> Value:
    out = ctx.out_dtype()
    return ctx.convert(softmax(ctx, ctx.convert(self, opmath(out)), dim, True), out)


@register_decomposition("aten._safe_softmax.default")
def _safe_softmax(ctx: DecompContext, self: Value, dim: int, dtype: DType | None = None
                  ) -> Value:
    """softmax (of the input converted to dtype, as eager), with 0 instead of NaN for rows whose
    input is all -inf (masked attention rows)."""
    out = ctx.out_dtype()
    rank = ctx.rank(self)
    x = as_vector(ctx, self)
    d = ctx.norm_dim(dim, rank)
    r = softmax(ctx, ctx.convert(ctx.convert(x, out), opmath(out)), d, False)
    if ctx.dtype(x).is_floating:  # (only a float input can be -inf)
        masked = all_of(ctx, ctx.prim("eq", x, -math.inf), [d])
        r = ctx.prim("where", expand_back(ctx, masked, ctx.shape(x), [d]), 0.0, r)
    r = ctx.convert(r, out)
    return ctx.prim("reshape", r, shape=[]) if rank == 0 else r


# ---- layer norm -----------------------------------------------------------------------------


def _affine(ctx: DecompContext, y: Value, weight: Value | None, bias: Value | None,
            broadcast_dims: Sequence[int]) -> Value:
    """y * weight + bias, the parameters broadcast into y's dims `broadcast_dims`."""
    shape = ctx.shape(y)
    for p, prim in ((weight, "mul"), (bias, "add")):
        if p is not None:
            pb = ctx.prim("broadcast_in_dim", ctx.convert(p, ctx.dtype(y)), shape=list(shape),
                          broadcast_dims=list(broadcast_dims))
            y = ctx.prim(prim, y, pb)
    return y


def normalize(ctx: DecompContext, x: Value, dims: Sequence[int], eps: float
              ) -> tuple[Value, Value, Value, Value]:
    """((x - mean) * rstd, mean, rstd, sum of squared deviations) over dims; the statistics
    without the dims. An empty set has mean 0 and rstd NaN, as eager's norm kernels."""
    mean, m2, xc = moments(ctx, x, dims, empty_mean_zero=True)
    var = divide(ctx, m2, reduced_count(ctx, x, dims))
    rstd = ctx.prim("rsqrt", ctx.prim("add", var, eps))
    return ctx.prim("mul", xc, expand_back(ctx, rstd, ctx.shape(x), dims)), mean, rstd, m2


def _last_dims(ctx: DecompContext, input: Value, normalized_shape: Sequence[Any]) -> list[int]:
    """The dims a layer or RMS norm normalizes over: the last len(normalized_shape) of input's
    (their sizes are the input's, so symbolic sizes need no literal)."""
    rank = ctx.rank(input)
    axis = rank - len(normalized_shape)
    if not normalized_shape or axis < 0:
        raise DecompositionError(f"{ctx.node.op}: normalized_shape {normalized_shape} does not "
                                 f"fit {ctx.ttype(input)}")
    return list(range(axis, rank))


@register_decomposition("aten.native_layer_norm.default")
def native_layer_norm(ctx: DecompContext, input: Value, normalized_shape: list[Any],
                      weight: Value | None, bias: Value | None, eps: float
                      ) -> tuple[Value, Value, Value]:
    """Normalizes over the last len(normalized_shape) dims (their sizes are the input's, so
    symbolic sizes need no literal); mean and rstd keep those dims as size 1."""
    rank = ctx.rank(input)
    dims = _last_dims(ctx, input, normalized_shape)
    x = ctx.convert(input, opmath(ctx.dtype(input)))
    y, mean, rstd, _ = normalize(ctx, x, dims, eps)
    y = _affine(ctx, y, weight, bias, dims)
    return (ctx.convert(y, ctx.out_dtype(0)),
            ctx.convert(ctx.keepdim(mean, dims, rank), ctx.out_dtype(1)),
            ctx.convert(ctx.keepdim(rstd, dims, rank), ctx.out_dtype(2)))


@register_decomposition("aten._fused_rms_norm.default")
def _fused_rms_norm(ctx: DecompContext, input: Value, normalized_shape: list[Any],
                    weight: Value | None, eps: float | None = None) -> tuple[Value, Value]:
    """RMS norm over the last len(normalized_shape) dims (what F.rms_norm runs on a GPU):
    x * rsqrt(mean(x^2) + eps) in opmath, rounded to the input's dtype, then times the weight
    (as eager's composite rms_norm); eps None is the opmath type's epsilon. Returns (output,
    rstd kept as size-1 dims)."""
    rank = ctx.rank(input)
    dims = _last_dims(ctx, input, normalized_shape)
    comp = opmath(ctx.dtype(input))
    if eps is None:
        eps = float(torch.finfo(comp.torch).eps)
    x = ctx.convert(input, comp)
    ms = divide(ctx, reduce(ctx, "sum", ctx.prim("mul", x, x), dims), reduced_count(ctx, x, dims))
    rstd = ctx.prim("rsqrt", ctx.prim("add", ms, eps))
    y = ctx.convert(ctx.prim("mul", x, expand_back(ctx, rstd, ctx.shape(x), dims)),
                    ctx.dtype(input))
    out = ctx.out_dtype(0)
    if weight is not None:
        y = ctx.prim("mul", ctx.convert(y, out), ctx.broadcast_to(ctx.convert(weight, out),
                                                                  ctx.shape(input)))
    return (ctx.convert(y, out),
            ctx.convert(ctx.keepdim(rstd, dims, rank), ctx.out_dtype(1)))


@register_decomposition("aten._weight_norm_interface.default")
def _weight_norm_interface(ctx: DecompContext, v: Value, g: Value, dim: int = 0
                           ) -> tuple[Value, Value]:
    """Weight normalization (`nn.utils.weight_norm`, wav2vec2's positional convolution):
    w = v * (g / ||v||), the norm over every dim but `dim` (the first or the last, as eager's
    kernel requires), kept as size 1; returns (w, the norms), computed in the opmath type."""
    rank = ctx.rank(v)
    if dim not in (0, rank - 1):
        raise DecompositionError(f"{ctx.node.op}: dim must be 0 or the last dim ({rank - 1}), "
                                 f"not {dim} (as eager's kernel requires)")
    dims = [i for i in range(rank) if i != dim]
    x = ctx.convert(v, opmath(ctx.dtype(v)))
    norms = ctx.prim("sqrt", reduce(ctx, "sum", ctx.prim("mul", x, x), dims))
    norms = ctx.keepdim(norms, dims, rank)
    scale = ctx.prim("div", ctx.convert(g, opmath(ctx.dtype(g))), norms)
    w = ctx.prim("mul", x, ctx.broadcast_to(scale, ctx.shape(v)))
    return ctx.convert(w, ctx.out_dtype(0)), ctx.convert(norms, ctx.out_dtype(1))


# ---- batch norm -----------------------------------------------------------------------------


def _batch_norm(ctx: DecompContext, input: Value, weight: Value | None, bias: Value | None,
                running_mean: Value | None, running_var: Value | None, training: bool,
                momentum: float, eps: float, functional: bool = False,
                stop: Stop | None = None) -> list[Value]:
    """[out, save_mean, save_invstd] (+ [new running_mean, new running_var] if functional).
    Training normalizes by the batch statistics over every dim but 1 (the channel); eval by the
    running ones, and then save_mean/save_invstd are what the node declares: empty (eager on
    CPU) or the running mean and its invstd (torch's meta kernels, eager on CUDA). `stop` (a
    stop-gradient marker; the training path's) shapes the normalization for differentiation:
    `_normalize_for_grad`."""
    rank = ctx.rank(input)
    if rank < 2:
        raise DecompositionError(f"{ctx.node.op}: input must have a channel dim (rank >= 2)")
    dims = [0, *range(2, rank)]
    comp = opmath(ctx.dtype(input))
    x = ctx.convert(input, comp)
    shape = ctx.shape(x)
    device = ctx.device(x)
    if training:
        y, mean, invstd, m2 = (normalize(ctx, x, dims, eps) if stop is None
                               else _normalize_for_grad(ctx, x, dims, eps, stop))
        saved = [ctx.convert(mean, ctx.out_dtype(1)), ctx.convert(invstd, ctx.out_dtype(2))]
    else:
        if running_mean is None or running_var is None:
            raise DecompositionError(f"{ctx.node.op}: evaluation needs running_mean and "
                                     f"running_var")
        rm, rv = ctx.convert(running_mean, comp), ctx.convert(running_var, comp)
        invstd = ctx.prim("rsqrt", ctx.prim("add", rv, eps))
        chan = [ctx.prim("broadcast_in_dim", v, shape=list(shape), broadcast_dims=[1])
                for v in (rm, invstd)]
        y = ctx.prim("mul", ctx.prim("sub", x, chan[0]), chan[1])
        saved = [ctx.full([0], 0, ctx.out_dtype(i), device) if _declared_empty(ctx, i)
                 else ctx.convert(v, ctx.out_dtype(i)) for i, v in ((1, rm), (2, invstd))]
    out = [ctx.convert(_affine(ctx, y, weight, bias, [1]), ctx.out_dtype(0)), *saved]
    if not functional:
        return out
    assert running_mean is not None and running_var is not None
    if not training:
        return [*out, ctx.convert(running_mean, ctx.out_dtype(3)),
                ctx.convert(running_var, ctx.out_dtype(4))]
    # the running stats: momentum * batch stat + (1 - momentum) * running stat, with the
    # variance unbiased (m2 / (n - 1)), computed in opmath as eager's kernels do
    unbiased = ctx.prim("div", m2, simplify_dim(as_sympy(reduced_count(ctx, x, dims)) - 1))
    new = []
    for i, (stat, batch) in enumerate(((running_mean, mean), (running_var, unbiased))):
        s = ctx.prim("mul", ctx.convert(stat, comp), 1 - momentum)
        s = ctx.prim("add", ctx.prim("mul", batch, momentum), s)
        new.append(ctx.convert(s, ctx.out_dtype(3 + i)))
    return [*out, *new]


Stop = Callable[[DecompContext, Value], Value]


def _normalize_for_grad(ctx: DecompContext, x: Value, dims: Sequence[int], eps: float,
                        stop: Stop) -> tuple[Value, Value, Value, Value]:
    """`normalize`'s values, written so that differentiating them gives batch norm's closed-form
    input gradient, rstd * (g - mean(g) - xhat * mean(g * xhat)) for the cotangent g of xhat:
    its reductions (sum g, sum g * xc) read only the cotangent and saved values, so one pass
    computes them, as in eager's and TorchInductor's backward kernels. The one change: the
    variance is taken around S(mean), S the stop-gradient. Its value is the same, and so is its
    gradient (the variance's derivative by the mean is -2 * sum(x - mean) / n, zero); but
    differentiated through the mean, the mean's reduction would wait for the variance's (it
    sums the variance's term 2 * (x - mean) * ct_var), one more pass over the activation and
    one more reduction kernel after it. The forward is unchanged (cse merges the two x - mean)."""
    n = reduced_count(ctx, x, dims)
    shape = ctx.shape(x)
    n_mean: Any = max(n, 1) if isinstance(n, int) else sympy.Max(as_sympy(n), 1)
    mean = divide(ctx, reduce(ctx, "sum", x, dims), n_mean)
    xc = ctx.prim("sub", x, expand_back(ctx, mean, shape, dims))
    xc_s = ctx.prim("sub", x, expand_back(ctx, stop(ctx, mean), shape, dims))
    m2 = reduce(ctx, "sum", ctx.prim("mul", xc_s, xc_s), dims)
    rstd = ctx.prim("rsqrt", ctx.prim("add", divide(ctx, m2, n), eps))
    return ctx.prim("mul", xc, expand_back(ctx, rstd, shape, dims)), mean, rstd, m2


def training_batch_norms(stop: Stop) -> dict[str, Callable[..., list[Value]]]:
    """The batch norm decompositions in training mode for a joint graph (ember.autograd's
    training table): normalized by `_normalize_for_grad` with the marker `stop`."""

    def legit(ctx: DecompContext, input: Value, weight: Value | None, bias: Value | None,
              running_mean: Value | None, running_var: Value | None, training: bool,
              momentum: float, eps: float) -> list[Value]:
        return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training,
                           momentum, eps, stop=stop)

    def no_stats(ctx: DecompContext, input: Value, weight: Value | None, bias: Value | None,
                 training: bool, momentum: float, eps: float) -> list[Value]:
        if not training:
            raise DecompositionError(f"{ctx.node.op}: training=False needs running statistics")
        return _batch_norm(ctx, input, weight, bias, None, None, True, momentum, eps,
                           stop=stop)

    def functional(ctx: DecompContext, input: Value, weight: Value | None, bias: Value | None,
                   running_mean: Value, running_var: Value, training: bool, momentum: float,
                   eps: float) -> list[Value]:
        return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training,
                           momentum, eps, functional=True, stop=stop)

    def gpu(ctx: DecompContext, input: Value, weight: Value | None, bias: Value | None,
            running_mean: Value | None, running_var: Value | None, training: bool,
            exponential_average_factor: float, epsilon: float) -> list[Value]:
        out = legit(ctx, input, weight, bias, running_mean, running_var, training,
                    exponential_average_factor, epsilon)
        # cuDNN's form has a 4th result (its reserve space), MIOpen's does not
        return _with_reserve(ctx, out) if len(ctx.out_types) == 4 else out

    return {"aten.native_batch_norm.default": legit,
            "aten._native_batch_norm_legit.default": legit,
            "aten._native_batch_norm_legit.no_stats": no_stats,
            "aten._native_batch_norm_legit_functional.default": functional,
            "aten.cudnn_batch_norm.default": gpu,
            "aten.miopen_batch_norm.default": gpu}


def _declared_empty(ctx: DecompContext, i: int) -> bool:
    t = ctx.out_types[i]
    return isinstance(t, TensorType) and t.shape == (0,)


@register_decomposition("aten.native_batch_norm.default")
def native_batch_norm(ctx: DecompContext, input: Value, weight: Value | None,
                      bias: Value | None, running_mean: Value | None,
                      running_var: Value | None, training: bool, momentum: float, eps: float
                      ) -> list[Value]:
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training,
                       momentum, eps)


@register_decomposition("aten._native_batch_norm_legit.default")
def _native_batch_norm_legit(ctx: DecompContext, input: Value, weight: Value | None,
                             bias: Value | None, running_mean: Value, running_var: Value,
                             training: bool, momentum: float, eps: float) -> list[Value]:
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training,
                       momentum, eps)


@register_decomposition("aten._native_batch_norm_legit.no_stats")
def _native_batch_norm_legit_no_stats(ctx: DecompContext, input: Value, weight: Value | None,
                                      bias: Value | None, training: bool, momentum: float,
                                      eps: float) -> list[Value]:
    if not training:  # eager crashes here; there are no statistics to normalize by
        raise DecompositionError(f"{ctx.node.op}: training=False needs running statistics")
    return _batch_norm(ctx, input, weight, bias, None, None, True, momentum, eps)


@register_decomposition("aten._native_batch_norm_legit_no_training.default")
def _native_batch_norm_legit_no_training(ctx: DecompContext, input: Value, weight: Value | None,
                                         bias: Value | None, running_mean: Value,
                                         running_var: Value, momentum: float, eps: float
                                         ) -> list[Value]:
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, False, momentum,
                       eps)


@register_decomposition("aten._native_batch_norm_legit_functional.default")
def _native_batch_norm_legit_functional(ctx: DecompContext, input: Value,
                                        weight: Value | None, bias: Value | None,
                                        running_mean: Value, running_var: Value,
                                        training: bool, momentum: float, eps: float
                                        ) -> list[Value]:
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training,
                       momentum, eps, functional=True)


# The GPU forms aten.batch_norm dispatches to (cuDNN for f32/f16 CUDA inputs, MIOpen on ROCm).
# Capture turns a training call with
# running statistics into `_native_batch_norm_legit_functional` (the stats update is a write);
# these see the rest: evaluation, and training without running statistics. cuDNN's save_var is
# the inverse standard deviation, as native_batch_norm's; its 4th result is cuDNN's reserve
# space, which the decomposition returns empty (nothing reads it but cuDNN's own backward,
# which ember's autograd does not call).


def _with_reserve(ctx: DecompContext, out: list[Value]) -> list[Value]:
    """The three batch norm results and an empty reserve buffer of the declared type."""
    t = ctx.out_types[3]
    assert isinstance(t, TensorType)
    return [*out, ctx.full([0], 0, t.dtype, ctx.device(out[0]))]


@register_decomposition("aten.cudnn_batch_norm.default")
def cudnn_batch_norm(ctx: DecompContext, input: Value, weight: Value, bias: Value | None,
                     running_mean: Value | None, running_var: Value | None, training: bool,
                     exponential_average_factor: float, epsilon: float) -> list[Value]:
    return _with_reserve(ctx, _batch_norm(ctx, input, weight, bias, running_mean, running_var,
                                          training, exponential_average_factor, epsilon))


@register_decomposition("aten.miopen_batch_norm.default")
def miopen_batch_norm(ctx: DecompContext, input: Value, weight: Value, bias: Value | None,
                      running_mean: Value | None, running_var: Value | None, training: bool,
                      exponential_average_factor: float, epsilon: float) -> list[Value]:
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training,
                       exponential_average_factor, epsilon)


# ---- group norm -----------------------------------------------------------------------------


@register_decomposition("aten.native_group_norm.default")
def native_group_norm(ctx: DecompContext, input: Value, weight: Value | None,
                      bias: Value | None, N: Any, C: Any, HxW: Any, group: int, eps: float
                      ) -> list[Value]:
    """Statistics per (sample, group of C / group consecutive channels). The sizes come from the
    input (N, C and HxW restate them). With a concrete channel count the input is reshaped to
    [N, group, C / group, *spatial]; with a symbolic one (where C = group * (C // group) is not
    provable) a channel -> group map is gathered instead."""
    rank = ctx.rank(input)
    if rank < 2:
        raise DecompositionError(f"{ctx.node.op}: input must have a channel dim (rank >= 2)")
    x = ctx.convert(input, opmath(ctx.dtype(input)))
    shape = ctx.shape(x)
    n, c = shape[0], shape[1]
    if isinstance(c, int) or group == 1:
        per = c // group if isinstance(c, int) else c
        xg = ctx.prim("reshape", x, shape=[n, group, per, *shape[2:]])
        yg, mean, rstd, _ = normalize(ctx, xg, list(range(2, rank + 1)), eps)
        y = ctx.prim("reshape", yg, shape=list(shape))
    else:
        y, mean, rstd = _group_norm_gathered(ctx, x, group, eps)
    y = _affine(ctx, y, weight, bias, [1])
    return [ctx.convert(y, ctx.out_dtype(0)), ctx.convert(mean, ctx.out_dtype(1)),
            ctx.convert(rstd, ctx.out_dtype(2))]


def _group_norm_gathered(ctx: DecompContext, x: Value, group: int, eps: float
                         ) -> tuple[Value, Value, Value]:
    """Group statistics without reshaping the channel dim: per-channel sums are summed per
    group through a [C, group] membership mask (a select, so an inf in one group cannot reach
    another), and group statistics return to the channels with a gather."""
    shape = ctx.shape(x)
    n, c = shape[0], shape[1]
    spatial = list(range(2, len(shape)))
    per = simplify_dim(FloorDiv(as_sympy(c), group))
    device = ctx.device(x)
    gid = ctx.prim("div", ctx.prim("iota", length=c, start=0, step=1, dtype=DType.i64,
                                   device=device), per)  # channel -> its group
    member = ctx.prim("eq", ctx.prim("broadcast_in_dim", gid, shape=[c, group],
                                     broadcast_dims=[0]),
                      ctx.prim("broadcast_in_dim", ctx.prim(
                          "iota", length=group, start=0, step=1, dtype=DType.i64,
                          device=device), shape=[c, group], broadcast_dims=[1]))
    member = ctx.prim("broadcast_in_dim", member, shape=[n, c, group], broadcast_dims=[1, 2])
    index = ctx.prim("broadcast_in_dim", gid, shape=[n, c], broadcast_dims=[1])

    def group_sum(v: Value) -> Value:  # [n, c, *spatial] -> [n, group]
        per_channel = ctx.prim("broadcast_in_dim", reduce(ctx, "sum", v, spatial),
                               shape=[n, c, group], broadcast_dims=[0, 1])
        return ctx.prim("sum", ctx.prim("where", member, per_channel, 0), dims=[1])

    def to_channels(g: Value) -> Value:  # [n, group] -> [n, c, *spatial]
        return ctx.prim("broadcast_in_dim", ctx.prim("gather", g, index, dim=1),
                        shape=list(shape), broadcast_dims=[0, 1])

    count = simplify_dim(as_sympy(per) * as_sympy(reduced_count(ctx, x, spatial)))
    nonzero = max(count, 1) if isinstance(count, int) else sympy.Max(as_sympy(count), 1)
    mean = ctx.prim("div", group_sum(x), nonzero)  # an empty group's mean is 0, as eager
    xc = ctx.prim("sub", x, to_channels(mean))
    var = ctx.prim("div", group_sum(ctx.prim("mul", xc, xc)), count)
    rstd = ctx.prim("rsqrt", ctx.prim("add", var, eps))
    return ctx.prim("mul", xc, to_channels(rstd)), mean, rstd
