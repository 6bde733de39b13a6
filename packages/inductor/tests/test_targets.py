"""Targets and loaders (issue 15 #1, #2): a target registered from outside the core runs a graph
end to end; a graph on a device with no target is refused; kernels.call's ABI is verified; the
inductor's modules import one another without a cycle."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the passes, the CPU target and the backend)
from ember.inductor import launch
from ember.inductor.backend import compile_module, compiled_runner
from ember.inductor.fusion import why_not_fused
from ember.inductor.indexing import index_text
from ember.inductor.kernels import buffer_type
from ember.inductor.launch import LoadedKernel, out_buffer, register_loader, unregister_loader
from ember.inductor.targets import (
    FusionHooks,
    Target,
    TargetError,
    add_target,
    register_target,
    targets,
    unregister_target,
)
from ember.ir import (
    Graph,
    Kernel,
    Module,
    Node,
    OpTypeError,
    Ref,
    TensorType,
    VerificationError,
    parse,
    verify,
)
from ember.ir.passes import (
    PipelineError,
    default_pass_registry,
    register_pass,
    register_pipeline,
    run_pipeline,
)

# ---- a test target: loop kernels rendered as Python/torch source ("pyref") --------------------

_PY_OPS = {"prims.add": "torch.add", "prims.mul": "torch.mul", "prims.sub": "torch.sub",
           "prims.exp": "torch.exp", "prims.sin": "torch.sin", "prims.neg": "torch.neg"}


def _render(name: str, node: Node, body: Graph) -> str | None:
    """`def kernel(in0, ..., out0)`: the body as one torch expression per output, or None
    where it needs more than identity loads and the ops above."""
    t = node.results[0].type
    assert isinstance(t, TensorType)
    identity = [f"i{k}" for k in range(t.rank)]
    env = {p: f"in{k}" for k, p in enumerate(body.params)}
    for n in body.nodes:
        if n.op == "loop.load" and [index_text(s) for s in n.kwargs["index"]] == identity:  # type: ignore[union-attr]
            env[n.results[0]] = env[n.args[0]]  # type: ignore[index]
        elif n.op in _PY_OPS:
            args = [env[a] if a in env else repr(a) for a in n.args]  # type: ignore[index]
            env[n.results[0]] = f"{_PY_OPS[n.op]}({', '.join(args)})"
        else:
            return None
    ins = [f"in{k}" for k in range(len(body.params))]
    outs = [f"out{k}" for k in range(len(body.outputs))]
    lines = [f"def kernel({', '.join(ins + outs)}):  # {name}"]
    lines += [f"    {o}.copy_({env[v]})" for o, v in zip(outs, body.outputs, strict=True)]
    return "\n".join(lines) + "\n"


def codegen_pyref(module: Module) -> Module:
    out = module.clone()
    kernels: list[Kernel] = []
    for g in list(out.graphs.values()):
        for i, n in enumerate(g.nodes):
            ref = n.args[0] if n.op == "loop.pointwise" else None
            body = out.items.get(ref.name) if isinstance(ref, Ref) else None
            src = _render(ref.name, n, body) if isinstance(body, Graph) and ref else None
            if src is None or ref is None:
                continue
            kernels.append(Kernel(f"py_{ref.name}", "pyref", src))
            types = [r.type for r in n.results]
            new = Node("kernels.call", [Ref(f"py_{ref.name}"), *n.args[1:]],
                       {"out_dtypes": [t.dtype for t in types],  # type: ignore[union-attr]
                        "out_shapes": [list(t.shape) for t in types]},  # type: ignore[union-attr]
                       n.results, n.loc, n.pos)
            for r in new.results:
                r.node = new
                r.type = buffer_type(r.type)  # type: ignore[arg-type]
            g.nodes[i] = new
    rendered = {k.name[3:] for k in kernels}
    out.items = {name: item for name, item in out.items.items() if name not in rendered}
    for k in kernels:
        out.add(k)
    return out


def load_pyref(m: Module, blocks: list[Kernel]) -> dict[str, LoadedKernel]:
    table = {}
    for k in blocks:
        ns: dict[str, object] = {"torch": torch}
        exec(compile(k.source, f"<pyref {k.name}>", "exec"), ns)  # the test's own source
        table[k.name] = LoadedKernel(ns["kernel"], "tensor")
    return table


@pytest.fixture
def pyref_on_cpu() -> Iterator[Target]:
    """The pyref target in place of the CPU's (the only device here), restored after."""
    if "codegen-pyref" not in default_pass_registry().all():
        register_pass("codegen-pyref", "loop IR -> pyref kernel blocks")(codegen_pyref)
        register_pipeline("inductor-pyref", "lower-loops,fuse,codegen-pyref,plan-buffers",
                          "prims -> Python kernels (a test target)")
    register_loader("pyref", load_pyref, devices=("cpu",))
    cpu = targets()["cpu"]
    unregister_target("cpu")
    try:
        yield register_target("cpu", "inductor-pyref", "pyref", description="a test target")
    finally:
        unregister_target("cpu")
        add_target(cpu)
        unregister_loader("pyref")


SMALL = """ember.ir 1.0

graph @f(%x: f32[4, 8], %y: f32[4, 8]) -> (f32[4, 8]) {
  %e = aten.exp.default(%x) : f32[4, 8]
  %m = aten.mul.Tensor(%e, %y) : f32[4, 8]
  %s = aten.sin.default(%m) : f32[4, 8]
  return (%s)
}
"""


def test_a_target_registered_outside_the_core_runs_a_graph(pyref_on_cpu: Target) -> None:
    compiled = compile_module(parse(SMALL))
    assert {k.lang for k in compiled.kernels.values()} == {"pyref"}
    assert [n.op for n in compiled.graph().nodes] == ["kernels.call"]  # fused, then rendered
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    want = torch.sin(torch.exp(x) * y)
    run = compiled_runner(compiled)
    for _ in range(2):
        torch.testing.assert_close(run(None, [x, y]).outputs[0], want)
    from ember.ir import Interpreter  # the interpreter's kernels.call: the same launch path
    torch.testing.assert_close(Interpreter(compiled).run([x, y]).outputs[0], want)


def test_a_targets_fusion_veto_keeps_kernels_apart(pyref_on_cpu: Target) -> None:
    unregister_target("cpu")
    add_target(dataclasses.replace(pyref_on_cpu, fusion=FusionHooks(
        veto=lambda m, g, a, b: "pyref kernels stay one op each")))
    compiled = compile_module(parse(SMALL))
    assert [n.op for n in compiled.graph().nodes] == ["kernels.call"] * 3
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(compiled_runner(compiled)(None, [x, y]).outputs[0],
                               torch.sin(torch.exp(x) * y))
    loop = run_pipeline(parse(SMALL), "to-prims,lower-loops")
    g = loop.graph()
    assert why_not_fused(loop, g, g.nodes[0], g.nodes[1]) == \
        "the cpu target keeps them apart: pyref kernels stay one op each"


def test_registries_refuse_duplicates() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_target("cpu", "inductor-cpu", "cpp")
    with pytest.raises(ValueError, match="already registered"):
        register_loader("cpp", load_pyref)


# ---- refusal: a device with no target --------------------------------------------------------

CUDA = """ember.ir 1.0

graph @f(%x: f32[4]@cuda:0) -> (f32[4]@cuda:0) {
  %y = aten.exp.default(%x) : f32[4]@cuda:0
  return (%y)
}
"""


def test_a_cuda_graph_is_refused_never_compiled_for_the_cpu() -> None:
    m = parse(CUDA)
    with pytest.raises(TargetError, match=r"on cuda:0.*no code generation target is "
                                          r"registered for cuda \(registered targets: cpu\)"):
        compile_module(m)
    # the CPU pipeline run by name: codegen-cpp refuses it (a one-line pipeline error)
    with pytest.raises(PipelineError, match=r"codegen-cpp: graph @f is on cuda:0; codegen-cpp "
                                            r"generates cpu code only"):
        run_pipeline(m, "inductor")
    from ember.ir.backends import default_backends
    with pytest.raises(TargetError, match="cuda:0"):
        default_backends().get("inductor").prepare(m)


# ---- the kernels dialect's ABI ---------------------------------------------------------------

def _call(kernel: str, lang: str, ty: str = "f32[4]", extra: str = "") -> str:
    return f"""ember.ir 1.0

kernel @{kernel} {lang} \"\"\"void k(float*, float*) {{}}\"\"\"

graph @f(%x: {ty}) -> (f32[4]) {{
  %y = kernels.call(@{kernel}, %x, out_dtypes=[f32], out_shapes=[[4]]{extra}) : f32[4]{{1}}
  return (%y)
}}
"""


@pytest.mark.parametrize("text, error", [
    (_call("k", "cpp", "f32[4]@cuda:0"), "%x is on cuda:0, the call runs on cpu"),
    (_call("k", "cobol"), "no loader is registered for 'cobol' \\(registered: cpp"),
    (_call("k", "cpp", extra=", launch=[1, 2]"), "'cpp' kernels take no launch= attributes"),
    (_call("k", "cpp", extra=", launch=[0]"), "launch= must be a list of positive integers"),
    (_call("k", "cpp", extra=', device="cuda:0"'), "%x is on cpu, the call runs on cuda:0"),
])
def test_kernels_call_abi_is_verified(text: str, error: str) -> None:
    with pytest.raises(Exception, match=error) as e:
        verify(parse(text))
    assert isinstance(e.value, (VerificationError, OpTypeError))


def test_outputs_are_allocated_on_the_calls_device() -> None:
    assert out_buffer([2, 3], torch.float32, "meta").device.type == "meta"
    old = torch.empty(6)
    assert out_buffer([2, 3], torch.float32, "cpu", old).data_ptr() == old.data_ptr()
    assert out_buffer([2, 3], torch.float32, "meta", old).device.type == "meta"  # not reused
    with pytest.raises(launch.LoadError, match="no loader is registered for kernel language "
                                               "'cobol'"):
        launch.loader("cobol")


# ---- the import graph: no cycle among the inductor's modules ---------------------------------

SRC = Path(ember.inductor.__file__).parent
# modules kept at their old names that are the moved module itself (see their docstrings)
SHIMS = {"ember.inductor.cache", "ember.inductor.cpp", "ember.inductor.cppkernel",
         "ember.inductor.epilogue"}


def _module(path: Path) -> str:
    rel = path.relative_to(SRC.parent.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_between_inductor_modules() -> None:
    """Every import (module level or inside a function) between ember.inductor's modules,
    a package counting as importing its parent's __init__ only when it names it: no cycle
    (kernels.py and wrapper.py imported each other before the launch path moved to
    launch.py), except through the package __init__ that registers everything."""
    mods = {_module(p): p for p in SRC.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # `from pkg import mod` imports mod (pkg's __init__ runs, but is not re-entered)
                subs = [f"{node.module}.{a.name}" for a in node.names]
                names = [s for s in subs if s in mods] or [node.module]
            edges[m] |= {n for n in names if n in mods and n != m}
    skip = {"ember.inductor"} | SHIMS
    graph = {m: {d for d in ds if d not in skip} for m, ds in edges.items() if m not in skip}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = path[path.index(d):] + [d] if d in path else [m, d]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if d not in state:
                visit(d, [*path, d])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert "ember.inductor.kernels" not in graph["ember.inductor.wrapper"]
    assert "ember.inductor.wrapper" not in graph["ember.inductor.kernels"]
