"""Compiled modules: the `kernels` dialect, the `codegen-cpp` pass and the `inductor` backend.

`codegen-cpp` turns each loop kernel into a `kernel @name cpp` block (its source between triple
quotes) and its node into

    %y = kernels.call(@f_k0, %x, %b, out_dtypes=[f32], out_shapes=[[4, 8]]) : f32[4, 8]{8, 1}

(buffers with row-major strides; inputs are made contiguous before the call, outputs allocated
with torch.empty). `loop.extern` becomes `kernels.extern` (the prim's implementation through
Python, no libtorch headers). All `cpp` blocks of a module, in order, form one translation unit:
`@cpp_prelude` holds the helpers, each other block one `extern "C"` function named after it
(`sanitize.kernel_symbol`: `@f_k0` defines `ember_k_f_k0`). A
kernel the C++ tables cannot express yet keeps its `loop.pointwise`/`loop.reduction` node and body
(run by the reference), with the reason in `attrs(cpp_fallback=...)` of that body.
"""

from __future__ import annotations

import ctypes
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ember.inductor import buffers as _buffers  # noqa: F401  (registers plan-buffers)
from ember.inductor import cache
from ember.inductor.body import body_names
from ember.inductor.cpp import PRELUDE, CodegenError
from ember.inductor.cppkernel import kernel_source
from ember.inductor.indexing import affine_view, parse_index, row_major_strides
from ember.inductor.sanitize import kernel_symbol
from ember.ir import (
    Arg,
    DType,
    Graph,
    InferContext,
    Interpreter,
    Kernel,
    Module,
    Node,
    OpDef,
    OpRegistry,
    OpTypeError,
    Ref,
    RunResult,
    TensorType,
    Type,
    Value,
    default_registry,
)
from ember.ir.backends import Backend, Runner, default_backends
from ember.ir.expr import as_sympy, simplify_dim
from ember.ir.interpreter import eager_error
from ember.ir.passes import register_pass, register_pipeline, run_pipeline

PRELUDE_NAME = "cpp_prelude"
# The inductor's stages as named pipelines (`ember passes` lists them; compile() runs
# "inductor" unless options={"pipeline": ...} says otherwise). "inductor" is "to-prims" except
# that torch's fused CPU attention stays one op (an extern call beats its decomposition).
INDUCTOR_CPU = register_pipeline(
    "inductor-cpu", "lower-loops,fuse,codegen-cpp,plan-buffers",
    "prims -> loop kernels, fused, as C++ kernel blocks with planned buffers").text
DEFAULT_PIPELINE = register_pipeline(
    "inductor", "decompose{keep_attention=true},cse,dce,inductor-cpu",
    "compile()'s default: aten -> prims (fused CPU attention kept) -> C++ kernels").text


def buffer_type(t: TensorType) -> TensorType:
    return TensorType(t.dtype, t.shape, tuple(row_major_strides(t.shape)), t.device)


def _call_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    if not args or not isinstance(args[0], Ref):
        raise OpTypeError("kernels.call takes @kernel as its first argument")
    if ctx.module is not None and not isinstance(ctx.module.items.get(args[0].name), Kernel):
        raise OpTypeError(f"kernels.call: @{args[0].name} is not a kernel of this module")
    dts, shapes = kw.get("out_dtypes"), kw.get("out_shapes")
    if not isinstance(dts, list) or not isinstance(shapes, list) or len(dts) != len(shapes) \
            or not all(isinstance(d, DType) for d in dts) \
            or not all(isinstance(s, list) for s in shapes):
        raise OpTypeError("kernels.call needs out_dtypes=[dtype, ...] and out_shapes=[[...], ...]")
    return [buffer_type(TensorType(d, tuple(s)))
            for d, s in zip(dts, shapes, strict=True)]


KERNELS_PER_UNIT = 6  # kernels per translation unit before a module's C++ is split
# kernels whose integer division or modulo may divide by zero (they set the error flag)
_CHECKED_OPS = ("ember_div_trunc<", "ember_fmod<", "ember_pymod<")


def module_source(m: Module) -> str:
    return "\n".join(k.source for k in m.kernels.values() if k.lang == "cpp")


def module_units(m: Module) -> list[list[Kernel]]:
    """The module's kernel blocks split into translation units compiled in parallel: each
    unit is the prelude plus a contiguous run of kernels (at most one unit per compile job)."""
    blocks = [k for k in m.kernels.values() if k.lang == "cpp"]
    prelude = [k for k in blocks if k.name == PRELUDE_NAME]
    rest = [k for k in blocks if k.name != PRELUDE_NAME]
    n = max(1, min(cache.jobs(), math.ceil(len(rest) / KERNELS_PER_UNIT)))
    size = math.ceil(len(rest) / n) if rest else 0
    return [prelude + rest[i:i + size] for i in range(0, len(rest), size)] if rest else []


def load_module(m: Module) -> dict[str, tuple[Any, Any]]:
    """Build (or find in the cache) a module's C++ units, in parallel; kernel name -> (its
    function, the library's error-flag reader if the kernel may divide by zero, else None)."""
    units = module_units(m)
    libs = cache.load_all(["\n".join(k.source for k in u) for u in units])
    table: dict[str, tuple[Any, Any]] = {}
    for unit, lib in zip(units, libs, strict=True):
        for k in unit:
            if k.name != PRELUDE_NAME:
                fn = _symbol(lib, k)
                fn.restype = None
                checks = any(op in k.source for op in _CHECKED_OPS)
                table[k.name] = (fn, lib.ember_take_errors if checks else None)
    return table


def _symbol(lib: Any, k: Kernel) -> Any:
    """A kernel block's function: `kernel_symbol(name)` as codegen-cpp names it (never a libc
    or prelude name); a hand-written block (run only with --allow-kernels) or an older dump
    may define its plain name instead."""
    try:
        return lib[kernel_symbol(k.name)]
    except AttributeError:
        pass
    try:
        return lib[k.name]
    except AttributeError:
        raise CodegenError(f"kernel @{k.name}: its source defines no function "
                           f"{kernel_symbol(k.name)} (or {k.name})") from None


_TABLES: weakref.WeakKeyDictionary[Interpreter, dict[str, Any]] = weakref.WeakKeyDictionary()


def _call_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    ref = args[0]
    assert isinstance(ref, Ref)
    table = _TABLES.get(interp)
    if table is None:
        table = _TABLES[interp] = dict(load_module(interp.module))
    fn, take_errors = table[ref.name]
    ins = [a.contiguous() for a in args[1:]]
    reuse = list(kw.get("reuse") or [])
    outs = []
    for j, (d, s) in enumerate(zip(kw["out_dtypes"], kw["out_shapes"], strict=True)):
        shape = [int(x) for x in s]
        old = reuse[j] if j < len(reuse) else None
        if isinstance(old, torch.Tensor) and old.dtype == d.torch and old.is_contiguous() \
                and old.numel() == math.prod(shape):
            outs.append(old.view(shape))  # a dead buffer's storage (see plan_buffers)
        else:
            outs.append(torch.empty(shape, dtype=d.torch))
    fn(*[ctypes.c_void_p(t.data_ptr()) for t in ins + outs])
    if take_errors is not None and take_errors():
        # eager's message for an integer division or modulo by zero on the CPU
        raise RuntimeError("ZeroDivisionError")
    return outs[0] if len(outs) == 1 else tuple(outs)


def _extern_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    name = kw.get("op")
    target = ctx.registry.lookup(name) if ctx.registry and isinstance(name, str) else None
    if target is None:
        raise OpTypeError(f"kernels.extern: op= must name a registered op, got {name!r}")
    types = target.infer(ctx, args, {k: v for k, v in kw.items() if k != "op"})
    return [buffer_type(t) if isinstance(t, TensorType) else t for t in types]


# extern ops whose result is a view of their operand (kernels.view: no copy is made)
VIEW_EXTERNS = ("prims.permute", "loop.view")


def _view_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    name = kw.get("op")
    if name not in VIEW_EXTERNS or len(args) != 1 or not isinstance(args[0], Value) \
            or not isinstance(args[0].type, TensorType):
        raise OpTypeError(f"kernels.view: op= must be one of {', '.join(VIEW_EXTERNS)}, on "
                          f"one buffer")
    target = ctx.registry.lookup(name) if ctx.registry else None
    assert target is not None
    t = target.infer(ctx, args, {k: v for k, v in kw.items() if k != "op"})[0]
    assert isinstance(t, TensorType)
    src = row_major_strides(args[0].type.shape)  # of a buffer (graph inputs may differ)
    if name == "loop.view":
        aff = affine_view([parse_index(str(s)) for s in kw["index"]], t.rank)  # type: ignore
        assert aff is not None
        strides = [simplify_dim(sum(as_sympy(c[k]) * as_sympy(s)
                                    for c, s in zip(aff[1], src, strict=True)))
                   for k in range(t.rank)]
        return [TensorType(t.dtype, t.shape, tuple(strides), t.device)]
    dims = [int(d) for d in kw["dims"]]  # type: ignore[union-attr,arg-type]
    return [TensorType(t.dtype, t.shape, tuple(src[d] for d in dims), t.device)]


def _view_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["op"])
    assert target is not None
    return target.reference(interp, args, {k: v for k, v in kw.items() if k != "op"})


def _extern_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["op"])
    assert target is not None
    out = target.reference(interp, args, {k: v for k, v in kw.items() if k != "op"})
    if isinstance(out, (list, tuple)):
        return tuple(x.contiguous() if isinstance(x, torch.Tensor) else x for x in out)
    return out.contiguous() if isinstance(out, torch.Tensor) else out


KERNEL_OPS = (
    OpDef("kernels.call", "run a compiled kernel of the module on buffers; returns new buffers",
          _call_infer, _call_run),
    OpDef("kernels.extern", "call an op's own implementation on buffers (matmul, sort, ...)",
          _extern_infer, _extern_run),
    OpDef("kernels.view", "a strided view of a buffer (op=\"prims.permute\" or \"loop.view\"), "
          "no copy",
          _view_infer, _view_run),
)


def register_kernel_ops(registry: OpRegistry) -> None:
    for op in KERNEL_OPS:
        if registry.lookup(op.name) is None:
            registry.register(op)


# ---- the codegen pass --------------------------------------------------------------------------

@register_pass("codegen-cpp", "loop IR -> kernels.* graph with C++ kernel blocks (one function "
               "per loop kernel)")
def codegen_cpp(module: Module) -> Module:
    src = module.clone()
    bodies = body_names(src)
    kernels: list[Kernel] = [Kernel(PRELUDE_NAME, "cpp", PRELUDE)]
    graphs: list[Graph] = []
    fallback: list[Graph] = []
    for g in src.graphs.values():
        if g.name in bodies:
            continue
        for p in g.params:
            _retype(p)
        g.nodes = [_lower_node(src, g, n, kernels, fallback) for n in g.nodes]
        g.result_types = [o.type for o in g.outputs]
        graphs.append(g)
    out = Module(src.symbols, {}, src.version)
    if len(kernels) > 1:
        for k in kernels:
            out.add(k)
    items: list[Graph | Kernel] = [*src.kernels.values(), *graphs, *fallback]
    for item in items:
        if item.name not in out.items:
            out.add(item)
    return out


def _lower_node(m: Module, g: Graph, n: Node, kernels: list[Kernel], fallback: list[Graph]
                ) -> Node:
    if n.op == "loop.extern" and n.kwargs.get("op") in VIEW_EXTERNS:
        # a strided view of a buffer (matmul reads it as it is); its type says its strides
        ctx = InferContext(module=m, registry=default_registry())
        for r, t in zip(n.results, _view_infer(ctx, n.args, n.kwargs), strict=True):
            r.type = t
        return _node("kernels.view", n.args, n.kwargs, n, list(n.results))
    if n.op == "loop.extern":
        return _node("kernels.extern", n.args, n.kwargs, n, [_retype(r) for r in n.results])
    if n.op not in ("loop.pointwise", "loop.reduction"):
        return n
    ref = n.args[0]
    assert isinstance(ref, Ref)
    body = m.items[ref.name]
    assert isinstance(body, Graph)
    name = ref.name
    while any(k.name == name for k in kernels):  # two loop nodes may share one body
        name += "_"
    try:
        source = kernel_source(name, n, body, f"@{g.name}", m.items)
    except CodegenError as e:
        body.attrs["cpp_fallback"] = str(e)
        fallback.append(body)
        stack = [body]  # the bodies of fused reductions (nested too) run on the reference
        while stack:
            for bn in stack.pop().nodes:
                sub = m.items.get(bn.args[0].name) if bn.op == "loop.reduce" \
                    and isinstance(bn.args[0], Ref) else None
                if isinstance(sub, Graph) and sub not in fallback:
                    fallback.append(sub)
                    stack.append(sub)
        return n
    kernels.append(Kernel(name, "cpp", source))
    types = [r.type for r in n.results]
    assert all(isinstance(t, TensorType) for t in types)
    kw: dict[str, Arg] = {"out_dtypes": [t.dtype for t in types],  # type: ignore[union-attr]
                          "out_shapes": [list(t.shape) for t in types]}  # type: ignore[union-attr]
    return _node("kernels.call", [Ref(name), *n.args[1:]], kw, n,
                 [_retype(r) for r in n.results])


def _retype(v: Value) -> Value:
    if isinstance(v.type, TensorType):
        v.type = buffer_type(v.type)
    return v


def _node(op: str, args: list[Arg], kwargs: Mapping[str, Arg], n: Node, results: list[Value]
          ) -> Node:
    new = Node(op, list(args), dict(kwargs), results, n.loc, n.pos)
    for r in results:
        r.node = new
    return new


# ---- the backend -------------------------------------------------------------------------------

def compile_module(module: Module, pipeline: str = DEFAULT_PIPELINE) -> Module:
    """The compiled (kernels.*) module, its C++ already built (or found in the cache)."""
    out = run_pipeline(module, pipeline)
    if out.kernels:
        load_module(out)
    return out


def compiled_runner(compiled: Module) -> Runner:
    """The runner of an already compiled (kernels.*) module: random prims draw from torch's
    seed with a philox offset that advances from call to call."""
    from ember.inductor.wrapper import WrapperUnsupported, generate
    from ember.prims.decomp.random import run_with_philox

    interp = Interpreter(compiled)
    offset = [0]
    # Per graph: its generated straight-line call (wrapper.py), or None where the interpreter
    # runs it (symbolic shapes, random ops).
    calls: dict[str | None, Callable[[Sequence[Any]], RunResult] | None] = {}

    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        if graph not in calls:
            try:
                calls[graph] = generate(compiled, graph, interp).call
            except WrapperUnsupported:
                calls[graph] = None
        fast = calls[graph]
        if fast is not None:
            return fast(inputs)
        res, offset[0] = run_with_philox(interp, graph, inputs, torch.initial_seed(), offset[0])
        return res
    return run


def _inductor_backend(module: Module) -> Runner:
    run = compiled_runner(compile_module(module))

    def checked(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        try:
            return run(graph, inputs)
        except Exception as e:
            # An op failed on its data (an out-of-range id in an index_select extern, an
            # integer division by zero): raise what eager raises there, which only the
            # original op knows (x[i] raises IndexError where its gather form raises
            # RuntimeError). Compiled kernels never read at data-dependent indices: ids reach
            # only extern ops, which check them (see docs/inductor.md).
            err = eager_error(module, graph, inputs, e)
            if err is e:
                raise
            raise err from None
    return checked


def summary(compiled: Module) -> str:
    """What a compiled module runs: `3 C++ kernel(s), 1 extern call(s)`, plus the kernels and
    ops left to the reference interpreter, with the reasons."""
    counts = {"kernels.call": 0, "kernels.extern": 0}
    other: list[str] = []
    bodies = body_names(compiled)
    for g in compiled.graphs.values():
        if g.name in bodies:
            continue
        for n in g.nodes:
            if n.op == "kernels.view":  # a strided view of a buffer: nothing runs
                continue
            if n.op in counts:
                counts[n.op] += 1
            elif n.op in ("loop.pointwise", "loop.reduction"):
                ref = n.args[0]
                assert isinstance(ref, Ref)
                body = compiled.items[ref.name]
                why = body.attrs.get("cpp_fallback") if isinstance(body, Graph) else None
                other.append(f"{n.op} @{ref.name} ({why})")
            else:
                other.append(n.op)
    text = f"{counts['kernels.call']} C++ kernel(s), {counts['kernels.extern']} extern call(s)"
    if other:
        text += f"; run by the reference interpreter: {', '.join(sorted(set(other)))}"
    return text


def register_backend() -> None:
    if "inductor" not in default_backends().all():
        default_backends().add(Backend(
            "inductor", f"the pipeline inductor ({DEFAULT_PIPELINE}), then run the compiled "
            f"C++ kernels (CPU)", _inductor_backend))
