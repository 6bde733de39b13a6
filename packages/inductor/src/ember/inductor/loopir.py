"""The `loop` dialect: ember's loop-level IR, as ir-v1 text.

A lowered graph computes every buffer with one of three ops (a `pointwise` body may return
several values: one kernel computing several buffers over the same domain, see fuse):

    %y = loop.pointwise(@f_k0, %x, %b, ranges=[4, 8]) : f32[4, 8]
    %s = loop.reduction(@f_k1, %y, ranges=[4], reduce_ranges=[8], reduction="sum") : f32[4]
    %m = loop.extern(%a, %w, op="prims.matmul") : f32[4, 16]

The first argument of `pointwise`/`reduction` names the kernel's body: a graph of the same module
whose parameters are the buffers it reads and whose one result is the value of one element, as a
0-dim tensor. Inside a body, `loop.load(%x, index=[i0, i1 * 2])` reads one element (one index
expression per dim of `%x`, see `indexing.py`; ir-v1.0 text writes each as a STRING,
`index=["i0", "i1 * 2"]`, which still reads), `loop.index(index=i0 + 1)` is an index as an i64
value (on `device=`, the kernel's; cpu by default), and every other node is an elementwise prim
on 0-dim values (`prims.add`, `prims.where`, `prims.convert_element_type`, `prims.full(shape=[], ...)`). Reductions combine the body's value
over `reduce_ranges` (variables r0, r1, ...) with `reduction` = sum, prod, amax, amin, argmax or
argmin (argmax/argmin over one reduced dim; i64 result). Inside a pointwise body,
`loop.reduce(@body, %bufs..., ranges=[outer], reduce_ranges=, reduction=)` is a reduction fused
into it by `fuse`: its value at the body's first len(ranges) loop variables.

A body declares its loops (ir-v1.1): `graph @f_k0(%x: f32[4, 8]) -> (f32[]) domain(i0 < 4,
r0 < 8)`. loop.load's type rule proves that each index uses only the domain's variables and stays
inside its buffer over the domain, and each kernel (`loop.pointwise`, `loop.reduction`,
`loop.reduce`) that runs a body checks it runs it over exactly that domain. For a body without a
domain (ir-v1.0 text) the kernel's type rule proves the same for every load of its body and of
its fused reductions' bodies, with the extents it binds (`bounds.py`): the C++ code reads at
those indices unchecked, so the verifier refuses any it cannot prove.

Every op has a type rule and a reference (bodies are evaluated vectorised over the whole iteration
domain with the prims' references), so the interpreter runs loop IR with the numbers of the prims
graph it came from.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sympy
import torch

from ember.inductor.bounds import (
    check_index,
    check_kernel,
    index_violation,
    reduce_extents,
    symbol_ranges,
)
from ember.inductor.indexing import (
    IndexParseError,
    affine_view,
    clip,
    eval_index,
    index_text,
    parse_index,
)
from ember.inductor.schedule import check_schedule_attrs
from ember.ir import (
    Arg,
    DType,
    Graph,
    InferContext,
    OpDef,
    OpRegistry,
    OpTypeError,
    Ref,
    TensorType,
    Type,
    Value,
)
from ember.ir.expr import ExprEvalError, evaluate, loop_var_names
from ember.ir.interpreter import bind_symbols
from ember.ir.verifier import types_equal

if TYPE_CHECKING:
    from ember.ir.interpreter import Interpreter

REDUCTIONS = ("sum", "prod", "amax", "amin", "argmax", "argmin")


def body_of(module: Any, ref: Any, op: str) -> Graph:
    if not isinstance(ref, Ref):
        raise OpTypeError(f"{op} takes the body @graph as its first argument")
    if module is None:
        raise OpTypeError(f"{op} needs its module to find the body @{ref.name}")
    g = module.items.get(ref.name)
    if not isinstance(g, Graph):
        raise OpTypeError(f"{op}: @{ref.name} is not a graph of this module")
    return g


def _dims(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list) or any(isinstance(d, sympy.Expr) and loop_var_names(d)
                                      for d in v):
        raise OpTypeError(f"{what} must be a list of sizes (over size symbols)")
    return v


def _is_index(s: Any) -> bool:
    """An index argument: an expression (ir-v1.1) or its text in a STRING (ir-v1.0)."""
    return isinstance(s, (str, sympy.Expr)) or (isinstance(s, int) and not isinstance(s, bool))


def _check_body(op: str, g: Graph, args: Sequence[Arg], multi: bool = False) -> TensorType:
    if len(args) != len(g.params):
        raise OpTypeError(f"{op}: body @{g.name} reads {len(g.params)} buffers, got {len(args)}")
    for i, (a, p) in enumerate(zip(args, g.params, strict=True)):
        if not isinstance(a, Value) or not types_equal(_unstrided(a.type), p.type):
            have = a.type if isinstance(a, Value) else a
            raise OpTypeError(f"{op}: buffer {i} is {have}, body @{g.name} reads %{p.name}: "
                              f"{p.type}")
    if not (len(g.result_types) == 1 or (multi and g.result_types)) \
            or not all(isinstance(t, TensorType) and t.rank == 0 for t in g.result_types):
        raise OpTypeError(f"{op}: body @{g.name} must return "
                          f"{'0-dim values' if multi else 'one 0-dim value'}")
    assert isinstance(g.result_types[0], TensorType)
    return g.result_types[0]


def _unstrided(t: Type) -> Type:
    return TensorType(t.dtype, t.shape, None, t.device) if isinstance(t, TensorType) else t


def _pointwise_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]
                     ) -> list[Type]:
    op = "loop.pointwise"
    g = body_of(ctx.module, args[0] if args else None, op)
    _check_body(op, g, args[1:], multi=True)
    ranges = _dims(kw.get("ranges"), f"{op} ranges=")
    check_kernel(ctx.module, op, g, ranges, ())  # every load inside its buffer
    check_schedule_attrs(op, kw, len(ranges))  # the schedule stage's attributes
    return [TensorType(t.dtype, tuple(ranges), None, t.device) for t in g.result_types
            if isinstance(t, TensorType)]


def _reduction_types(op: str, ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg],
                     keep_outer: bool) -> list[Type]:
    """Type rule shared by loop.reduction (a buffer over `ranges`) and loop.reduce (one value
    per outer index, inside a pointwise body)."""
    g = body_of(ctx.module, args[0] if args else None, op)
    elem = _check_body(op, g, args[1:])
    ranges = _dims(kw.get("ranges"), f"{op} ranges=")
    red = _dims(kw.get("reduce_ranges"), f"{op} reduce_ranges=")
    kind = kw.get("reduction")
    if kind not in REDUCTIONS:
        raise OpTypeError(f"{op}: reduction= must be one of {', '.join(REDUCTIONS)}")
    if keep_outer:  # a loop.reduce is checked with the kernel that holds it (its extents)
        check_kernel(ctx.module, op, g, ranges, red)
        check_schedule_attrs(op, kw, len(ranges))
    elif ctx.graph is not None and ctx.graph.domain is not None and ctx.node is not None:
        # ... or, in a body that declares its domain, here: over the enclosing loops
        outer, inner = reduce_extents(ctx.node, list(ctx.graph.domain.values()),
                                      f"body @{ctx.graph.name}")
        check_kernel(ctx.module, op, g, outer, inner)
    shape = tuple(ranges) if keep_outer else ()
    if kind in ("argmax", "argmin"):
        if len(red) != 1:
            raise OpTypeError(f"{op}: {kind} reduces exactly one dim")
        return [TensorType(DType.i64, shape, None, elem.device)]
    return [TensorType(elem.dtype, shape, None, elem.device)]


def _reduction_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]
                     ) -> list[Type]:
    return _reduction_types("loop.reduction", ctx, args, kw, keep_outer=True)


def _reduce_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    return _reduction_types("loop.reduce", ctx, args, kw, keep_outer=False)


def _load_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    if len(args) != 1 or not isinstance(args[0], Value) \
            or not isinstance(args[0].type, TensorType):
        raise OpTypeError("loop.load takes one buffer")
    t = args[0].type
    index = kw.get("index")
    if not isinstance(index, list) or len(index) != t.rank or not all(map(_is_index, index)):
        raise OpTypeError(f"loop.load: index= must list {t.rank} index expressions")
    for s in index:
        try:
            parse_index(s)
        except IndexParseError as e:
            raise OpTypeError(f"loop.load: {e}") from None
    _check_in_domain(ctx)
    return [TensorType(t.dtype, (), None, t.device)]


def _check_in_domain(ctx: InferContext) -> None:
    """In a body that declares its domain (ir-v1.1), the node's indices are proved here."""
    if ctx.graph is not None and ctx.graph.domain is not None and ctx.node is not None:
        check_index(ctx.module, ctx.graph, ctx.node)


def _index_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    index = kw.get("index")
    device = kw.get("device", "cpu")
    if args or not _is_index(index) or not isinstance(device, str):
        raise OpTypeError("loop.index takes index= (one index expression) and an optional "
                          "device= (a device string) only")
    try:
        parse_index(index)
    except IndexParseError as e:
        raise OpTypeError(f"loop.index: {e}") from None
    _check_in_domain(ctx)
    # the kernel's device: elementwise prims refuse operands of mixed devices
    return [TensorType(DType.i64, (), None, device)]


def _extern_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    name = kw.get("op")
    reg = ctx.registry
    target = reg.lookup(name) if isinstance(name, str) and reg is not None else None
    if target is None or name in ("loop.extern",):
        raise OpTypeError(f"loop.extern: op= must name a registered op, got {name!r}")
    rest = {k: v for k, v in kw.items() if k != "op"}
    return target.infer(ctx, args, rest)


@functools.lru_cache(maxsize=4096)
def _affine(index: tuple[Any, ...], rank: int) -> Any:
    """Parsed once per distinct view (the wrapper calls loop.view's reference every call)."""
    try:
        return affine_view([parse_index(s) for s in index], rank)
    except IndexParseError as e:
        raise OpTypeError(f"loop.view: {e}") from None


def view_index(args: Sequence[Any], kw: Mapping[str, Any],
               syms: Mapping[str, Any] | None = None) -> tuple[list[Any], Any]:
    """loop.view's checked attributes: (shape, (offsets, coefficients)); every index of the
    view must fall inside the buffer: proved over the symbols' ranges `syms` (the verifier),
    or with concrete sizes only (`syms` None: at run time, where torch checks the rest)."""
    x = args[0] if len(args) == 1 else None
    xshape = list(x.type.shape) if isinstance(x, Value) and isinstance(x.type, TensorType) else \
        list(x.shape) if isinstance(x, torch.Tensor) else None
    if xshape is None:
        raise OpTypeError("loop.view takes one buffer")
    shape, index = kw.get("shape"), kw.get("index")
    if not isinstance(shape, list) or not isinstance(index, list) \
            or len(index) != len(xshape) or not all(map(_is_index, index)):
        raise OpTypeError(f"loop.view needs shape=[...] and index= with {len(xshape)} index "
                          f"expressions")
    aff = _affine(tuple(index), len(shape))
    if aff is None:
        raise OpTypeError(f"loop.view: index {index} is not affine in i0..i{len(shape) - 1}")
    offsets, coefs = aff
    sizes = [*shape, *xshape]
    concrete = all(isinstance(d, int) for d in sizes)
    if (concrete or syms is not None) \
            and not any(isinstance(n, int) and n <= 0 for n in shape):  # empty: no element
        extents = {f"i{k}": n for k, n in enumerate(shape)}
        for d, n in enumerate(xshape):
            why = index_violation(index[d], n, extents, syms or {})
            if why is not None:
                raise OpTypeError(f"loop.view: index {clip(index_text(index[d]))!r} of dim {d} "
                                  f"{why}")
    return shape, aff


def _view_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    shape, _ = view_index(args, kw, symbol_ranges(ctx.module))
    t = args[0].type  # type: ignore[union-attr]
    assert isinstance(t, TensorType)
    return [TensorType(t.dtype, tuple(shape), None, t.device)]


def _view_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    x = args[0]
    shape, (offsets, coefs) = view_index(args, kw)
    shape = [int(d) for d in shape]
    st = x.stride()
    strides = [sum(coefs[d][k] * st[d] for d in range(x.dim())) for k in range(len(shape))]
    off = x.storage_offset() + sum(o * s for o, s in zip(offsets, st))
    return x.as_strided(shape, strides, off)


def _nchw(t: TensorType) -> TensorType:
    n, h, w, c = t.shape
    return TensorType(t.dtype, (n, c, h, w), None, t.device)


def _conv_nhwc_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]
                     ) -> list[Type]:
    x = args[0] if len(args) in (2, 3) else None
    if not isinstance(x, Value) or not isinstance(x.type, TensorType) or x.type.rank != 4:
        raise OpTypeError("loop.conv2d_nhwc takes an NHWC input, an OIHW weight and an "
                          "optional bias")
    conv = ctx.registry.lookup("prims.convolution") if ctx.registry else None
    assert conv is not None
    t = conv.infer(ctx, [Value(x.name, _nchw(x.type)), args[1]],
                   {k: v for k, v in kw.items() if k != "relu"})[0]
    b = args[2] if len(args) == 3 else None
    if b is not None and not (isinstance(b, Value) and isinstance(b.type, TensorType)
                              and list(b.type.shape) == [t.shape[1]]):  # type: ignore[union-attr]
        raise OpTypeError("loop.conv2d_nhwc: the bias has one value per output channel")
    assert isinstance(t, TensorType)
    n, c, h, w = t.shape
    return [TensorType(t.dtype, (n, h, w, c), None, t.device)]


def _conv_nhwc_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    """oneDNN's channels-last convolution (much faster on CPU than NCHW): the input is an NHWC
    buffer seen as NCHW with channels-last strides, the result comes back NHWC."""
    x, w, *bias = args
    b = bias[0] if bias else None
    xc, wc = x.permute(0, 3, 1, 2), w.contiguous(memory_format=torch.channels_last)
    groups = kw.get("groups", 1)
    fused = getattr(torch.ops.mkldnn, "_convolution_pointwise", None) if x.dtype == torch.float32 \
        and x.device.type == "cpu" and torch.backends.mkldnn.is_available() else None
    if fused is not None:  # bias applied by oneDNN as it writes (a post-op)
        # not its ReLU post-op: that maps NaN to 0, torch.relu keeps NaN
        y = fused(xc, wc, b, kw["padding"], kw["stride"], kw["dilation"], groups,
                  "none", [], "")
        y = torch.relu_(y) if kw.get("relu") else y
    else:
        y = torch.convolution(xc, wc, b, kw["stride"], kw["padding"], kw["dilation"], False,
                              [0, 0], groups)
        y = torch.relu(y) if kw.get("relu") else y
    return y.permute(0, 2, 3, 1).contiguous()


def _index_select_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]
                        ) -> list[Type]:
    x, idx = (args[0], args[1]) if len(args) == 2 else (None, None)
    d = kw.get("dim")
    if not isinstance(x, Value) or not isinstance(x.type, TensorType) \
            or not isinstance(idx, Value) or not isinstance(idx.type, TensorType) \
            or idx.type.rank != 1 or idx.type.dtype not in (DType.i64, DType.i32) \
            or not isinstance(d, int) or not 0 <= d < x.type.rank:
        raise OpTypeError("loop.index_select takes a tensor, 1-d integer ids and dim=")
    shape = list(x.type.shape)
    shape[d] = idx.type.shape[0]
    return [TensorType(x.type.dtype, tuple(shape), None, x.type.device)]


def _index_select_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    return torch.index_select(args[0], int(kw["dim"]), args[1])


# ---- references ------------------------------------------------------------------------------

def eval_body(interp: Interpreter, g: Graph, bufs: Sequence[Any], ranges: Sequence[int],
              reduce_ranges: Sequence[int] = (), all_outputs: bool = False,
              sizes: Mapping[str, int] | None = None) -> Any:
    """The body's value at every point of the domain `ranges + reduce_ranges`, as one tensor
    (`all_outputs`: the list of every result's values). Size symbols are bound from the
    buffers' shapes (and `sizes`, the enclosing body's bindings): fused reductions' symbolic
    `reduce_ranges` are evaluated with them."""
    domain = list(ranges) + list(reduce_ranges)
    # The running graph's bindings first: a body may use a symbol its buffers do not carry
    # (a mean's `prims.div(%sum, s1)` over a buffer of shape [s0]).
    syms: dict[str, int] = dict(getattr(interp, "env", None) or {})
    syms.update(sizes or {})
    if bufs:
        syms.update(bind_symbols(g, bufs))
    env: dict[str, Any] = dict(syms)
    n = len(domain)
    for k, size in enumerate(domain):
        view = [1] * n
        view[k] = size
        idx = torch.arange(size, dtype=torch.int64).reshape(view)
        env[f"i{k}" if k < len(ranges) else f"r{k - len(ranges)}"] = idx
    values: dict[Value, Any] = dict(zip(g.params, bufs, strict=True))
    for node in g.nodes:
        if node.op == "loop.load":
            buf = values[node.args[0]]  # type: ignore[index]
            idx = [eval_index(parse_index(s), env) for s in node.kwargs["index"]]  # type: ignore
            out = buf[tuple(idx)] if idx else buf
            out = out.expand(domain) if n else out
        elif node.op == "loop.reduce":
            sub = body_of(interp.module, node.args[0], "loop.reduce")
            k = len(node.kwargs["ranges"])  # type: ignore[arg-type]
            try:
                red = [evaluate(r, syms)
                       for r in node.kwargs["reduce_ranges"]]  # type: ignore[union-attr]
            except ExprEvalError as e:
                raise OpTypeError(f"loop.reduce in @{g.name}: reduce_ranges: {e}") from None
            v = eval_body(interp, sub, [values[a] for a in node.args[1:]],  # type: ignore[index]
                          domain[:k], red, sizes=syms)
            v = reduce_last(v.reshape(domain[:k] + [math.prod(red)]), str(node.kwargs["reduction"]))
            out = v.reshape(domain[:k] + [1] * (n - k)).expand(domain)
        elif node.op == "loop.index":
            out = torch.as_tensor(eval_index(parse_index(node.kwargs["index"]), env),
                                  dtype=torch.int64).expand(domain)
        else:
            op = interp.registry.lookup(node.op)
            if op is None:
                raise OpTypeError(f"loop body @{g.name}: unknown op {node.op}")

            def bind(a: Any) -> Any:
                if isinstance(a, Value):
                    return values[a]
                if isinstance(a, list):
                    return [bind(x) for x in a]
                if isinstance(a, sympy.Expr):  # a size used as a value: its int, as the C++ has
                    return evaluate(a, syms)
                return a
            try:
                args = [bind(a) for a in node.args]
                kwargs = {k: bind(v) for k, v in node.kwargs.items()}
            except ExprEvalError as e:
                raise OpTypeError(f"{node.op} in @{g.name}: {e}") from None
            out = op.reference(interp, args, kwargs)
            if isinstance(out, torch.Tensor) and list(out.shape) != domain:
                out = out.expand(domain)
        values[node.results[0]] = out
    if all_outputs:
        return [values[o] for o in g.outputs]
    return values[g.outputs[0]]


def _pointwise_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    g = body_of(interp.module, args[0], "loop.pointwise")
    ranges = [int(r) for r in kw["ranges"]]
    outs = [v.contiguous() for v in eval_body(interp, g, args[1:], ranges, all_outputs=True)]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _reduction_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    g = body_of(interp.module, args[0], "loop.reduction")
    ranges = [int(r) for r in kw["ranges"]]
    red = [int(r) for r in kw["reduce_ranges"]]
    v = eval_body(interp, g, args[1:], ranges, red)
    return reduce_last(v.reshape(ranges + [math.prod(red)]), kw["reduction"])


def reduce_last(v: torch.Tensor, kind: str) -> torch.Tensor:
    """Reduce the last dim of `v` as `loop.reduction(reduction=kind)` does."""
    if kind == "sum":
        return torch.sum(v, -1, dtype=v.dtype)
    if kind == "prod":
        return torch.prod(v, -1, dtype=v.dtype)
    fn = {"amax": torch.amax, "amin": torch.amin, "argmax": torch.argmax,
          "argmin": torch.argmin}[kind]
    return fn(v, -1)


def _extern_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["op"])
    assert target is not None
    return target.reference(interp, args, {k: v for k, v in kw.items() if k != "op"})


def _no_direct_run(name: str) -> Any:
    def run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
        raise OpTypeError(f"{name} runs only inside a loop body (loop.pointwise/reduction)")
    return run


# aliasing= (a trait, see ember.ir.registry): "alias" where a result may share an operand's
# storage (a 0-d pointwise body that loads its operand returns it; an extern is its op's; ops
# that run only inside a body have no buffers to share, and say the safe answer).
LOOP_OPS = (
    OpDef("loop.pointwise", "a buffer computed elementwise by a body graph over index values",
          _pointwise_infer, _pointwise_run, aliasing="alias"),
    OpDef("loop.reduction", "a buffer reduced over reduce_ranges by a body graph",
          _reduction_infer, _reduction_run, aliasing="fresh"),
    OpDef("loop.reduce", "inside a body: a reduction over reduce_ranges by another body, "
          "once per index of the outer `ranges` (a reduction fused into its consumer)",
          _reduce_infer, _no_direct_run("loop.reduce"), aliasing="alias"),
    OpDef("loop.load", "inside a body: one element of a buffer at index expressions",
          _load_infer, _no_direct_run("loop.load"), aliasing="alias"),
    OpDef("loop.index", "inside a body: an index expression as an i64 value (on device=, "
          "cpu by default)",
          _index_infer, _no_direct_run("loop.index"), aliasing="alias"),
    OpDef("loop.extern", "a buffer computed by another op's implementation (matmul, sort, ...)",
          _extern_infer, _extern_run, aliasing="alias"),
    OpDef("loop.conv2d_nhwc", "a 2-d convolution (prims.convolution's attributes) of an NHWC "
          "buffer with an OIHW weight, an optional bias per output channel and relu=true|false; "
          "NHWC result (channels-last, an extern's op)",
          _conv_nhwc_infer, _conv_nhwc_run, aliasing="fresh"),
    OpDef("loop.index_select", "x's slices at 1-d integer ids along dim= (a gather whose "
          "index varies along dim only: an embedding lookup; an extern's op)",
          _index_select_infer, _index_select_run, aliasing="fresh"),
    OpDef("loop.view", "a strided view of a buffer: result[i] = x[index(i)], index affine "
          "(an extern's operand, never copied: loop.extern(%x, op=\"loop.view\", ...))",
          _view_infer, _view_run, aliasing="alias"),
)


def register_loop_ops(registry: OpRegistry) -> None:
    registry.register_missing(LOOP_OPS)
