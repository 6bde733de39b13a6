"""The generated straight-line call of a compiled graph (ember.inductor.wrapper): same outputs
and input updates as the interpreter on the same compiled module, used by `compiled_runner`,
clear errors on wrong inputs, and the interpreter kept for what it does not cover."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, Module, parse

# Pointwise, a reduction with two results (max.dim), an extern (addmm's matmul), a view and
# a graph that updates its input; {n} is the batch size.
TEXT = """ember.ir 1.0

{symbols}graph @mlp(%x: f32[{n}, 16], %w1: f32[32, 16], %b1: f32[32], %w2: f32[4, 32], %b2: f32[4]) -> (f32[{n}, 4], f32[{n}], i64[{n}], f32[{n4}]) {{
  %w1t = aten.t.default(%w1) : f32[16, 32]
  %h = aten.addmm.default(%b1, %x, %w1t) : f32[{n}, 32]
  %a = aten.gelu.default(%h, approximate="tanh") : f32[{n}, 32]
  %w2t = aten.t.default(%w2) : f32[32, 4]
  %y = aten.addmm.default(%b2, %a, %w2t) : f32[{n}, 4]
  %m, %i = aten.max.dim(%y, 1) : (f32[{n}], i64[{n}])
  %flat = aten.view.default(%y, [{n4}]) : f32[{n4}]
  return (%y, %m, %i, %flat)
}}

graph @sgd_step(%p: f32[32, 16], %g: f32[32, 16], %lr: f64) -> (f32[], f32[32, 16]) attrs(input_updates=[[0, 1]]) {{
  %step = aten.mul.Tensor(%g, %lr) : f32[32, 16]
  %p1 = aten.sub.Tensor(%p, %step) : f32[32, 16]
  %sq = aten.mul.Tensor(%p1, %p1) : f32[32, 16]
  %norm = aten.sum.default(%sq) : f32[]
  return (%norm, %p1)
}}
"""

_COMPILED: dict[str, Module] = {}


def compiled(symbolic: bool = False) -> Module:
    key = "sym" if symbolic else "static"
    if key not in _COMPILED:
        text = TEXT.format(symbols="symbol s0 hint=8 min=1\n\n", n="s0", n4="s0 * 4") \
            if symbolic else TEXT.format(symbols="", n=8, n4=32)
        _COMPILED[key] = compile_module(parse(text))
    return _COMPILED[key]


def mlp_inputs(seed: int, transposed: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 8, generator=g).t() if transposed else torch.randn(8, 16, generator=g)
    return [x, torch.randn(32, 16, generator=g), torch.randn(32, generator=g),
            torch.randn(4, 32, generator=g), torch.randn(4, generator=g)]


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@settings(max_examples=20)
@given(seed=st.integers(0, 2**31 - 1), transposed=st.booleans())
def test_wrapper_matches_the_interpreter(seed: int, transposed: bool) -> None:
    m = compiled()
    ins = mlp_inputs(seed, transposed)
    want = Interpreter(m).run(ins, "mlp")
    got = generate(m, "mlp").call(ins)
    _same(got.outputs, want.outputs)
    assert got.updates == {}


def test_input_updates_are_returned() -> None:
    m = compiled()
    g = torch.Generator().manual_seed(1)
    ins = [torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g), 0.5]
    want = Interpreter(m).run(ins, "sgd_step")
    got = generate(m, "sgd_step").call(ins)
    _same(got.outputs, want.outputs)
    assert list(got.updates) == [0] and torch.equal(got.updates[0], want.updates[0])


def test_compiled_runner_runs_no_node_through_the_interpreter(monkeypatch: Any) -> None:
    m = compiled()
    run = compiled_runner(m)
    ins = mlp_inputs(3)
    want = Interpreter(m).run(ins, "mlp").outputs

    def no(*a: Any) -> None:
        raise AssertionError("the interpreter ran a node")
    monkeypatch.setattr(Interpreter, "_run_node", no)
    _same(run("mlp", ins).outputs, want)
    _same(run("mlp", ins).outputs, want)


def test_generated_source_calls_the_kernels_directly() -> None:
    m = compiled()
    w = generate(m, "mlp")
    calls = sum(1 for g in [m.graph("mlp")] for n in g.nodes if n.op == "kernels.call")
    assert calls >= 2
    assert w.source.count(".data_ptr()") >= 2 * calls  # inputs and outputs by address
    assert "_run_node" not in w.source


def test_wrong_inputs_are_a_clear_error() -> None:
    w = generate(compiled(), "mlp")
    ins = mlp_inputs(0)
    with pytest.raises(RuntimeError, match=r"input %x is torch.float32 \(5, 16\)"):
        w.call([torch.randn(5, 16), *ins[1:]])
    with pytest.raises(RuntimeError, match="input %x is torch.float64"):
        w.call([ins[0].double(), *ins[1:]])
    with pytest.raises(RuntimeError, match="inputs is 2, expected 5"):
        w.call(ins[:2])


def test_symbolic_graphs_run_through_the_wrapper() -> None:
    """A symbolic graph's call binds s0 from the input and computes every size from it: one
    compiled module for every batch size, outputs as the interpreter's; a size outside the
    symbol's range or an inconsistent input is refused with a clear error."""
    m = compiled(symbolic=True)
    w = generate(m, "mlp")
    assert "s0 = p0.shape[0]" in w.source
    run = compiled_runner(m)
    for n in (1, 2, 5, 17):
        g = torch.Generator().manual_seed(n)
        ins = [torch.randn(n, 16, generator=g), *mlp_inputs(n)[1:]]
        _same(run("mlp", ins).outputs, Interpreter(m).run(ins, "mlp").outputs)
        _same(w.call(ins).outputs, Interpreter(m).run(ins, "mlp").outputs)
    bad = [torch.randn(0, 16), *mlp_inputs(0)[1:]]
    with pytest.raises(RuntimeError, match="size symbol s0 is 0 .* range \\[1, inf\\]"):
        w.call(bad)
    with pytest.raises(RuntimeError, match="rank"):
        w.call([torch.randn(16), *mlp_inputs(0)[1:]])
    with pytest.raises(RuntimeError, match="input %x"):
        w.call([torch.randn(3, 15), *mlp_inputs(0)[1:]])
