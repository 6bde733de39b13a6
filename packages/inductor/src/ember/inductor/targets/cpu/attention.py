"""The fused CPU attention as one extern, its results read where the kernel writes them.

The forward runs on ember's kernel (flash.py) where it serves, else on torch's; both write
the layouts below.

Forward: `aten._scaled_dot_product_flash_attention_for_cpu` writes its output as [B, L, H, E]
when q is a head split of a projection ([B, H, L, E] view of a [B, L, H, E] buffer) and its
logsumexp as [B, L, H] always, and returns both transposed. An extern's results are contiguous
buffers, so each was copied into [B, H, L, E] / [B, H, L] order (the logsumexp even where
nothing reads it), and the model's head merge (`transpose(1, 2).reshape(B, L, H*E)`, free in
eager) read the copy back across the heads for the output projection. For such a q the extern
is `loop.attention_heads_last_cpu` instead: the same kernel, its results returned as the
buffers it wrote, read as permuted views, so the head merge is a reshape the GEMM reads as it
is (TorchInductor hands the kernel's output to the GEMM the same way). So is a q of another
layout (Llama's, written [B, H, L, E] by the rotary kernel) where ember's kernel serves by the
static types (`_ember_kernel_serves`): it writes [B, L, H, E] whatever q's layout. Any other
call keeps the plain extern (torch's kernel then writes its output [B, H, L, E], which is what
it reads).

`aten._scaled_dot_product_flash_attention_for_cpu_backward` (what the forward's VJP rule emits
on the training path) returns grad_q, grad_k and grad_v as [B, H, L, E] views of [B, L, H, E]
buffers (strides L*H*E, E, H*E, 1). An extern's results are contiguous buffers, so each was
copied into [B, H, L, E] order before the next kernel (the rotary backward and head merge)
read it, which in turn reads per token, across the heads: three copies against the grain per
layer and step. The extern is this op instead: the same kernel, its gradients returned as the
[B, L, H, E] buffers it wrote (no copy), which the lowering reads as permuted views, so the
next kernel reads them row by row. Were a torch version to return them contiguous, the
transposes would be copies (`.contiguous()`), the values the same.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ember.inductor.indexing import affine_view, ivar
from ember.inductor.lowering import View
from ember.inductor.targets.cpu import flash
from ember.inductor.wrapper import register_binder
from ember.ir import DType, Node, TensorType, Value
from ember.ir.graph import Arg, map_args
from ember.ir.registry import OpTypeError, default_registry, register_op
from ember.ir.types import Type

BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
GRADS_HEADS_LAST = "loop.attention_grads_heads_last"


def _heads_last(t: Type) -> Type:
    if not isinstance(t, TensorType) or t.rank != 4:
        raise OpTypeError(f"{GRADS_HEADS_LAST}: the kernel's gradients must be 4-d, got {t}")
    b, h, n, e = t.shape
    return dataclasses.replace(t, shape=(b, n, h, e), strides=None)


def _infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    reg = ctx.registry
    target = reg.lookup(BACKWARD) if reg is not None else None
    if kw.get("kernel") != BACKWARD or target is None:
        raise OpTypeError(f"{GRADS_HEADS_LAST}: kernel= must be {BACKWARD}, got "
                          f"{kw.get('kernel')!r}")
    types = target.infer(ctx, args, {k: v for k, v in kw.items() if k != "kernel"})
    return [_heads_last(t) for t in types]


def _run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["kernel"])
    assert target is not None
    # torch's kernel reads a head's features as contiguous: a q, k, v or out whose last
    # stride is not 1 gave wrong gradients (q: off by ~30 on unit-scale data); such an operand
    # is copied first, as the forward does (flash.py)
    args = [a.contiguous() if isinstance(a, torch.Tensor) and a.dim() == 4
            and a.stride(-1) != 1 else a for a in args]
    res = target.reference(interp, args, {k: v for k, v in kw.items() if k != "kernel"})
    return tuple(r.transpose(1, 2) for r in res)


if default_registry().lookup(GRADS_HEADS_LAST) is None:
    register_op(GRADS_HEADS_LAST, "torch's fused CPU attention backward (kernel=) with its "
                "gradients returned as the [B, L, H, E] buffers the kernel writes (an extern's "
                "op)", _infer, _run, aliasing="fresh")


FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
HEADS_LAST = "loop.attention_heads_last_cpu"


def _forward_infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    reg = ctx.registry
    target = reg.lookup(FORWARD) if reg is not None else None
    if kw.get("kernel") != FORWARD or target is None:
        raise OpTypeError(f"{HEADS_LAST}: kernel= must be {FORWARD}, got {kw.get('kernel')!r}")
    out, lse = target.infer(ctx, args, {k: v for k, v in kw.items() if k != "kernel"})
    if not isinstance(out, TensorType) or out.rank != 4 or not isinstance(lse, TensorType) \
            or lse.rank != 3:
        raise OpTypeError(f"{HEADS_LAST}: the kernel's results must be 4-d and 3-d, got "
                          f"{out}, {lse}")
    b, h, n, e = out.shape
    return [dataclasses.replace(out, shape=(b, n, h, e), strides=None),
            dataclasses.replace(lse, shape=(b, n, h), strides=None)]


def _forward_run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    # called as it is (its arguments are tensors, floats and a bool): the generic reference's
    # argument handling cost ~45 us a call, as much as the copies this op saves; ember's
    # kernel (flash.py) where it serves, which writes [B, L, H, E], else torch's (its results
    # copied into that order)
    return flash.forward_heads_last(*args, **{k: v for k, v in kw.items() if k != "kernel"})


def _bind_forward(kw: Mapping[str, Any]) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The generated wrapper's call of the op (wrapper.register_binder): flash's heads-last
    forward with the node's constant attributes bound once; the call passes q, k, v (and
    dropout_p, is_causal) and the mask. No interpreter call, argument list or dict a call."""
    if kw.get("kernel") != FORWARD:
        raise ValueError(f"{HEADS_LAST}: kernel= must be {FORWARD}, got {kw.get('kernel')!r}")
    return functools.partial(flash.forward_heads_last,
                             **{k: v for k, v in kw.items() if k != "kernel"})


if default_registry().lookup(HEADS_LAST) is None:
    register_op(HEADS_LAST, "torch's fused CPU attention (kernel=) with its output and "
                "logsumexp returned as the [B, L, H, E] and [B, L, H] buffers the kernel writes "
                "(an extern's op)", _forward_infer, _forward_run, aliasing="fresh")
register_binder(HEADS_LAST, _bind_forward)


def _heads_inside_rows(lw: Any, v: Any) -> bool:
    """Whether [B, H, L, E] operand v is a view whose L stride is above its H stride (a head
    split of a projection), read off its affine index over a static contiguous buffer."""
    if not isinstance(v, Value) or not isinstance(v.type, TensorType) or v.type.rank != 4 \
            or v.type.shape[1] == 1:
        return False
    lazy = lw.env.get(v, v)
    st = lazy.src.type if isinstance(lazy, View) else None
    if not isinstance(st, TensorType) or not all(isinstance(d, int) for d in st.shape):
        return False
    aff = affine_view(lazy.index, 4)
    if aff is None:
        return False
    src_strides, acc = [], 1
    for d in reversed(st.shape):
        src_strides.append(acc)
        acc *= int(d)
    src_strides.reverse()
    h, n = (sum((c[k] if c else 0) * s for c, s in zip(aff[1], src_strides, strict=True))
            for k in (1, 2))
    return n > h


def _ember_kernel_serves(n: Node) -> bool:
    """Whether flash.py's kernel serves this call by its static types (f32 q, k, v and mask
    with concrete sizes, at least MIN_ROWS query rows, no dropout): it writes [B, L, H, E]
    whatever q's layout."""
    ts = [a.type for a in [*n.args[:3], n.kwargs.get("attn_mask")] if isinstance(a, Value)]
    drop = n.args[3] if len(n.args) > 3 else n.kwargs.get("dropout_p", 0.0)
    q = n.args[0].type if n.args and isinstance(n.args[0], Value) else None
    return len(ts) >= 3 and all(isinstance(t, TensorType) and t.dtype == DType.f32
                                and all(isinstance(d, int) for d in t.shape) for t in ts) \
        and isinstance(q, TensorType) and q.rank == 4 and int(q.shape[2]) >= flash.MIN_ROWS \
        and drop in (0, 0.0, None)


def lower_attention(lw: Any, n: Node) -> None:
    """One extern call of the forward kernel on strided views of q, k, v; for a heads-last q,
    or wherever ember's kernel serves, its output and logsumexp read as permuted views of the
    [B, L, H, E] and [B, L, H] buffers the kernel writes."""
    if len(n.results) != 2 or not (_heads_inside_rows(lw, n.args[0] if n.args else None)
                                   or _ember_kernel_serves(n)):
        lw.passthrough(n, n.op)
        return
    args = [map_args(a, lw.extern_operand) for a in n.args]
    kwargs = {k: map_args(a, lw.extern_operand) for k, a in n.kwargs.items()}
    out, lse = n.results
    assert isinstance(out.type, TensorType) and isinstance(lse.type, TensorType)
    b, h, L, e = out.type.shape
    types = [dataclasses.replace(out.type, shape=(b, L, h, e), strides=None),
             dataclasses.replace(lse.type, shape=(b, L, h), strides=None)]
    o, s = lw.b.emit("loop.extern", args, {"op": HEADS_LAST, "kernel": n.op, **kwargs},
                     types=types, names=[f"{r.name}.heads_last" for r in n.results], loc=n.loc)
    lw.env[out] = View(o, (ivar(0), ivar(2), ivar(1), ivar(3)), out.type)
    lw.env[lse] = View(s, (ivar(0), ivar(2), ivar(1)), lse.type)


def lower_attention_backward(lw: Any, n: Node) -> None:
    """One extern call of the backward kernel on strided views of its operands, each gradient
    read as a permuted view of the [B, L, H, E] buffer the kernel writes."""
    args = [map_args(a, lw.extern_operand) for a in n.args]
    kwargs = {k: map_args(a, lw.extern_operand) for k, a in n.kwargs.items()}
    types = [_heads_last(r.type) for r in n.results]
    names = [f"{r.name}.heads_last" for r in n.results]
    outs = lw.b.emit("loop.extern", args, {"op": GRADS_HEADS_LAST, "kernel": n.op, **kwargs},
                     types=types, names=names, loc=n.loc)
    for r, o in zip(n.results, outs, strict=True):
        assert isinstance(r.type, TensorType)
        lw.env[r] = View(o, (ivar(0), ivar(2), ivar(1), ivar(3)), r.type)


__all__ = ["BACKWARD", "FORWARD", "GRADS_HEADS_LAST", "HEADS_LAST", "lower_attention",
           "lower_attention_backward"]
