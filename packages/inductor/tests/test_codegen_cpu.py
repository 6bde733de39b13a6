"""The shape of the generated C++ (not its speed): g++ vectorises the inner loops of pointwise and
reduction kernels (-fopt-info-vec), softmax / layernorm / var compile to one kernel, independent
reductions of the same rows share a multi-output kernel, `fuse{explain=true}` says why edges
stayed unfused, and integer division by zero raises as eager does."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

import ember.inductor  # noqa: F401
from ember.inductor import cache
from ember.inductor.kernels import compile_module, compiled_runner, module_source
from ember.ir import DType, GraphBuilder, Module, TensorType, Value, parse
from ember.ir.passes import run_pipeline

ROWS = """ember.ir 1.0

graph @f(%x: f32[64, 256]) -> ({outs}) {{
  {body}
  return ({rets})
}}
"""


def _module(body: str, outs: str, rets: str) -> Module:
    return parse(ROWS.format(body=body, outs=outs, rets=rets))


def _run(m: Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(compiled_runner(compile_module(m))(None, inputs).outputs)


def _calls(m: Module) -> list[str]:
    return [n.op for n in compile_module(m).graph("f").nodes]


def test_inner_loops_are_vectorised(tmp_path: Path) -> None:
    m = _module("%e = prims.exp(%x) : f32[64, 256]\n"
                "  %y = prims.mul(%e, %x) : f32[64, 256]\n"
                "  %s = prims.sum(%x, dims=[1]) : f32[64]\n"
                "  %a = prims.amax(%x, dims=[1]) : f32[64]",
                "f32[64, 256], f32[64], f32[64]", "%y, %s, %a")
    src = module_source(run_pipeline(m, "decompose,lower-loops,fuse{horizontal=false},"
                                        "codegen-cpp"))
    path = tmp_path / "k.cpp"
    path.write_text(src)
    res = subprocess.run([cache.CXX, *cache.flags(), "-fopt-info-vec-optimized", str(path),
                          "-o", str(tmp_path / "k.so")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    vectorised = {int(x) for x in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized",
                                             res.stderr)}
    lines = src.splitlines()
    # the innermost loop under each `omp simd` pragma (g++ reports a line inside it), per
    # kernel: the pointwise one and both reductions
    loops = {}
    for k, line in enumerate(lines):
        if "omp" in line and "simd" in line:
            indent = len(lines[k + 1]) - len(lines[k + 1].lstrip())
            end = next(j for j in range(k + 2, len(lines))
                       if lines[j].strip() == "}" and len(lines[j]) - 1 == indent)
            loops[_kernel_at(lines, k)] = range(k + 2, end + 2)  # 1-based line numbers
    assert len(loops) == 3, loops
    for kernel, span in loops.items():
        assert vectorised & set(span), f"{kernel}: the loop at line {span[0]} is not vectorised"


def test_outer_split_and_rescale_loops_are_vectorised(tmp_path: Path) -> None:
    # column blocks of an outer sum / amax / argmax (and the sum's flush into double), a full
    # sum split over threads, softmax's pass storing the numerators and its rescale loop
    m = parse(ROWS.format(
        body="%s = prims.sum(%x, dims=[0]) : f32[256]\n"
             "  %a = prims.amax(%x, dims=[0]) : f32[256]\n"
             "  %i = aten.argmax.default(%x, 0) : i64[256]\n"
             "  %t = prims.sum(%x, dims=[0, 1]) : f32[]\n"
             "  %y = aten._softmax.default(%x, -1, false) : f32[64, 256]",
        outs="f32[256], f32[256], i64[256], f32[], f32[64, 256]", rets="%s, %a, %i, %t, %y"
    ).replace("f32[64, 256]) ->", "f32[512, 256]) ->").replace(
        "f32[64, 256]", "f32[512, 256]"))
    src = module_source(run_pipeline(m, "decompose,lower-loops,fuse{horizontal=false},"
                                        "codegen-cpp"))
    for marker in ("const int64_t ib = b * ", "omp_get_thread_num()",
                   "the sum's pass stored the numerators", "if (++rows == "):
        assert marker in src, marker
    path = tmp_path / "k.cpp"
    path.write_text(src)
    res = subprocess.run([cache.CXX, *cache.flags(), "-fopt-info-vec-optimized",
                          "-fopt-info-loop-optimized", str(path), "-o", str(tmp_path / "k.so")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # a vectorised loop, or one g++ replaced by a library call (memcpy, memset)
    vectorised = {int(x) for x in re.findall(
        r"k\.cpp:(\d+):\d+: optimized: (?:loop vectorized|Loop \d+ distributed: split to 0 "
        r"loops)", res.stderr)}
    lines = src.splitlines()
    spans = []
    for k, line in enumerate(lines):
        if "omp" in line and "simd" in line:
            indent = len(lines[k + 1]) - len(lines[k + 1].lstrip())
            end = next(j for j in range(k + 2, len(lines))
                       if lines[j].strip() == "}" and len(lines[j]) - 1 == indent)
            spans.append(range(k + 2, end + 2))  # 1-based line numbers of the loop
    assert len(spans) >= 8, src
    for span in spans:
        assert vectorised & set(span), f"the loop at line {span[0]} is not vectorised:\n{src}"


def _kernel_at(lines: list[str], k: int) -> str:
    head = next(x for x in reversed(lines[:k]) if x.startswith('extern "C" void'))
    return head.split("(")[0].split()[-1]


def test_softmax_layernorm_var_are_one_kernel_each() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * 3
    cases = {
        "%y = aten._softmax.default(%x, -1, false) : f32[64, 256]": torch.softmax(x, -1),
        "%y = aten.var.correction(%x, [1], correction=1) : f32[64]": x.var(1),
        "%y, %m, %r = aten.native_layer_norm.default(%x, [256], none, none, 1e-05) : "
        "(f32[64, 256], f32[64, 1], f32[64, 1])":
            torch.nn.functional.layer_norm(x, [256]),
    }
    for body, want in cases.items():
        m = _module(body, f"f32{list(want.shape)}", "%y")
        assert _calls(m) == ["kernels.call"], body
        torch.testing.assert_close(_run(m, [x])[0], want)


def test_mean_and_var_of_the_same_rows_share_one_kernel() -> None:
    m = _module("%v = aten.var.correction(%x, [1], correction=0) : f32[64]\n"
                "  %s = aten.mean.dim(%x, [1]) : f32[64]\n"
                "  %a = aten.amax.default(%x, [1]) : f32[64]",
                "f32[64], f32[64], f32[64]", "%v, %s, %a")
    compiled = compile_module(m)
    calls = [n for n in compiled.graph("f").nodes if n.op == "kernels.call"]
    assert len(calls) == 1 and len(calls[0].results) == 3
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) + 100
    v, s, a = _run(m, [x])
    torch.testing.assert_close(v, x.var(1, correction=0))  # two passes: no cancellation
    torch.testing.assert_close(s, x.mean(1))
    torch.testing.assert_close(a, x.amax(1))
    unfused = run_pipeline(m, "decompose,lower-loops,fuse{horizontal=false}")
    assert len(unfused.graph("f").nodes) == 3


def test_fuse_explain_prints_why_edges_stay_unfused(capsys: pytest.CaptureFixture[str]) -> None:
    m = _module("%s = prims.sum(%x, dims=[1]) : f32[64]\n"
                "  %b = prims.broadcast_in_dim(%s, shape=[64, 256], broadcast_dims=[0]) : "
                "f32[64, 256]\n"
                "  %y = prims.sub(%x, %b) : f32[64, 256]",
                "f32[64], f32[64, 256]", "%s, %y")
    run_pipeline(m, "lower-loops,fuse{explain=true}")
    err = capsys.readouterr().err
    assert "fuse: @f: %s -> %y: %s is a graph output" in err
    run_pipeline(m, "lower-loops,fuse")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("op", ["aten.div.Tensor_mode", "aten.remainder.Tensor",
                                "aten.fmod.Tensor"])
def test_integer_division_by_zero_raises_like_eager(op: str) -> None:
    m = Module()
    gb = GraphBuilder(m, "f")
    a, b = (gb.param(n, TensorType(DType.i64, (4,))) for n in ("a", "b"))
    kw = {"rounding_mode": "trunc"} if op.endswith("mode") else {}
    outs: list[Value] = [gb.op(op, [a, b], kw)]
    gb.ret(outs)
    run = compiled_runner(compile_module(m))
    x = torch.tensor([5, -7, 9, 3])
    fn = {"aten.div.Tensor_mode": lambda p, q: torch.div(p, q, rounding_mode="trunc"),
          "aten.remainder.Tensor": torch.remainder, "aten.fmod.Tensor": torch.fmod}[op]
    torch.testing.assert_close(run(None, [x, torch.tensor([2, 3, -4, 1])]).outputs[0],
                               fn(x, torch.tensor([2, 3, -4, 1])))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x, torch.tensor([2, 0, 1, 1]))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run(None, [x, torch.tensor([2, 0, 1, 1])])
    # the flag is cleared: the next good call runs
    run(None, [x, torch.tensor([1, 1, 1, 1])])
