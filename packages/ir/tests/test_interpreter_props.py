"""The reference interpreter against torch itself: running a generated module with
`ember.ir.Interpreter` gives bitwise what calling the same torch ops directly gives, with symbols
bound from the actual input sizes, `graph.call`, and `input_updates` written back in place.
The verifier accepts every generated module."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given

from ember.ir import (
    DType,
    GraphBuilder,
    Interpreter,
    InterpretError,
    Module,
    Symbol,
    TensorType,
    parse,
    print_module,
    symbol,
    verify,
)
from packages.ir.tests import runnable_modules as R
from packages.ir.tests import strategies as S

CaseInputs = tuple[R.RunnableCase, tuple[dict[str, int], list[Any]]]


def assert_same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert R.same_value(a, b), f"result {i}: interpreter {a!r}\ndirect torch {b!r}"


def used_symbols(case: R.RunnableCase) -> set[str]:
    out: set[str] = set()
    for p in case.graph.params:
        out |= p.type.free_symbols()
    return out


@S.slow_draws
@given(R.cases_with_inputs())
def test_interpreter_equals_direct_torch_calls(ci: CaseInputs) -> None:
    case, (env, inputs) = ci
    want_out, want_updates = case.expected(R.clone_inputs(inputs), env)
    before = R.clone_inputs(inputs)
    res = Interpreter(case.module).run(inputs, case.entry)
    assert_same(res.outputs, want_out)
    assert sorted(res.updates) == sorted(want_updates)
    for p, v in want_updates.items():
        assert R.same_value(res.updates[p], v)
    # symbols are bound from the actual sizes (which vary between examples, hints or not)
    assert res.env == {s: env[s] for s in used_symbols(case)}
    assert_same(inputs, before)  # without apply_updates nothing is written


@S.slow_draws
@given(R.cases_with_inputs())
def test_apply_updates_writes_into_the_inputs(ci: CaseInputs) -> None:
    case, (env, inputs) = ci
    want_out, want_updates = case.expected(R.clone_inputs(inputs), env)
    originals = list(inputs)
    res = Interpreter(case.module).run(inputs, case.entry, apply_updates=True)
    for i, x in enumerate(inputs):
        assert x is originals[i]  # in place: the very tensors the caller passed
        if i in want_updates:
            assert R.same_value(x, want_updates[i])
    assert len(res.outputs) == len(want_out)
    for got, want in zip(res.outputs, want_out, strict=True):
        # outputs keep value semantics even where they alias an input that was written back
        assert R.same_value(got, want)


@S.slow_draws
@given(R.runnable_cases())
def test_verifier_accepts_generated_modules(case: R.RunnableCase) -> None:
    verify(case.module)


@S.slow_draws
@given(R.cases_with_inputs())
def test_reparsed_module_runs_the_same(ci: CaseInputs) -> None:
    case, (env, inputs) = ci
    again = parse(print_module(case.module))
    verify(again)
    a = Interpreter(case.module).run(R.clone_inputs(inputs), case.entry)
    b = Interpreter(again).run(R.clone_inputs(inputs), case.entry)
    assert_same(b.outputs, a.outputs)
    assert b.env == a.env


# ---- explicit cases ------------------------------------------------------------------------

STEP = """\
ember.ir 1.0

graph @step(%p: f32[4], %g: f32[4]) -> (f32[], f32[4]) attrs(input_updates=[[0, 1]]) {
  %p1 = aten.add.Tensor(%p, %g, alpha=-0.1) : f32[4]
  %l = aten.sum.default(%p1) : f32[]
  return (%l, %p1)
}
"""


def test_spec_step_updates_its_parameter_in_place() -> None:
    m = parse(STEP)
    verify(m)
    p, g = torch.randn(4), torch.randn(4)
    want_p = torch.add(p, g, alpha=-0.1)
    want_l = torch.sum(want_p)
    res = Interpreter(m).run([p, g], apply_updates=True)
    assert R.same_value(p, want_p)
    assert_same(res.outputs, [want_l])
    q = torch.zeros(4)
    res = Interpreter(m).run([q, g])  # without apply_updates: reported, not written
    assert torch.equal(q, torch.zeros(4))
    assert R.same_value(res.updates[0], torch.add(q, g, alpha=-0.1))


SYMBOLIC = """\
ember.ir 1.0

symbol s0 hint=3 min=1
symbol s1 hint=2

graph @inner(%a: f32[s0 * 2, s1]) -> (f32[s1], f32[s0 * 2]) {
  %m, %i = aten.max.dim(%a, 0) : (f32[s1], i64[s1])
  %s = aten.sum.dim_IntList(%a, [1]) : f32[s0 * 2]
  return (%m, %s)
}

graph @main(%x: f32[s0 * 2, s1], %y: f32[s0, 2, s1]) -> (f32[s1], f32[s0 * 2]) {
  %v = aten.view.default(%y, [s0 * 2, s1]) : f32[s0 * 2, s1]
  %z = aten.add.Tensor(%x, %v) : f32[s0 * 2, s1]
  %m, %s = graph.call(@inner, %z) : (f32[s1], f32[s0 * 2])
  return (%m, %s)
}
"""


@pytest.mark.parametrize("s0, s1", [(1, 0), (1, 1), (3, 2), (5, 7)])
def test_symbols_bind_from_input_sizes_through_graph_call(s0: int, s1: int) -> None:
    m = parse(SYMBOLIC)
    verify(m)
    x, y = torch.randn(s0 * 2, s1), torch.randn(s0, 2, s1)
    res = Interpreter(m).run([x, y], "main")
    assert res.env == {"s0": s0, "s1": s1}
    z = x + y.view(s0 * 2, s1)
    assert_same(res.outputs, [torch.max(z, 0).values, torch.sum(z, [1])])


def test_inconsistent_sizes_are_refused() -> None:
    m = parse(SYMBOLIC)
    with pytest.raises(InterpretError):  # s0 * 2 = 4 from %x, but %y says s0 = 3
        Interpreter(m).run([torch.randn(4, 2), torch.randn(3, 2, 2)], "main")
    with pytest.raises(InterpretError):  # an odd size is no s0 * 2
        Interpreter(m).run([torch.randn(5, 2)], "inner")


def test_builder_module_with_every_listed_op_runs() -> None:
    """One hand-built module with each op kind the strategies use, against direct calls."""
    m = Module()
    m.add_symbol(Symbol("s0", hint=4, min=1))
    s0 = symbol("s0")
    gb = GraphBuilder(m, "g")
    x = gb.param("x", TensorType(DType.f32, (s0, 3)))
    c = gb.param("c", TensorType(DType.b8, (3,)))
    t = lambda *shape: TensorType(DType.f32, shape)  # noqa: E731
    a = gb.op("aten.add.Tensor", [x, x], {"alpha": 2.5}, type=t(s0, 3))
    w = gb.op("aten.where.self", [c, a, x], type=t(s0, 3))
    k = gb.op("aten.clamp.default", [w], {"min": -0.5, "max": 0.5}, type=t(s0, 3))
    sm = gb.op("aten.sum.dim_IntList", [k, [1]], {"keepdim": True}, type=t(s0, 1))
    mx, ix = gb.emit("aten.max.dim", [k, 1], {"keepdim": False},
                     types=[t(s0), TensorType(DType.i64, (s0,))])
    ct = gb.op("aten.cat.default", [[k, sm]], {"dim": 1}, type=t(s0, 4))
    pv = gb.op("aten.permute.default", [ct, [1, 0]], type=t(4, s0))
    vw = gb.op("aten.view.default", [ct, [s0 * 4]], type=t(s0 * 4))
    sp = gb.emit("aten.split.Tensor", [ct, 3, 1], types=[t(s0, 3), t(s0, 1)])
    cp = gb.op("aten._to_copy.default", [ix], {"dtype": DType.f64},
               type=TensorType(DType.f64, (s0,)))
    fl = gb.op("aten.full.default", [[s0, 2], -0.0], {"dtype": DType.f16},
               type=TensorType(DType.f16, (s0, 2)))
    ms = gb.op("aten.mul.Scalar", [mx, float("nan")], type=t(s0))
    gb.ret([pv, vw, sp[1], cp, fl, ms])
    verify(m)
    for n in (1, 2, 6):
        xv, cv = torch.randn(n, 3), torch.tensor([True, False, True])
        res = Interpreter(m).run([xv, cv])
        av = torch.add(xv, xv, alpha=2.5)
        kv = torch.clamp(torch.where(cv, av, xv), min=-0.5, max=0.5)
        mxv, ixv = torch.max(kv, 1)
        ctv = torch.cat([kv, torch.sum(kv, [1], keepdim=True)], dim=1)
        assert_same(res.outputs, [ctv.permute(1, 0), ctv.view(n * 4), torch.split(ctv, 3, 1)[1],
                                  ixv.to(torch.float64), torch.full((n, 2), -0.0,
                                                                    dtype=torch.float16),
                                  torch.mul(mxv, float("nan"))])


def test_apply_updates_keeps_value_semantics_for_aliasing_outputs() -> None:
    m = parse("""\
ember.ir 1.0

graph @step(%p: f32[4], %g: f32[4]) -> (f32[4], f32[2], f32[4]) attrs(input_updates=[[0, 2]]) {
  %a, %b = aten.split.Tensor(%p, 2) : (f32[2], f32[2])
  %p1 = aten.add.Tensor(%p, %g) : f32[4]
  return (%p, %a, %p1)
}
""")
    p, g = torch.zeros(4), torch.ones(4)
    res = Interpreter(m).run([p, g], apply_updates=True)
    assert torch.equal(p, torch.ones(4))
    assert_same(res.outputs, [torch.zeros(4), torch.zeros(2)])
