"""The CPU target's convolutions: channels-last (oneDNN's fast layout) with BatchNorm+ReLU folded.

`conv-nhwc` (a pass over prims, before lower-loops) rewrites each 2-d f32 convolution with
concrete, non-zero sizes, and the per-channel affine chain (+ReLU) after it (epilogue.py), into
one node placed where the chain ended (its per-channel operands are defined by then):

    %r = loop.conv2d(%x, %w, %m, %rs, steps=["prims.sub", "prims.mul"], relu=true,
                     stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]

(NCHW result, the chain's value; operands after the weight: one per step, a [C] vector or a
number; y = y <step> operand per channel). The CPU target's lowering rule for it (`_lower`)
writes the input as an NHWC buffer by a copy kernel (its producer fuses into that copy; none
when it already is one), computes weight * A and bias B by small kernels every call, and emits
`loop.extern(op="loop.conv2d_nhwc")`, read back through a permuted view; relu=true adds a
NaN-propagating max(y, 0) kernel over the NHWC result (not oneDNN's post-op: epilogue.py).
Where the weight is a graph input (a parameter), the extern is `loop.conv2d_packed`
(packed.py) instead: it takes the raw weight and A, and keeps oneDNN's packed `weight * A`
across calls (repacked when the weight or A changes), so neither the scaled weight nor
oneDNN's per-call weight reorder is paid each call; a ReLU that a convolution reads is then
applied in place inside that extern (torch's relu_, NaN kept).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ember.inductor.body import BodyBuilder, fresh_body_name
from ember.inductor.indexing import ivar
from ember.inductor.lowering import View, _Lowering, _ranges, _x
from ember.inductor.targets.cpu.epilogue import AFFINE_OPS, conv_epilogues
from ember.inductor.targets.cpu.packed import PACKED_OP
from ember.ir import (
    Arg,
    DType,
    Graph,
    InferContext,
    Interpreter,
    Module,
    Node,
    OpDef,
    OpTypeError,
    TensorType,
    Type,
    Value,
    default_registry,
)
from ember.ir.graph import fresh_name
from ember.ir.passes import register_pass
from ember.prims import PRIMS_BY_OP

CONV_OP = "loop.conv2d"
_OWN_KW = ("steps", "relu", "relu_max", "silu", "hardswish", "residual")  # the rest are prims.convolution's attributes


def _nhwc_ok(x: TensorType, t: TensorType) -> bool:
    """oneDNN's fast path: a 4-d f32 input with non-zero sizes and concrete channels (a batch
    or image size may be a size symbol: size-generic graphs keep the fast path)."""
    sizes = (*x.shape, *t.shape)
    return x.rank == 4 and x.dtype == DType.f32 and isinstance(x.shape[1], int) \
        and isinstance(t.shape[1], int) and 0 not in sizes


@register_pass("conv-nhwc", "CPU: 2-d f32 convolutions, with a per-channel affine epilogue "
               "(eval BatchNorm) and ReLU folded, become loop.conv2d (lowered channels-last)")
def conv_nhwc(module: Module) -> Module:
    out = module.clone()
    for g in out.graphs.values():
        _rewrite(g)
        _channels_last_producers(g)
    return out


TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _channels_last_producers(g: Graph) -> None:
    """Layout choice: a convolution's input made by an elementwise prim (a residual add+ReLU,
    a max pool's maximum chain) or a channel concatenate, and also read elsewhere, is computed
    channels-last: the node runs on NHWC permutes of its operands and its NCHW value is a
    permute of that result. Lowered, the kernel writes the NHWC buffer the convolution reads
    as it is, and the other readers index it through the permute, where before the NCHW
    buffer was written and then copied to NHWC for the convolution (a whole extra pass over
    the activation). A single-reader input needs none of this: it fuses into the copy. So
    are the multi-reader values such an input is computed from (`_roots`)."""
    readers: dict[Value, int] = {}
    for n in g.nodes:
        for v in set(n.operands()):
            readers[v] = readers.get(v, 0) + 1
    names = {r.name for n in g.nodes for r in n.results} | {p.name for p in g.params}
    swap: dict[int, list[Node]] = {}
    inputs = [c.args[0] for c in g.nodes if c.op == CONV_OP and c.args
              and isinstance(c.args[0], Value)]
    viewed = {c for v in inputs for c in _viewed_cats(v)}
    for x in [r for v in inputs for r in [*_roots(v, readers), *_viewed_cats(v)]]:
        p = x.node if isinstance(x, Value) else None
        if not isinstance(x, Value) or p is None or id(p) in swap or len(p.results) != 1 \
                or (readers.get(x, 0) < 2 and x not in viewed) or x in g.outputs \
                or not isinstance(x.type, TensorType) or x.type.rank != 4:
            continue
        cat = _channel_cat(p)
        if not cat and not _elementwise(p):
            continue
        operands = p.args[0] if cat else p.args
        assert isinstance(operands, list)
        if not all(isinstance(a, (int, float)) or (
                isinstance(a, Value) and isinstance(a.type, TensorType) and a.type.rank == 4
                and (cat or list(a.type.shape) == list(x.type.shape))) for a in operands):
            continue
        nodes: list[Node] = []
        args = [_permuted(a, TO_NHWC, p, nodes, names) if isinstance(a, Value) else a
                for a in operands]
        xt = x.type
        y = Value(fresh_name(f"{x.name}.nhwc_out", names),
                  TensorType(xt.dtype, tuple(xt.shape[d] for d in TO_NHWC), None, xt.device))
        node = Node(p.op, [args] if cat else args, {**p.kwargs, "dim": 3} if cat
                    else dict(p.kwargs), [y], p.loc, p.pos)
        y.node = node
        nodes.append(node)
        _permuted(y, TO_NCHW, p, nodes, names, x)
        swap[id(p)] = nodes
    if swap:
        g.nodes = [m for n in g.nodes for m in swap.get(id(n), [n])]


def _channel_cat(p: Node) -> bool:
    """A concatenation of a list of values along the channels (dim 1)."""
    return p.op == "prims.concatenate" and p.kwargs.get("dim") == 1 and len(p.args) == 1 \
        and isinstance(p.args[0], list)


def _elementwise(p: Node) -> bool:
    prim = PRIMS_BY_OP.get(p.op)
    return prim is not None and prim.elementwise


ROOT_DEPTH = 8  # single-reader nodes walked back from a convolution's input


def _roots(x: Value, readers: dict[Value, int]) -> list[Value]:
    """`x`, then the values read by several nodes that reach `x` through single-reader
    elementwise prims, channel concatenations and slices (a DenseNet layer's BatchNorm and
    ReLU before its convolution, on the concatenation of the block's earlier outputs: its max
    pool's result, read by every layer of the block, is such a root; EdgeNeXt's split
    attention block convolves a channel chunk of its input, which the block's LayerNorm and
    residual read too). The kernel computing `x` loops channels-last (the convolution reads
    it NHWC), so a root computed NCHW is read with the channels, its innermost loop, strided
    by the image size in each of those kernels."""
    out = [x]
    todo, seen = [(x, 0)], {x}
    while todo:
        v, depth = todo.pop()
        p = v.node
        if p is None or depth >= ROOT_DEPTH or len(p.results) != 1 or v.type is None:
            continue
        cat = _channel_cat(p)
        part = p.op == "prims.slice"  # a [N, C', H', W'] piece: its operand's shape differs
        if not cat and not part and not _elementwise(p):
            continue
        vt = v.type
        for a in (p.args[0] if cat else p.args[:1] if part else p.args):  # type: ignore[union-attr]
            if not isinstance(a, Value) or a in seen or not isinstance(a.type, TensorType) \
                    or not isinstance(vt, TensorType) or a.type.rank != 4 \
                    or (not cat and not part and list(a.type.shape) != list(vt.shape)):
                continue
            seen.add(a)
            if readers.get(a, 0) >= 2:
                out.append(a)
            else:
                todo.append((a, depth + 1))
    return out


VIEW_OPS = ("prims.reshape", "prims.permute", "prims.slice")


def _viewed_cats(x: Value) -> list[Value]:
    """The channel concatenations `x` is a view of (ShuffleNet: a channel shuffle and a
    chunk, `reshape -> permute -> reshape -> slice`, after each block's concatenation), and
    those their pieces are views of in turn, up to ROOT_DEPTH nodes back. Lowered as written
    such a concatenation, where fusion stops inlining it into its readers, loops NCHW: a
    kernel gathering NHWC convolution outputs into an NCHW buffer, then a copy to NHWC for
    the convolution; computed channels-last, its readers take its channels contiguously."""
    out: list[Value] = []
    todo, seen = [(x, 0, False)], {x}
    while todo:
        v, depth, via_view = todo.pop()
        p = v.node
        if p is None or depth >= ROOT_DEPTH or len(p.results) != 1:
            continue
        if p.op in VIEW_OPS and isinstance(p.args[0], Value):
            nxt, view = [p.args[0]], True
        elif _channel_cat(p):
            if via_view:
                out.append(v)
            nxt, view = [a for a in p.args[0] if isinstance(a, Value)], False  # type: ignore[union-attr]
        else:
            continue
        for a in nxt:
            if a not in seen:
                seen.add(a)
                todo.append((a, depth + 1, view))
    return out


def _permuted(v: Value, dims: list[int], at: Node, nodes: list[Node], names: set[str],
              result: Value | None = None) -> Value:
    """`prims.permute(v, dims=)` appended to `nodes` (result: a new value, or `result`)."""
    t = v.type
    assert isinstance(t, TensorType)
    out = result or Value(fresh_name(f"{v.name}.cl", names),
                          TensorType(t.dtype, tuple(t.shape[d] for d in dims), None, t.device))
    node = Node("prims.permute", [v], {"dims": dims}, [out], at.loc, at.pos)
    out.node = node
    nodes.append(node)
    return out


def _rewrite(g: Graph) -> None:
    epis = conv_epilogues(g)
    at: dict[int, Node] = {}  # id(the node a fused convolution replaces) -> that convolution
    drop: set[int] = set()
    for n in g.nodes:
        if n.op != "prims.convolution" or not isinstance(n.args[0], Value):
            continue
        xt, t = n.args[0].type, n.results[0].type
        if not isinstance(xt, TensorType) or not isinstance(t, TensorType) \
                or not _nhwc_ok(xt, t):
            continue
        epi = epis.get(n)
        last = epi.last if epi is not None else n
        steps = epi.steps if epi is not None else []
        kw: dict[str, Arg] = {"steps": [op for op, _ in steps],
                              "relu": epi.relu if epi is not None else False,
                              **n.kwargs}
        if epi is not None and epi.relu_max is not None:  # ReLU6: clamp(y, 0, relu_max)
            kw["relu_max"] = epi.relu_max
        if epi is not None and epi.silu:
            kw["silu"] = True
        if epi is not None and epi.hardswish:
            kw["hardswish"] = True
        res = [epi.residual] if epi is not None and epi.residual is not None else []
        if res:
            kw["residual"] = True
        fused = Node(CONV_OP, [n.args[0], n.args[1], *(u for _, u in steps), *res], kw,
                     list(last.results), n.loc, n.pos)
        for r in fused.results:
            r.node = fused
        at[id(last)] = fused
        drop.update(id(m) for m in [n, *(epi.chain if epi is not None else [])])
    if at:
        g.nodes = [at.get(id(n), n) for n in g.nodes if id(n) in at or id(n) not in drop]


# ---- the op: type rule and reference ------------------------------------------------------------

def _steps(args: Sequence[Any], kw: Mapping[str, Any]) -> list[str]:
    steps = kw.get("steps", [])
    res = kw.get("residual", False)
    if not isinstance(steps, list) or not all(s in AFFINE_OPS for s in steps) \
            or res.__class__ is not bool or len(args) != 2 + len(steps) + res:
        raise OpTypeError(f"{CONV_OP} takes x, a weight, one operand per step, then the "
                          f"residual if residual=true; steps= must list "
                          f"{', '.join(AFFINE_OPS)}")
    return steps


def _parts(args: Sequence[Any], kw: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], Any]:
    """The (step, operand) pairs and the residual (None without residual=true)."""
    steps = _steps(args, kw)
    ops = list(zip(steps, args[2:2 + len(steps)], strict=True))
    return ops, (args[-1] if kw.get("residual") else None)


def _infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    _steps(args, kw)
    conv = ctx.registry.lookup("prims.convolution") if ctx.registry else None
    assert conv is not None
    t = conv.infer(ctx, list(args[:2]), {k: v for k, v in kw.items() if k not in _OWN_KW})[0]
    assert isinstance(t, TensorType)
    ops, res = _parts(args, kw)
    if res is not None and (not isinstance(res, Value) or res.type != t):
        raise OpTypeError(f"{CONV_OP}: the residual has the result's type")
    for _, u in ops:
        if isinstance(u, (int, float)) and not isinstance(u, bool):
            continue
        if not isinstance(u, Value) or not isinstance(u.type, TensorType) \
                or list(u.type.shape) != [t.shape[1]] or u.type.dtype != t.dtype:
            raise OpTypeError(f"{CONV_OP}: an epilogue operand is a number or a "
                              f"{t.dtype.name}[{t.shape[1]}] vector (one value per channel)")
    if not isinstance(kw.get("relu", False), bool):
        raise OpTypeError(f"{CONV_OP}: relu= is true or false")
    relu_max(kw, CONV_OP)
    silu(kw, CONV_OP)
    hardswish(kw, CONV_OP)
    return [t]


def silu(kw: Mapping[str, Any], op: str) -> bool:
    """`silu=true`: the result is y / (1 + exp(-y)) (never with relu=true)."""
    s = kw.get("silu", False)
    if s.__class__ is not bool or (s and kw.get("relu")):
        raise OpTypeError(f"{op}: silu= is true or false, and not with relu=true")
    return bool(s)


def hardswish(kw: Mapping[str, Any], op: str) -> bool:
    """`hardswish=true`: the result is y * min(max(y + 3, 0), 6) / 6 (never with relu=true
    or silu=true)."""
    s = kw.get("hardswish", False)
    if s.__class__ is not bool or (s and (kw.get("relu") or kw.get("silu"))):
        raise OpTypeError(f"{op}: hardswish= is true or false, and not with relu= or silu=")
    return bool(s)


def relu_max(kw: Mapping[str, Any], op: str) -> float | None:
    """The `relu_max=` bound (ReLU6: the result is clamp(y, 0, relu_max)), or None; it needs
    relu=true and is a number >= 0."""
    c = kw.get("relu_max")
    if c is None:
        return None
    if not isinstance(c, (int, float)) or isinstance(c, bool) or not c >= 0 \
            or kw.get("relu") is not True:
        raise OpTypeError(f"{op}: relu_max= is a number >= 0, with relu=true")
    return float(c)


def _run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    x, w = args[:2]
    steps, residual = _parts(args, kw)
    conv = interp.registry.lookup("prims.convolution")
    assert conv is not None
    y = conv.reference(interp, [x, w], {k: v for k, v in kw.items() if k not in _OWN_KW})
    for step, u in steps:
        u = u[:, None, None] if isinstance(u, torch.Tensor) else u
        fn: Any = {"prims.add": torch.add, "prims.sub": torch.sub, "prims.mul": torch.mul,
                   "prims.div": torch.div}[step]
        y = fn(y, u)
    hi = relu_max(kw, CONV_OP)
    if hi is not None:
        return torch.clamp(y, 0.0, hi)  # keeps NaN, as max(., 0) then min(., hi) do
    if silu(kw, CONV_OP):
        return torch.nn.functional.silu(y)
    if hardswish(kw, CONV_OP):
        return torch.nn.functional.hardswish(y)
    return torch.relu(y) if kw.get("relu") else y


CONV_OPDEF = OpDef(CONV_OP, "a 2-d convolution followed by per-channel steps y = y <op> "
                   "operand (steps=[...], one operand each: a [C] vector or a number) and "
                   "relu=; the CPU target lowers it channels-last (conv-nhwc writes it)",
                   _infer, _run, aliasing="fresh")
if default_registry().lookup(CONV_OP) is None:
    default_registry().register(CONV_OPDEF)


# ---- the lowering rule ---------------------------------------------------------------------------

def lower_conv2d(lw: _Lowering, n: Node) -> None:
    """`loop.conv2d` channels-last (module docstring): the NHWC input buffer, weight * A and
    bias B of the folded steps, `loop.extern(op="loop.conv2d_nhwc")`, a permuted view."""
    x, xt = _x(n)
    w = n.args[1]
    t = n.results[0].type
    assert isinstance(t, TensorType) and isinstance(w, Value)
    if not _nhwc_ok(xt, t):  # written by hand: the op's own implementation
        lw.passthrough(n, n.op)
        return
    i = [ivar(k) for k in range(4)]
    nhwc = TensorType(xt.dtype, (xt.shape[0], xt.shape[2], xt.shape[3], xt.shape[1]), None,
                      xt.device)
    src, idx = lw.index_of(x, [i[0], i[3], i[1], i[2]], _ranges(nhwc.shape))
    if isinstance(src.type, TensorType) and list(src.type.shape) == list(nhwc.shape) \
            and idx == i:
        xb = src  # already an NHWC buffer (the previous convolution's result)
    else:
        xb = lw.materialize_view(View(src, tuple(idx), nhwc), f"{x.name}.nhwc")
        _share_nhwc(lw, x, xb)
    res = n.results[0]
    lw.b.taken.discard(f"{res.name}.nhwc")
    if _packable(lw, w):
        _lower_packed(lw, n, xb, w, t)
        return
    args: list[Arg] = [xb, lw.extern_operand(w)]
    kw: dict[str, Arg] = {"op": "loop.conv2d_nhwc",
                          **{k: v for k, v in n.kwargs.items() if k not in _OWN_KW}}
    steps, residual = _parts(n.args, n.kwargs)
    if steps:
        args = _fold_epilogue(lw, res.name, steps, args, int(t.shape[1]))
    # done by _relu_nhwc (with the residual add), never by oneDNN's post-op
    act = "silu" if silu(n.kwargs, CONV_OP) else \
        "hardswish" if hardswish(n.kwargs, CONV_OP) else ""
    relu = bool(n.kwargs.get("relu")) or bool(act) or residual is not None
    ot = TensorType(t.dtype, (t.shape[0], t.shape[2], t.shape[3], t.shape[1]), None, t.device)
    out = lw.b.emit("loop.extern", args, kw, types=[ot],
                    names=[f"{res.name}.conv" if relu else f"{res.name}.nhwc"], loc=n.loc)[0]
    if relu:
        out = _relu_nhwc(lw, out, ot, f"{res.name}.nhwc", relu_max(n.kwargs, CONV_OP),
                         act, residual, bool(n.kwargs.get("relu")))
    lw.env[res] = View(out, (i[0], i[2], i[3], i[1]), t)


def _share_nhwc(lw: _Lowering, x: Value, xb: Value) -> None:
    """Where several convolutions read `x` (a ShuffleNet block's two branches on its
    shuffled input), `x` becomes the NHWC copy `xb` just made, permuted: the next one takes
    that buffer as it is, where it made a second copy of its own."""
    xt = x.type
    assert isinstance(xt, TensorType)
    if sum(m.op == CONV_OP and m.args[0] is x for m in lw.readers(x)) > 1:
        i = [ivar(k) for k in range(4)]
        lw.env[x] = View(xb, (i[0], i[2], i[3], i[1]), xt)


def _packable(lw: _Lowering, w: Value) -> bool:
    """The weight is a graph input as it is (a parameter, not a value computed per call)."""
    return w in lw.g.params and lw.env.get(w, w) is w


def _lower_packed(lw: _Lowering, n: Node, xb: Value, w: Value, t: TensorType) -> None:
    """A weight that is a graph input (a parameter): `loop.conv2d_packed` (packed.py) on the
    raw weight, with the steps' scale A and shift B as [C] kernels; oneDNN's packed, scaled
    weight is cached across calls. ReLU runs in place inside the extern where another
    convolution reads the result (it reads the NHWC buffer as it is: no kernel to fuse it
    into, and other readers read that buffer too), and SiLU or hardswish also where several
    nodes read it; otherwise it stays a kernel that fuses into the pointwise reader."""
    res = n.results[0]
    steps, residual = _parts(n.args, n.kwargs)
    channels = int(t.shape[1])
    scale = any(op in ("prims.mul", "prims.div") for op, _ in steps)
    shift = any(op in ("prims.add", "prims.sub") for op, _ in steps)
    act = "silu" if silu(n.kwargs, CONV_OP) else \
        "hardswish" if hardswish(n.kwargs, CONV_OP) else ""
    relu = bool(n.kwargs.get("relu")) or bool(act)
    readers = lw.readers(res)
    # a SiLU or hardswish read by several nodes (a squeeze-excitation's pool and its scale)
    # runs in place once too: in their kernels each reader would recompute its exp (fuse's rule 5)
    # a ReLU that a convolution reads as its input is a whole NHWC buffer anyway, whoever else
    # reads it (a ghost module's primary output: its cheap convolution and its concatenation):
    # in place, where a kernel would write a second buffer
    inside = relu and res not in lw.g.outputs and bool(readers) \
        and (any(m.op == CONV_OP and m.args[0] is res and res not in m.args[1:]
                 for m in readers) or (bool(act) and len(readers) > 1))
    args: list[Arg] = [xb, w]
    if scale:
        args.append(_affine(lw, res.name, steps, channels, "a"))
    if shift and len(steps) == 1 and steps[0][0] == "prims.add" \
            and isinstance(steps[0][1], Value):  # a conv's own bias: no kernel to copy it
        args.append(lw.extern_operand(steps[0][1]))
    elif shift:
        args.append(_affine(lw, res.name, steps, channels, "b"))
    kw: dict[str, Arg] = {"op": PACKED_OP, "scale": scale, "bias": shift, "relu": inside,
                          **{k: v for k, v in n.kwargs.items() if k not in _OWN_KW}}
    if isinstance(residual, Value):  # added by oneDNN as it writes the result
        args.append(xb if residual is n.args[0]  # conv(x) + x: the NHWC x it already has
                    else _nhwc_buffer(lw, residual, f"{residual.name}.nhwc"))
        kw["residual"] = True
    hi = relu_max(n.kwargs, CONV_OP)
    if inside and hi is not None:  # ReLU6 in place too (torch.clamp_, NaN kept)
        kw["relu_max"] = hi
    if act:  # SiLU / hardswish in place inside (torch's own), else the prims in a kernel
        kw["relu"] = False
        kw[act] = inside
    ot = TensorType(t.dtype, (t.shape[0], t.shape[2], t.shape[3], t.shape[1]), None, t.device)
    separate = relu and not inside
    out = lw.b.emit("loop.extern", args, kw, types=[ot],
                    names=[f"{res.name}.conv" if separate else f"{res.name}.nhwc"],
                    loc=n.loc)[0]
    if separate:
        out = _relu_nhwc(lw, out, ot, f"{res.name}.nhwc", hi, act)
    i = [ivar(k) for k in range(4)]
    lw.env[res] = View(out, (i[0], i[2], i[3], i[1]), t)


def _nhwc_buffer(lw: _Lowering, v: Value, name: str) -> Value:
    """An NHWC buffer holding the [N, C, H, W] value `v`: the buffer it already is a permuted
    view of (a convolution's result, a channels-last residual), else a copy."""
    vt = v.type
    assert isinstance(vt, TensorType)
    i = [ivar(k) for k in range(4)]
    nhwc = TensorType(vt.dtype, (vt.shape[0], vt.shape[2], vt.shape[3], vt.shape[1]), None,
                      vt.device)
    src, idx = lw.index_of(v, [i[0], i[3], i[1], i[2]], _ranges(nhwc.shape))
    if isinstance(src.type, TensorType) and list(src.type.shape) == list(nhwc.shape) \
            and idx == i:
        return src
    return lw.materialize_view(View(src, tuple(idx), nhwc), name)


def _relu_nhwc(lw: _Lowering, y: Value, t: TensorType, name: str, hi: float | None = None,
               act: str = "", residual: Any = None, relu: bool = True) -> Value:
    """ReLU (then min(., hi) where hi is given: ReLU6) of the NHWC result by ember's own
    kernel, not oneDNN's post-op: that one computes max(y, 0) with NaN mapped to 0, where
    torch.relu(NaN) is NaN (BatchNorm with a negative running variance). prims.maximum and
    prims.minimum render NaN-propagating; a pointwise consumer fuses the kernel. With
    act="silu", SiLU instead: y / (1 + exp(-y)), as the prims wrote it; act="hardswish":
    y * min(max(y + 3, 0), 6) / 6, as the decomposition wrote it. A residual ([N, C, H, W]
    value) is added first; relu=False: no activation after it."""
    bb = BodyBuilder(lw.m, fresh_body_name(lw.m, lw.g.name, lw.taken))
    i = [ivar(k) for k in range(4)]
    v = bb.load(y, i)
    if isinstance(residual, Value):
        buf, idx = lw.index_of(residual, [i[0], i[3], i[1], i[2]], _ranges(t.shape))
        v = bb.b.op("prims.add", [v, bb.load(buf, idx)], {}, name=f"{name}.sum")
        if not relu and not act:
            return lw.kernel("loop.pointwise", bb, v, {"ranges": list(t.shape)}, t, name)
    if act == "hardswish":
        g = bb.b.op("prims.maximum", [bb.b.op("prims.add", [v, 3.0], {}, name=f"{name}.p3"),
                                      0.0], {}, name=f"{name}.lo")
        g = bb.b.op("prims.minimum", [g, 6.0], {}, name=f"{name}.gate")
        r = bb.b.op("prims.div", [bb.b.op("prims.mul", [v, g], {}, name=f"{name}.prod"), 6.0],
                    {}, name=name)
        return lw.kernel("loop.pointwise", bb, r, {"ranges": list(t.shape)}, t, name)
    if act == "silu":
        e = bb.b.op("prims.exp", [bb.b.op("prims.neg", [v], {}, name=f"{name}.neg")], {},
                    name=f"{name}.exp")
        d = bb.b.op("prims.add", [1.0, e], {}, name=f"{name}.den")
        return lw.kernel("loop.pointwise", bb, bb.b.op("prims.div", [v, d], {}, name=name),
                         {"ranges": list(t.shape)}, t, name)
    r = bb.b.op("prims.maximum", [v, 0.0], {}, name=name if hi is None else f"{name}.relu")
    if hi is not None:
        r = bb.b.op("prims.minimum", [r, hi], {}, name=name)
    return lw.kernel("loop.pointwise", bb, r, {"ranges": list(t.shape)}, t, name)


def _fold_epilogue(lw: _Lowering, name: str, steps: list[tuple[str, Arg]],
                   args: list[Arg], channels: int) -> list[Arg]:
    """The folded convolution's operands: weight * A (per output channel), bias B."""
    scales = any(op in ("prims.mul", "prims.div") for op, _ in steps)
    shifts = any(op in ("prims.add", "prims.sub") for op, _ in steps)

    def affine(which: str) -> Value:
        return _affine(lw, name, steps, channels, which)
    x, w = args
    if scales:  # the weight scaled per output channel, every call
        assert isinstance(w, Value) and isinstance(w.type, TensorType)
        scale = affine("a")
        bb = BodyBuilder(lw.m, fresh_body_name(lw.m, lw.g.name, lw.taken))
        wl = bb.load(w, [ivar(k) for k in range(w.type.rank)])
        sl = bb.load(scale, [ivar(0)])
        wt = TensorType(w.type.dtype, w.type.shape, None, w.type.device)
        w = lw.kernel("loop.pointwise", bb, bb.b.op("prims.mul", [wl, sl], {},
                                                    name=f"{name}.w"),
                      {"ranges": list(wt.shape)}, wt, f"{name}.w")
    return [x, w, affine("b")] if shifts else [x, w]


def _affine(lw: _Lowering, name: str, steps: list[tuple[str, Arg]], channels: int,
            which: str) -> Value:
    """A kernel over the channels computing A (which="a") or B of y = conv * A + B."""
    bb = BodyBuilder(lw.m, fresh_body_name(lw.m, lw.g.name, lw.taken))
    a: Any = 1.0
    b: Any = 0.0
    for op, u in steps:
        if isinstance(u, Value):
            buf, idx = lw.index_of(u, [ivar(0)], {ivar(0): channels})
            u = bb.load(buf, idx)
        elif isinstance(u, int):
            u = float(u)  # as epilogue.py reads a number operand

        def full(v: Any, u: Any, which: str) -> Any:
            """An f32 value for a number where the step's operand is a number too (prims
            take one tensor operand at least: conv + 1.0 as the first step)."""
            if isinstance(v, Value) or isinstance(u, Value):
                return v
            return bb.b.op("prims.full", [], {"shape": [], "value": v, "dtype": DType.f32,
                                              "device": "cpu"}, name=f"{name}.{which}0")
        if op in ("prims.add", "prims.sub"):
            b = bb.b.op(op, [full(b, u, "b"), u], {}, name=f"{name}.b")
        else:
            a = bb.b.op(op, [full(a, u, "a"), u], {}, name=f"{name}.a")
            b = bb.b.op(op, [full(b, u, "b"), u], {}, name=f"{name}.b")
    v = a if which == "a" else b
    if not isinstance(v, Value):
        v = bb.b.op("prims.full", [], {"shape": [], "value": v, "dtype": DType.f32,
                                       "device": "cpu"}, name=f"{name}.{which}")
    return lw.kernel("loop.pointwise", bb, v, {"ranges": [channels]},
                     TensorType(DType.f32, (channels,)), f"{name}.{which}")


__all__ = ["CONV_OP", "conv_nhwc", "lower_conv2d"]
