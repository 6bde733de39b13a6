"""Compiled modules: the `kernels` dialect, the `codegen-cpp` pass and the `inductor` backend.

`codegen-cpp` turns each loop kernel into a `kernel @name cpp` block (its source between triple
quotes) and its node into

    %y = kernels.call(@f_k0, %x, %b, out_dtypes=[f32], out_shapes=[[4, 8]]) : f32[4, 8]{8, 1}

(buffers with row-major strides; inputs are made contiguous before the call, outputs allocated
with torch.empty). `loop.extern` becomes `kernels.extern` (the prim's implementation through
Python, no libtorch headers). All `cpp` blocks of a module, in order, form one translation unit:
`@cpp_prelude` holds the helpers, each other block one `extern "C"` function named after it. A
kernel the C++ tables cannot express yet keeps its `loop.pointwise`/`loop.reduction` node and body
(run by the reference), with the reason in `attrs(cpp_fallback=...)` of that body.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ember.inductor import cache
from ember.inductor.body import body_names
from ember.inductor.cpp import PRELUDE, CodegenError, kernel_source
from ember.inductor.indexing import row_major_strides
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
)
from ember.ir.backends import Backend, Runner, default_backends
from ember.ir.passes import register_pass, run_pipeline

PRELUDE_NAME = "cpp_prelude"
DEFAULT_PIPELINE = "decompose,lower-loops,fuse,codegen-cpp"


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


def module_source(m: Module) -> str:
    return "\n".join(k.source for k in m.kernels.values() if k.lang == "cpp")


def _call_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    ref = args[0]
    assert isinstance(ref, Ref)
    lib = cache.load(module_source(interp.module))
    fn = getattr(lib, ref.name)
    ins = [a.contiguous() for a in args[1:]]
    outs = [torch.empty([int(x) for x in s], dtype=d.torch)
            for d, s in zip(kw["out_dtypes"], kw["out_shapes"], strict=True)]
    fn.argtypes = [ctypes.c_void_p] * (len(ins) + len(outs))
    fn.restype = None
    fn(*[t.data_ptr() for t in ins + outs])
    return outs[0] if len(outs) == 1 else tuple(outs)


def _extern_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    name = kw.get("op")
    target = ctx.registry.lookup(name) if ctx.registry and isinstance(name, str) else None
    if target is None:
        raise OpTypeError(f"kernels.extern: op= must name a registered op, got {name!r}")
    types = target.infer(ctx, args, {k: v for k, v in kw.items() if k != "op"})
    return [buffer_type(t) if isinstance(t, TensorType) else t for t in types]


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
    if n.op == "loop.extern":
        res = [_retype(r) for r in n.results]
        return _node("kernels.extern", n.args, n.kwargs, n, res)
    if n.op not in ("loop.pointwise", "loop.reduction"):
        return n
    ref = n.args[0]
    assert isinstance(ref, Ref)
    body = m.items[ref.name]
    assert isinstance(body, Graph)
    try:
        source = kernel_source(ref.name, n, body, f"@{g.name}", m.items)
    except CodegenError as e:
        body.attrs["cpp_fallback"] = str(e)
        fallback.append(body)
        for r in body.nodes:  # the bodies of fused reductions run on the reference too
            if r.op == "loop.reduce" and isinstance(r.args[0], Ref):
                sub = m.items[r.args[0].name]
                if isinstance(sub, Graph) and sub not in fallback:
                    fallback.append(sub)
        return n
    kernels.append(Kernel(ref.name, "cpp", source))
    t = n.results[0].type
    assert isinstance(t, TensorType)
    kw: dict[str, Arg] = {"out_dtypes": [t.dtype], "out_shapes": [list(t.shape)]}
    return _node("kernels.call", n.args, kw, n, [_retype(n.results[0])])


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
        cache.load(module_source(out))
    return out


def compiled_runner(compiled: Module) -> Runner:
    """The runner of an already compiled (kernels.*) module: random prims draw from torch's
    seed with a philox offset that advances from call to call."""
    from ember.prims.decomp.random import run_with_philox

    interp = Interpreter(compiled)
    offset = [0]

    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        res, offset[0] = run_with_philox(interp, graph, inputs, torch.initial_seed(), offset[0])
        return res
    return run


def _inductor_backend(module: Module) -> Runner:
    return compiled_runner(compile_module(module))


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
            "inductor", "decompose -> lower-loops -> fuse -> codegen-cpp, run compiled C++ "
            "kernels (CPU)", _inductor_backend))
