"""The `inductor` backend: compile a module for its device's target, then run it.

`compile_module` picks the target from the module's devices (targets/), runs its pipeline and
loads the kernel blocks (launch.py); `compiled_runner` runs a compiled module through the
generated wrapper (wrapper.py) or, for graphs it does not cover, the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy

from ember.inductor.body import body_names
from ember.inductor.launch import load_module
from ember.inductor.targets import scalar_inputs_to_device, target_for
from ember.inductor.wrapper import WrapperUnsupported, generate
from ember.ir import Graph, Interpreter, Module, Ref, RunResult, TensorType, Value
from ember.ir.backends import Backend, Runner, default_backends
from ember.ir.graph import BIND_SYMBOL
from ember.ir.interpreter import bind_symbols, eager_error
from ember.ir.passes import default_pass_registry, run_pipeline
from ember.prims.decomp.random import PhiloxOffsets, run_drawing

# how summary() names a language's kernels
LANG_NAMES = {"cpp": "C++"}


INDUCTOR = "inductor"  # the pipeline name that means "the pipeline of the graph's target"


def pipeline_for(module: Module, pipeline: str = INDUCTOR) -> str:
    """The pipeline to run: the target's own (front end and all) for the default `inductor`,
    else `pipeline` as given. Either way a module on a device with no target is refused
    (`TargetError`, naming the device and the registered targets)."""
    target = target_for(module)
    return target.full_pipeline if pipeline == INDUCTOR else pipeline


def compile_module(module: Module, pipeline: str = INDUCTOR) -> Module:
    """The compiled (kernels.*) module for its device's target, its kernels already built (or
    found in the cache). A module that is already compiled (an `ember run` of a kernels.* dump)
    runs as it is, as the reference backend runs it: its kernels were built for its own buffer
    plan and sizes= arguments, which compiling it again need not keep."""
    full = pipeline_for(module, pipeline)
    if pipeline == INDUCTOR and is_compiled(module):
        if module.kernels:
            load_module(module)
        return module
    out = run_pipeline(module, full)
    if out.kernels:
        load_module(out)
    return out


def is_compiled(module: Module) -> bool:
    """Whether a graph of `module` runs kernels.* ops (the output of a target's pipeline)."""
    return any(n.op.startswith("kernels.") for g in module.graphs.values() for n in g.nodes)


# aten ops (overload packets) that eager refuses on an empty reduced dim (no identity): the
# decomposition refuses static ones when compiling; a symbolic size is checked per call
NO_IDENTITY = ("aten.amax", "aten.amin", "aten.argmax", "aten.argmin", "aten.max", "aten.min")


def empty_reductions(source: Module) -> list[TensorType]:
    """The operand types of `source`'s NO_IDENTITY ops that a symbolic size may make empty
    (any size but a product of numbers and symbols whose min is at least 1)."""
    pos = {n for n, s in source.symbols.items() if s.min is not None and s.min >= 1}

    def nonzero(d: Any) -> bool:
        if isinstance(d, int):
            return d != 0
        factors = d.args if isinstance(d, sympy.Mul) else (d,)
        return all((f.is_Integer and int(f) != 0) or (f.is_Symbol and f.name in pos)
                   for f in factors)
    out: list[TensorType] = []
    for g in source.graphs.values():
        for n in g.nodes:
            x = n.args[0] if n.args else None
            if n.op.rsplit(".", 1)[0] in NO_IDENTITY and isinstance(x, Value) \
                    and isinstance(x.type, TensorType) \
                    and not all(nonzero(d) for d in x.type.shape):
                out.append(x.type)
    return out


def _any_empty(source: Module, graph: str | None, inputs: Sequence[Any],
               types: list[TensorType]) -> bool:
    """Whether one of `types` is empty at this call's sizes (unknown counts as empty: eager
    then runs the call, which is always right)."""
    try:
        env = bind_symbols(source.graph(graph), inputs, source.symbols)
        return any(0 in t.concrete_shape(env) for t in types)
    except Exception:  # noqa: BLE001  (eager runs the call and reports what is wrong)
        return True


def compiled_runner(compiled: Module, source: Module | None = None) -> Runner:
    """The runner of an already compiled (kernels.*) module: random prims draw from torch's
    seed with a philox offset that advances from call to call (one offset for the runner's
    graphs, taken atomically: generated call or interpreter alike). Given the `source` module
    it was compiled from, a call where an op without identity reduces an empty dim (a size
    symbol allowed to be 0 is 0) runs `source` eagerly instead: eager's error, as for static
    sizes."""
    interp = Interpreter(compiled)
    offsets = PhiloxOffsets()
    empties = empty_reductions(source) if source is not None else []
    # Per graph: its generated straight-line call (wrapper.py), or None where the interpreter
    # runs it (what wrapper.py does not cover: WrapperUnsupported's reasons).
    calls: dict[str | None, Callable[[Sequence[Any]], RunResult] | None] = {}

    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        if empties and source is not None and _any_empty(source, graph, inputs, empties):
            return Interpreter(source).run(inputs, graph)
        if graph not in calls:
            try:
                calls[graph] = generate(compiled, graph, interp).draw_from(offsets).call
            except WrapperUnsupported:
                calls[graph] = None
        fast = calls[graph]
        if fast is not None:
            return fast(inputs)
        return run_drawing(interp, graph, inputs, offsets)
    run.__dict__["calls"] = calls  # (for tests: which graphs the generated calls run)
    return run


def _inductor_backend(module: Module) -> Runner:
    # 0-dim CPU inputs of a CUDA graph (eager's scalars) compile on the device, moved per call
    scalars = scalar_inputs_to_device(module)
    target = scalars.module if scalars is not None else module
    run = compiled_runner(compile_module(target), target)

    def checked(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        try:
            if scalars is not None:
                inputs = scalars.move(module.graph(graph).name, inputs)
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
    """What a compiled module runs: `3 C++ kernel(s), 1 extern call(s)` (the kernels named
    after their language), plus the kernels and ops left to the reference interpreter, with
    the reasons."""
    counts = {"kernels.call": 0, "kernels.extern": 0}
    langs = sorted({k.lang for k in compiled.kernels.values()
                    if any(n.op == "kernels.call" and isinstance(n.args[0], Ref)
                           and n.args[0].name == k.name
                           for g in compiled.graphs.values() for n in g.nodes)})
    other: list[str] = []
    bodies = body_names(compiled)
    for g in compiled.graphs.values():
        if g.name in bodies:
            continue
        for n in g.nodes:
            if n.op in ("kernels.view", BIND_SYMBOL):  # a strided view of a buffer, a
                continue  # value read off a tensor (.item()): nothing runs
            if n.op in counts:
                counts[n.op] += 1
            elif n.op in ("loop.pointwise", "loop.reduction"):
                ref = n.args[0]
                assert isinstance(ref, Ref)
                body = compiled.items[ref.name]
                # the code generator's reason (C++ or Triton: the target that left it)
                why = (body.attrs.get("cpp_fallback") or body.attrs.get("triton_fallback")
                       if isinstance(body, Graph) else None)
                other.append(f"{n.op} @{ref.name} ({why or 'no kernel generated for it'})")
            else:
                other.append(n.op)
    lang = "/".join(LANG_NAMES.get(x, x) for x in langs) or LANG_NAMES["cpp"]
    text = f"{counts['kernels.call']} {lang} kernel(s), {counts['kernels.extern']} extern call(s)"
    if other:
        text += f"; run by the reference interpreter: {', '.join(sorted(set(other)))}"
    return text


def register_backend() -> None:
    if "inductor" not in default_backends().all():
        default_backends().add(Backend(
            "inductor", "the pipeline of the graph's device's target (cpu: "
            f"{pipeline_text()}), then run the compiled kernels", _inductor_backend,
            # compile() builds a graph that records gradients into forward and backward graphs
            # (ember.autograd) and runs both through this pipeline (runtime/training.py)
            supports_training=True))


def pipeline_text() -> str:
    pl = default_pass_registry().pipelines().get(INDUCTOR)
    return pl.text if pl is not None else INDUCTOR
