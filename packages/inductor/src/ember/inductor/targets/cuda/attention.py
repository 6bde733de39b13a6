"""CUDA attention kept whole: torch's fused kernel as one extern call (issue 16, item 3).

On a GPU, capture records what sdpa dispatches to: `_scaled_dot_product_flash_attention`,
`_efficient_attention` or `_cudnn_attention`. Decomposed, each is two GEMMs, a softmax kernel
and head copies; the CUDA front end (`decompose{keep_cuda_attention=true}`, no dropout, static
shapes) keeps it as the one op, and this module lowers it to `loop.extern(op=<the same torch
op>)` on strided views of q, k, v and the bias (no copies where the kernel takes the strides);
the q/k/v producers (bias adds, rotary, scaling) and the output's head merge stay Triton kernels.

The memory-efficient kernel (and cuDNN's) needs every stride of the bias but the last to be a
multiple of 16 bytes ("attn_bias is not correctly aligned"): eager's sdpa pads such a mask
(`pad_bias`: pad the last dim, slice it back). The `cuda-attention` pass does the same in the
prims graph, before lowering, so the dump shows it: a bias whose rows are not 16 elements long
becomes `slice(pad(bias))` (a mask broadcast over heads is padded before the broadcast, as
eager pads it before its expand). The lowering rule checks the strides it hands over and copies
an operand the kernel would refuse (a last stride other than 1, an unaligned bias) into a
contiguous buffer. `cuda-attention{explain=true}` prints each decision (stderr).

Training (issue 16 item 6): the forms' VJP rules (autograd/vjp/attention_cuda.py) emit their
own backward kernels (`_scaled_dot_product_{flash,efficient,cudnn}_attention_backward`), which
the same front end keeps and this module lowers to one extern each on strided views of the
cotangent, q, k, v, the saved output and logsumexp (the bias aligned as in the forward), the
gradients of heads-last operands returned as the [B, L, H, E] buffers the kernel writes
(`loop.cuda_attention_grads`, below).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ember.inductor.indexing import affine_view, ivar
from ember.inductor.lowering import View
from ember.ir import Builder, Graph, Module, Node, TensorType, Value
from ember.ir.graph import Arg, fresh_name, map_args, value_names
from ember.ir.passes import register_pass
from ember.ir.registry import OpTypeError, default_registry, register_op
from ember.ir.types import Type
from ember.prims.decomp.passes import FUSED_ATTENTION_CUDA

FLASH = "aten._scaled_dot_product_flash_attention.default"
EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
CUDNN = "aten._scaled_dot_product_cudnn_attention.default"
# their backward kernels (the forms' VJP rules, autograd/vjp/attention_cuda.py, emit them on
# the training path), kept by the same front end
FLASH_BACKWARD = "aten._scaled_dot_product_flash_attention_backward.default"
EFFICIENT_BACKWARD = "aten._scaled_dot_product_efficient_attention_backward.default"
CUDNN_BACKWARD = "aten._scaled_dot_product_cudnn_attention_backward.default"
BACKWARD = (FLASH_BACKWARD, EFFICIENT_BACKWARD, CUDNN_BACKWARD)
# the attn_bias argument's position
BIAS_AT = {EFFICIENT: 3, CUDNN: 3, EFFICIENT_BACKWARD: 4, CUDNN_BACKWARD: 8}
# the bias's rows padded to this many elements (16 bytes or more for every float dtype; eager's
# pad_bias uses 16 as well)
ALIGN = 16
BROADCAST = "prims.broadcast_in_dim"


def _padded_slice(x: Value, taken: set[str], n: Node) -> tuple[list[Node], Value]:
    """Nodes computing `pad(x)[..., :S]` (last dim padded to a multiple of ALIGN with zeros):
    the same values as x, in a buffer whose rows are ALIGN-aligned."""
    t = x.type
    assert isinstance(t, TensorType)
    S = int(t.shape[-1])
    width = -(-S // ALIGN) * ALIGN
    config = [[0, 0, 0] for _ in t.shape]
    config[-1] = [0, width - S, 0]
    pt = dataclasses.replace(t, shape=(*t.shape[:-1], width), strides=None)
    pv = Value(fresh_name(f"{x.name}.pad{ALIGN}", taken, ""), pt)
    pad = Node("prims.pad", [x, 0.0], {"config": config}, [pv], n.loc)
    pv.node = pad
    sv = Value(fresh_name(f"{x.name}.aligned", taken, ""), dataclasses.replace(t, strides=None))
    sl = Node("prims.slice", [pv], {"start": [0] * len(t.shape), "limit": list(t.shape),
                                    "step": [1] * len(t.shape)}, [sv], n.loc)
    sv.node = sl
    return [pad, sl], sv


def _align_bias(n: Node, taken: set[str]) -> tuple[list[Node], str]:
    """Nodes to insert before attention `n` so its bias rows are aligned, and why."""
    at = BIAS_AT.get(n.op)
    bias = n.args[at] if at is not None and len(n.args) > at else None
    if not isinstance(bias, Value) or not isinstance(bias.type, TensorType):
        return [], "no bias"
    S = bias.type.shape[-1]
    if not isinstance(S, int) or S % ALIGN == 0:
        return [], f"bias rows of {S} elements: aligned"
    src = bias.node
    if src is not None and src.op == BROADCAST and isinstance(src.args[0], Value):
        x = src.args[0]
        xt = x.type
        if isinstance(xt, TensorType) and xt.shape and xt.shape[-1] == S:
            # pad the mask before its broadcast over heads and query rows, as eager does
            nodes, aligned = _padded_slice(x, taken, n)
            b = Value(fresh_name(f"{bias.name}.aligned", taken, ""), bias.type)
            bn = Node(BROADCAST, [aligned, *src.args[1:]], dict(src.kwargs), [b], src.loc)
            b.node = bn
            n.args[at] = b  # type: ignore[index]
            return [*nodes, bn], f"bias rows of {S} elements padded to {ALIGN} before broadcast"
    nodes, aligned = _padded_slice(bias, taken, n)
    n.args[at] = aligned  # type: ignore[index]
    return nodes, f"bias rows of {S} elements padded to a multiple of {ALIGN}"


def _rewrite(g: Graph, explain: bool) -> int:
    taken = value_names(g)
    out: list[Node] = []
    kept = 0
    for n in g.nodes:
        if n.op in FUSED_ATTENTION_CUDA or n.op in BACKWARD:
            extra, why = _align_bias(n, taken)
            out += extra
            kept += 1
            if explain:
                name = n.results[0].name if n.results else "?"
                print(f"cuda-attention: @{g.name} %{name} = {n.op.split('.')[1]} kept whole as "
                      f"torch's fused kernel (one extern, no score matrix in memory); {why}",
                      file=sys.stderr)
        out.append(n)
    g.nodes = out
    return kept


@register_pass("cuda-attention", "CUDA: torch's fused attention (kept whole by the front end) "
               "gets a bias with 16-element-aligned rows, padded and sliced back as eager's "
               "sdpa does; explain=true says what each kept attention op gets")
def cuda_attention(module: Module, *, explain: bool = False) -> Module:
    out = module.clone()
    for g in out.graphs.values():
        _rewrite(g, explain)
    return out


# ---- lowering -------------------------------------------------------------------------------

def _strides(lw: Any, v: Value) -> tuple[list[int], int] | None:
    """The element strides and offset the extern will see for operand v (its lazy view over a
    contiguous buffer), or None where they are not static."""
    t = v.type
    if not isinstance(t, TensorType):
        return None
    lazy = lw.env.get(v, v)
    src = getattr(lazy, "src", None)
    if src is None:  # a real buffer: contiguous
        if not all(isinstance(d, int) for d in t.shape):
            return None
        out, acc = [], 1
        for d in reversed(t.shape):
            out.append(acc)
            acc *= int(d)
        return out[::-1], 0
    st = src.type
    if not isinstance(st, TensorType) or not all(isinstance(d, int) for d in st.shape):
        return None
    aff = affine_view(lazy.index, t.rank)
    if aff is None:
        return None
    offsets, coefs = aff
    sstr, acc = [], 1
    for d in reversed(st.shape):
        sstr.append(acc)
        acc *= int(d)
    sstr = sstr[::-1]
    strides = [sum((c[k] if c else 0) * s for c, s in zip(coefs, sstr, strict=True))
               for k in range(t.rank)]
    return strides, sum(o * s for o, s in zip(offsets, sstr, strict=True))


def _accepted(lw: Any, v: Value, bias: bool) -> bool:
    """Whether the fused kernels take operand v's strided view as it is: a last stride of 1
    (or a broadcast), and for a bias every other stride and the offset 16-element aligned."""
    got = _strides(lw, v)
    if got is None:
        return False
    strides, offset = got
    t = v.type
    assert isinstance(t, TensorType)
    if strides and strides[-1] not in (0, 1) and t.shape[-1] != 1:
        return False
    return not bias or (offset % ALIGN == 0 and all(s % ALIGN == 0 for s in strides[:-1]))


# The fused kernels write their output as [B, L, H, E] and return it transposed to
# [B, H, L, E]; the model merges the heads right back (`transpose(1, 2).reshape(B, L, H*E)`),
# free in eager. An extern's result is a contiguous buffer, so the extern is this op: the
# kernel's output as the [B, L, H, E] buffer it wrote (no copy), which the lowering reads as a
# permuted view, so the head merge is a reshape of it and the output projection's GEMM reads it
# as it is. Its other results are the kernel's.
HEADS_LAST = "loop.attention_heads_last"
# the decision, as the extern's why= attribute (the dump says why no GEMMs and softmax are there)
WHY = ("kept whole: torch's fused kernel, no score matrix in memory and no softmax kernel "
       "(decompose{keep_cuda_attention=true})")
_OWN = ("kernel", "why")  # this op's attributes; the rest are the kernel's


def _kernel_infer(op: str, what: str, kernels: Sequence[str], own: Sequence[str], ctx: Any,
                  args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    """The result types of the torch op that `op` (an extern's wrapper op) calls, named by its
    kernel= (one of `kernels`, a `what`), typed on `op`'s attributes less its `own`."""
    name = kw.get("kernel")
    reg = ctx.registry
    target = reg.lookup(name) if isinstance(name, str) and reg is not None else None
    if name not in kernels or target is None:
        raise OpTypeError(f"{op}: kernel= must name a {what} ({', '.join(kernels)}), got "
                          f"{name!r}")
    types: list[Type] = target.infer(ctx, args, {k: v for k, v in kw.items() if k not in own})
    return types


def _heads_last_infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    types = _kernel_infer(HEADS_LAST, "CUDA attention op", FUSED_ATTENTION_CUDA, _OWN, ctx,
                          args, kw)
    out = types[0]
    if not isinstance(out, TensorType) or out.rank != 4:
        raise OpTypeError(f"{HEADS_LAST}: the kernel's output must be 4-d, got {out}")
    B, H, L, E = out.shape
    return [dataclasses.replace(out, shape=(B, L, H, E), strides=None), *types[1:]]


def _heads_last_run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["kernel"])
    assert target is not None
    res = target.reference(interp, args, {k: v for k, v in kw.items() if k not in _OWN})
    res = list(res) if isinstance(res, (list, tuple)) else [res]
    return (res[0].transpose(1, 2), *res[1:])


def _register_heads_last() -> None:
    if default_registry().lookup(HEADS_LAST) is None:
        register_op(HEADS_LAST, "a CUDA fused attention op (kernel=) whose output is returned "
                    "as the [B, L, H, E] buffer the kernel writes (an extern's op)",
                    _heads_last_infer, _heads_last_run, aliasing="fresh")


_register_heads_last()


def lower_attention(lw: Any, n: Node) -> None:
    """The kept CUDA attention op: one extern call of the same torch op on strided views of its
    operands (an operand whose strides the kernel refuses is copied first, contiguous), its
    output read as a permuted view of the [B, L, H, E] buffer the kernel writes."""
    at = BIAS_AT.get(n.op)
    for i, a in enumerate(n.args[:4]):
        if isinstance(a, Value) and isinstance(a.type, TensorType) \
                and not _accepted(lw, a, bias=i == at):
            lw.materialize(a)
    args = [map_args(a, lw.extern_operand) for a in n.args]
    kwargs = {k: map_args(a, lw.extern_operand) for k, a in n.kwargs.items()}
    out = n.results[0]
    ot = out.type
    assert isinstance(ot, TensorType) and ot.rank == 4
    B, H, L, E = ot.shape
    buf_t = dataclasses.replace(ot, shape=(B, L, H, E), strides=None)
    names = [f"{out.name}.heads_last", *(r.name for r in n.results[1:])]
    for r in n.results[1:]:
        lw.b.taken.discard(r.name)
    outs = lw.b.emit("loop.extern", args,
                     {"op": HEADS_LAST, "kernel": n.op, "why": WHY, **kwargs},
                     types=[buf_t, *(r.type for r in n.results[1:])], names=names, loc=n.loc)
    lw.env[out] = View(outs[0], (ivar(0), ivar(2), ivar(1), ivar(3)), ot)
    lw.env.update(zip(n.results[1:], outs[1:], strict=True))


# The backward kernels return grad_q/k/v in the stride order of q/k/v (flash and cuDNN
# allocate them `empty_like` their operand, the memory-efficient kernel `empty_strided` like
# it, each on the [B, L, H, E] transpose it works on): for the usual operand, a head split of a
# projection ([B, H, L, E] view of a [B, L, H, E] buffer), that is a [B, H, L, E] view of a
# [B, L, H, E] buffer. An extern's result is a contiguous buffer, so each gradient was copied
# to [B, H, L, E] order, and the next kernel (the head merge into the projection's gradient)
# read it across the heads again. The extern is this op instead: the same kernel, the
# gradients whose operand is laid out heads-last (heads_last=) returned as the [B, L, H, E]
# buffers the kernel writes (no copy), read as permuted views. Where a kernel writes another
# layout the transpose is a copy, the values the same.
GRADS = "loop.cuda_attention_grads"
_GRADS_OWN = ("kernel", "heads_last")


def _grads_layout(t: Type, heads_last: bool) -> Type:
    if not heads_last:
        return t
    if not isinstance(t, TensorType) or t.rank != 4:
        raise OpTypeError(f"{GRADS}: a heads-last gradient must be 4-d, got {t}")
    B, H, L, E = t.shape
    return dataclasses.replace(t, shape=(B, L, H, E), strides=None)


def _grads_flags(kw: Mapping[str, Arg], n: int) -> list[bool]:
    flags = kw.get("heads_last")
    if not isinstance(flags, list) or len(flags) > n or not all(isinstance(f, bool)
                                                                  for f in flags):
        raise OpTypeError(f"{GRADS}: heads_last= must be a list of at most {n} bools, got "
                          f"{flags!r}")
    return [*flags, *([False] * (n - len(flags)))]


def _grads_infer(ctx: Any, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    types = _kernel_infer(GRADS, "CUDA attention backward op", BACKWARD, _GRADS_OWN, ctx, args,
                          kw)
    flags = _grads_flags(kw, len(types))
    return [_grads_layout(t, f) for t, f in zip(types, flags, strict=True)]


def _grads_run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["kernel"])
    assert target is not None
    res = target.reference(interp, args, {k: v for k, v in kw.items() if k not in _GRADS_OWN})
    res = list(res) if isinstance(res, (list, tuple)) else [res]
    flags = _grads_flags(kw, len(res))
    return tuple(r.transpose(1, 2) if f else r for r, f in zip(res, flags, strict=True))


if default_registry().lookup(GRADS) is None:
    register_op(GRADS, "a CUDA fused attention backward op (kernel=) with the gradients of "
                "heads-last operands (heads_last=) returned as the [B, L, H, E] buffers the "
                "kernel writes (an extern's op)", _grads_infer, _grads_run, aliasing="fresh")


def _heads_last_operand(lw: Any, v: Any) -> bool:
    """Whether operand v (a [B, H, L, E] value) is laid out with its heads inside its rows:
    its L stride above its H stride, as a head split of a projection is."""
    if not isinstance(v, Value) or not isinstance(v.type, TensorType) or v.type.rank != 4:
        return False
    got = _strides(lw, v)
    return got is not None and got[0][2] > got[0][1] and v.type.shape[1] != 1


def lower_attention_backward(lw: Any, n: Node) -> None:
    """The kept CUDA attention backward: one extern call of the same torch op on strided views
    of its operands (one the kernel would refuse copied first, contiguous); grad_q/k/v of a
    heads-last q/k/v read as permuted views of the [B, L, H, E] buffers the kernel writes."""
    at = BIAS_AT.get(n.op)
    out_at = 5 if n.op == EFFICIENT_BACKWARD else 4
    for i in (0, 1, 2, 3, out_at, *(() if at is None else (at,))):
        a = n.args[i] if len(n.args) > i else None
        if isinstance(a, Value) and isinstance(a.type, TensorType) \
                and not _accepted(lw, a, bias=i == at):
            lw.materialize(a)
    flags = [_heads_last_operand(lw, a) for a in n.args[1:4]]
    args = [map_args(a, lw.extern_operand) for a in n.args]
    kwargs = {k: map_args(a, lw.extern_operand) for k, a in n.kwargs.items()}
    flags += [False] * (len(n.results) - len(flags))
    types = [_grads_layout(r.type, f) for r, f in zip(n.results, flags, strict=True)]
    names = [f"{r.name}.heads_last" if f else r.name
             for r, f in zip(n.results, flags, strict=True)]
    for r, f in zip(n.results, flags, strict=True):
        if not f:
            lw.b.taken.discard(r.name)
    outs = lw.b.emit("loop.extern", args, {"op": GRADS, "kernel": n.op,
                                           "heads_last": flags[:3], **kwargs},
                     types=types, names=names, loc=n.loc)
    for r, o, f in zip(n.results, outs, flags, strict=True):
        assert isinstance(r.type, TensorType)
        lw.env[r] = View(o, (ivar(0), ivar(2), ivar(1), ivar(3)), r.type) if f else o


# ---- CPU-only verification ------------------------------------------------------------------

CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def cuda_form_of_cpu_attention(module: Module) -> Module:
    """A CPU capture retyped onto cuda (every tensor type's device, in place) gets, for each CPU
    flash attention node (no dropout, its logsumexp unused), the form sdpa dispatches to on a
    GPU: without a mask `_scaled_dot_product_flash_attention`, with one
    `_scaled_dot_product_efficient_attention` on the mask expanded to [B, H, L, S] (as sdpa
    expands it). The output keeps its Value. How the kernel census and the tests see the CUDA
    forms without a GPU; modifies and returns `module`."""
    for g in module.graphs.values():
        used = {v for n in g.nodes for v in n.operands()} | set(g.outputs)
        b = Builder(module, taken=(v.name for v in g.values()))
        for n in g.nodes:
            args, kw = list(n.args), dict(n.kwargs)
            dropout = args[3] if len(args) > 3 else kw.get("dropout_p", 0.0)
            if n.op != CPU_FLASH or dropout not in (0, 0.0) or n.results[1] in used:
                b.nodes.append(n)
                continue
            q, k, v = args[:3]
            assert isinstance(q, Value) and isinstance(k, Value)
            qt, kt = q.type, k.type
            assert isinstance(qt, TensorType) and isinstance(kt, TensorType)
            causal = args[4] if len(args) > 4 else kw.get("is_causal", False)
            mask = args[5] if len(args) > 5 else kw.get("attn_mask")
            extra = {"scale": kw["scale"]} if kw.get("scale") is not None else {}
            b.loc = n.loc
            if mask is None:
                outs = b.emit(FLASH, [q, k, v, 0.0, causal], extra)
            else:
                assert isinstance(mask, Value) and isinstance(mask.type, TensorType)
                shape = [*qt.shape[:-1], kt.shape[-2]]
                if list(mask.type.shape) != shape:
                    mask = b.emit("aten.expand.default", [mask, shape])[0]
                outs = b.emit(EFFICIENT, [q, k, v, mask, False, 0.0, causal], extra)
            old, new = n.results[0], outs[0]
            assert new.node is not None and new.type == old.type, (new.type, old.type)
            new.node.results[0] = old  # readers keep reading the same Value
            old.node, old.index = new.node, 0
        g.nodes = b.nodes
    return module


LOWERINGS = {**{op: lower_attention for op in FUSED_ATTENTION_CUDA},
             **{op: lower_attention_backward for op in BACKWARD}}

__all__ = ["ALIGN", "BACKWARD", "CUDNN", "CUDNN_BACKWARD", "EFFICIENT", "EFFICIENT_BACKWARD",
           "FLASH", "FLASH_BACKWARD", "GRADS", "HEADS_LAST", "LOWERINGS", "cuda_attention",
           "cuda_form_of_cpu_attention", "lower_attention", "lower_attention_backward"]
