"""fuse, rule 2: a reduction fuses into its readers of the same outer domain (`loop.reduce`
inside the reader's body, also inside the reader's own reductions), then the pointwise producer
of a reduction inlines into it: softmax, layernorm and var are one kernel each. Golden text for
softmax, numbers on the interpreter and in C++ against eager and the unfused kernels, and
why_not_fused."""

from __future__ import annotations

import torch

import ember.inductor  # noqa: F401
from ember.inductor.fusion import why_not_fused
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Interpreter, Module, parse
from ember.ir.passes import run_pipeline
from packages.inductor.tests.softmax_ir import SOFTMAX, SOFTMAX_FUSED

LAYERNORM = """ember.ir 1.0

graph @ln(%x: {dt}[4, 6], %w: {dt}[6], %b: {dt}[6]) -> ({dt}[4, 6]) {{
  %y, %mean, %rstd = aten.native_layer_norm.default(%x, [6], %w, %b, 1e-05) : \
({dt}[4, 6], f32[4, 1], f32[4, 1])
  return (%y)
}}
"""


def _kernels(m: Module, graph: str) -> list[str]:
    return [n.op for n in m.graph(graph).nodes]


def _run(m: Module, inputs: list[torch.Tensor]) -> torch.Tensor:
    out = compiled_runner(m)(None, inputs).outputs[0]
    assert isinstance(out, torch.Tensor)
    return out


def test_softmax_golden_round_trip_and_numbers() -> None:
    m = parse(SOFTMAX)
    fused = run_pipeline(m, "lower-loops,fuse", verify_each=True)
    assert str(fused) == SOFTMAX_FUSED
    assert str(parse(SOFTMAX_FUSED)) == SOFTMAX_FUSED
    unfused = run_pipeline(m, "lower-loops,fuse{reductions=false}")
    assert _kernels(unfused, "softmax").count("loop.reduction") == 2
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    x[1, 2] = float("-inf")
    torch.testing.assert_close(Interpreter(fused).run([x]).outputs[0], torch.softmax(x, 1))
    compiled = run_pipeline(fused, "codegen-cpp")
    assert _kernels(compiled, "softmax") == ["kernels.call"]
    src = compiled.kernels["softmax_k4"].source
    assert "a reduction fused here" in src and "@softmax_k7" in src
    got = _run(compile_module(fused, "codegen-cpp"), [x])
    torch.testing.assert_close(got, torch.softmax(x, 1))
    # the same sums and maxima as the unfused kernels; exp may be computed by another SIMD
    # variant (libmvec, <= 4 ulp) in the fused kernel's loops
    torch.testing.assert_close(got, _run(compile_module(unfused, "codegen-cpp"), [x]))


def test_layernorm_is_one_kernel_and_matches_unfused() -> None:
    g = torch.Generator().manual_seed(1)
    for dt, torch_dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        m = parse(LAYERNORM.format(dt=dt))
        xs = [torch.randn(4, 6, generator=g).to(torch_dt) for _ in range(1)]
        xs += [torch.randn(6, generator=g).to(torch_dt), torch.randn(6, generator=g).to(torch_dt)]
        fused = compile_module(m)
        unfused = compile_module(
            m, "decompose,lower-loops,fuse{reductions=false,recompute=0},codegen-cpp")
        assert len(_kernels(fused, "ln")) < len(_kernels(unfused, "ln"))
        if dt == "f32":
            assert _kernels(fused, "ln") == ["kernels.call"]
            assert len(_kernels(unfused, "ln")) == 4
        got = _run(fused, xs)
        tol = {"rtol": 2e-2, "atol": 2e-2} if torch_dt == torch.bfloat16 else {}
        torch.testing.assert_close(got, _run(unfused, xs), **tol)
        torch.testing.assert_close(got, torch.nn.functional.layer_norm(xs[0], [6], xs[1], xs[2]),
                                   **tol)


def test_reduction_output_or_other_domain_is_not_fused() -> None:
    text = """ember.ir 1.0

graph @f(%x: f32[4, 8]) -> (f32[4], f32[8, 4]) {
  %s = prims.sum(%x, dims=[1]) : f32[4]
  %b = prims.broadcast_in_dim(%s, shape=[8, 4], broadcast_dims=[1]) : f32[8, 4]
  %y = prims.mul(%b, 2.0) : f32[8, 4]
  return (%s, %y)
}
"""
    low = run_pipeline(parse(text), "lower-loops")
    g = low.graph("f")
    red, pw = g.nodes
    why = why_not_fused(low, g, red, pw)
    assert why is not None and "graph output" in why
    g.outputs = [g.outputs[1]]
    g.result_types = [g.result_types[1]]
    why = why_not_fused(low, g, red, pw)
    assert why is not None and "outer domain" in why
    fused = run_pipeline(low, "fuse")
    assert _kernels(fused, "f") == ["loop.reduction", "loop.pointwise"]


def test_graph_output_is_written_by_its_reader() -> None:
    # rule 4: y is an output and z's only input: one kernel writes both, reading x once
    text = """ember.ir 1.0

graph @f(%x: f32[5, 7]) -> (f32[5, 7], f32[5, 7]) {
  %y = prims.exp(%x) : f32[5, 7]
  %z = prims.mul(%y, %x) : f32[5, 7]
  return (%y, %z)
}
"""
    m = parse(text)
    fused = run_pipeline(m, "lower-loops,fuse", verify_each=True)
    node, = fused.graph("f").nodes
    assert node.op == "loop.pointwise" and [r.name for r in node.results] == ["z", "y"]
    assert str(parse(str(fused))) == str(fused)
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(2))
    y, z = compiled_runner(compile_module(fused, "codegen-cpp"))(None, [x]).outputs
    torch.testing.assert_close(y, x.exp())
    torch.testing.assert_close(z, x.exp() * x)
    # a reader over another domain still reads the written buffer
    other = text.replace("%z = prims.mul(%y, %x) : f32[5, 7]",
                         "%z = prims.sum(%y, dims=[1]) : f32[5]").replace(
        "-> (f32[5, 7], f32[5, 7])", "-> (f32[5, 7], f32[5])")
    low = run_pipeline(parse(other), "lower-loops")
    g = low.graph("f")
    why = why_not_fused(low, g, g.nodes[0], g.nodes[1])
    assert why is not None and "graph output" in why
