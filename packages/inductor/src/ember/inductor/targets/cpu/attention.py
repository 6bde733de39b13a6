"""The backward of torch's fused CPU attention as one extern, its gradients read where the
kernel writes them.

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
from collections.abc import Mapping, Sequence
from typing import Any

from ember.inductor.indexing import ivar
from ember.inductor.lowering import View
from ember.ir import Node, TensorType
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
    res = target.reference(interp, args, {k: v for k, v in kw.items() if k != "kernel"})
    return tuple(r.transpose(1, 2) for r in res)


if default_registry().lookup(GRADS_HEADS_LAST) is None:
    register_op(GRADS_HEADS_LAST, "torch's fused CPU attention backward (kernel=) with its "
                "gradients returned as the [B, L, H, E] buffers the kernel writes (an extern's "
                "op)", _infer, _run, aliasing="fresh")


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


__all__ = ["BACKWARD", "GRADS_HEADS_LAST", "lower_attention_backward"]
