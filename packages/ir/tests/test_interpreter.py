"""The reference interpreter: symbol binding from input shapes, graph.call, input_updates,
multi-result ops, scalars, and the result-type check."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from ember.ir import Interpreter, InterpretError, RunResult, parse, run_graph, verify
from ember.ir.interpreter import failed_node


def ir(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def run(text: str, inputs: list[object], graph: str | None = None, *, check_types: bool = True,
        apply_updates: bool = False) -> RunResult:
    m = parse(text)
    verify(m)
    return Interpreter(m, check_types=check_types).run(inputs, graph, apply_updates=apply_updates)


def fails(text: str, inputs: list[object], message: str) -> InterpretError:
    m = parse(text)
    with pytest.raises(InterpretError, match=re.escape(message)) as ei:
        Interpreter(m).run(inputs)
    return ei.value


# ---- symbol binding -----------------------------------------------------------------------

BARE = ir("""
    ember.ir 1.0
    symbol s0 hint=8 min=2
    symbol s1 hint=3
    graph @f(%x: f32[s0, s1], %y: f32[s1]) -> (f32[s0, s1], f32[s1 * s0]) {
      %z = aten.add.Tensor(%x, %y) : f32[s0, s1]
      %v = aten.view.default(%z, [s1 * s0]) : f32[s1 * s0]
      return (%z, %v)
    }
""")


def test_bare_symbols_bound_from_input_shapes() -> None:
    x, y = torch.randn(5, 2), torch.randn(2)
    res = run(BARE, [x, y])
    assert res.env == {"s0": 5, "s1": 2}
    torch.testing.assert_close(res.outputs[0], x + y)
    torch.testing.assert_close(res.outputs[1], (x + y).reshape(10))


def test_symbol_conflict() -> None:
    fails(BARE, [torch.randn(5, 2), torch.randn(3)], "input %y: dim 0 is 3 but s1 is already 2")


def test_linear_dim_solved_when_symbol_is_nowhere_bare() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=4
        graph @f(%x: f32[s0 * 2 + 1]) -> (f32[s0]) {
          %a = aten.slice.Tensor(%x, 0, 0, s0) : f32[s0]
          return (%a)
        }
    """)
    x = torch.arange(7, dtype=torch.float32)
    res = run(text, [x])
    assert res.env == {"s0": 3}
    torch.testing.assert_close(res.outputs[0], x[:3])


def test_linear_dim_without_integer_solution() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=4
        graph @f(%x: f32[s0 * 2]) -> (f32[s0 * 2]) {
          return (%x)
        }
    """)
    err = fails(text, [torch.randn(7)], "input %x: dim 0 is 7, and no binding of s0 makes s0 * 2")
    assert "equal to it" in str(err)
    assert run(text, [torch.randn(8)]).env == {"s0": 4}


def test_expression_dim_checked_after_binding() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=4
        graph @f(%x: f32[s0], %y: f32[s0 + 1]) -> (f32[s0]) {
          return (%x)
        }
    """)
    assert run(text, [torch.randn(3), torch.randn(4)]).env == {"s0": 3}
    fails(text, [torch.randn(3), torch.randn(5)], "input %y: dim 0 is 5, expected s0 + 1 = 4")


def test_constant_dim_checked() -> None:
    text = "ember.ir 1.0\ngraph @f(%x: f32[4]) -> (f32[4]) {\n  return (%x)\n}\n"
    fails(text, [torch.randn(5)], "input %x: dim 0 is 5, expected 4")


@pytest.mark.parametrize(("inputs", "message"), [
    ([torch.randn(5, 2, dtype=torch.float64), torch.randn(2)],
     "input %x: dtype torch.float64 but the graph says f32[s0, s1]"),
    ([torch.randn(10), torch.randn(2)], "input %x: rank 1 but the graph says f32[s0, s1]"),
    ([3.0, torch.randn(2)], "input %x must be a tensor of type f32[s0, s1], got float"),
    ([torch.randn(5, 2)], "@f takes 2 inputs, got 1"),
])
def test_bad_inputs(inputs: list[object], message: str) -> None:
    fails(BARE, inputs, message)


# ---- scalars --------------------------------------------------------------------------------

SCALARS = ir("""
    ember.ir 1.0
    symbol s0 hint=8
    graph @f(%x: f32[s0, 3], %n: i64, %a: f64, %flag: bool) -> (i64, f32[s0, 3], f32[s0, 3]) {
      %k = aten.sym_size.int(%x, 0) : i64
      %y = aten.mul.Scalar(%x, %n) : f32[s0, 3]
      %z = aten.add.Tensor(%x, %y, alpha=%a) : f32[s0, 3]
      return (%k, %y, %z)
    }
""")


def test_scalar_inputs_and_sym_size_result() -> None:
    x = torch.randn(5, 3)
    res = run(SCALARS, [x, 4, 0.5, True])
    k, y, z = res.outputs
    assert k == 5 and type(k) is int
    torch.testing.assert_close(y, x * 4)
    torch.testing.assert_close(z, x + 0.5 * (x * 4))


def test_f64_input_accepts_int() -> None:
    res = run(SCALARS, [torch.randn(2, 3), 1, 2, False])
    assert res.outputs[0] == 2


@pytest.mark.parametrize(("inputs", "message"), [
    ([1.5, 0.5, True], "input %n must be a Python i64, got float"),
    ([True, 0.5, True], "input %n must be a Python i64, got bool"),
    ([1, "x", True], "input %a must be a Python f64, got str"),
    ([1, 0.5, 1], "input %flag must be a Python bool, got int"),
    ([1, True, True], "input %a must be a Python f64, got bool"),
    ([torch.tensor(1), 0.5, True], "input %n must be a Python i64, got Tensor"),
])
def test_bad_scalar_inputs(inputs: list[object], message: str) -> None:
    fails(SCALARS, [torch.randn(2, 3), *inputs], message)


# ---- multi-result ops ---------------------------------------------------------------------

def test_split_and_max_dim() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[5, 4]) -> (f32[2, 4], f32[2, 4], f32[1, 4], f32[5], i64[5]) {
          %a, %b, %c = aten.split.Tensor(%x, 2) : (f32[2, 4], f32[2, 4], f32[1, 4])
          %m, %i = aten.max.dim(%x, 1) : (f32[5], i64[5])
          return (%a, %b, %c, %m, %i)
        }
    """)
    x = torch.randn(5, 4)
    outs = run(text, [x]).outputs
    for got, want in zip(outs[:3], torch.split(x, 2), strict=True):
        torch.testing.assert_close(got, want)
    m, i = torch.max(x, 1)
    torch.testing.assert_close(outs[3], m)
    torch.testing.assert_close(outs[4], i)


def test_split_into_one_piece() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[2, 4]) -> (f32[2, 4]) {
          %a = aten.split.Tensor(%x, 2) : f32[2, 4]
          return (%a)
        }
    """)
    x = torch.randn(2, 4)
    torch.testing.assert_close(run(text, [x]).outputs[0], x)


def test_wrong_result_count_at_run_time() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[5, 4]) -> (f32[2, 4], f32[3, 4]) {
          %a, %b = aten.split.Tensor(%x, 2) : (f32[2, 4], f32[3, 4])
          return (%a, %b)
        }
    """)
    err = fails(text, [torch.randn(5, 4)], "3:3: aten.split.Tensor returned 3 results, the node "
                "declares 2")
    assert err.node is not None and err.node.op == "aten.split.Tensor"


# ---- graph.call ---------------------------------------------------------------------------

CALLS = ir("""
    ember.ir 1.0

    symbol s0 hint=4
    symbol s1 hint=3

    graph @inner(%a: f32[s1, 2], %b: f32[2]) -> (f32[s1, 2], f32[s1]) {
      %c = aten.mul.Tensor(%a, %b) : f32[s1, 2]
      %d = aten.sum.dim_IntList(%c, [1]) : f32[s1]
      return (%c, %d)
    }

    graph @outer(%x: f32[s0 * 2, 2], %w: f32[2]) -> (f32[s0 * 2]) {
      %p, %q = graph.call(@inner, %x, %w) : (f32[s0 * 2, 2], f32[s0 * 2])
      %r, %t = graph.call(@inner, %p, %w) : (f32[s0 * 2, 2], f32[s0 * 2])
      %u = aten.add.Tensor(%q, %t) : f32[s0 * 2]
      return (%u)
    }
""")


def test_graph_call_with_callee_symbols() -> None:
    x, w = torch.randn(6, 2), torch.randn(2)
    res = run(CALLS, [x, w], "outer")
    assert res.env == {"s0": 3}
    want = (x * w).sum(1) + (x * w * w).sum(1)
    torch.testing.assert_close(res.outputs[0], want)


def test_graph_call_of_callee_directly() -> None:
    x, w = torch.randn(5, 2), torch.randn(2)
    res = run(CALLS, [x, w], "inner")
    assert res.env == {"s1": 5}
    torch.testing.assert_close(res.outputs[1], (x * w).sum(1))


def test_graph_call_sees_every_result_without_updates() -> None:
    text = ir("""
        ember.ir 1.0

        graph @step(%p: f32[4], %g: f32[4]) -> (f32[], f32[4]) attrs(input_updates=[[0, 1]]) {
          %p1 = aten.add.Tensor(%p, %g) : f32[4]
          %l = aten.sum.default(%p1) : f32[]
          return (%l, %p1)
        }

        graph @main(%p: f32[4], %g: f32[4]) -> (f32[], f32[4]) {
          %l, %p1 = graph.call(@step, %p, %g) : (f32[], f32[4])
          return (%l, %p1)
        }
    """)
    p, g = torch.ones(4), torch.full((4,), 2.0)
    l, p1 = run(text, [p, g], "main", apply_updates=True).outputs
    torch.testing.assert_close(p1, torch.full((4,), 3.0))
    torch.testing.assert_close(p, torch.ones(4))  # graph.call applies no update


def test_graph_call_input_error_names_the_callee() -> None:
    text = ir("""
        ember.ir 1.0
        graph @inner(%a: f32[3]) -> (f32[3]) {
          return (%a)
        }
        graph @outer(%x: f32[4]) -> (f32[3]) {
          %y = graph.call(@inner, %x) : f32[3]
          return (%y)
        }
    """)
    m = parse(text)
    with pytest.raises(InterpretError, match=re.escape("input %a: dim 0 is 4, expected 3")):
        Interpreter(m).run([torch.randn(4)], "outer")


# ---- input_updates --------------------------------------------------------------------------

STEP = ir("""
    ember.ir 1.0
    graph @step(%p: f32[4], %g: f32[4]) -> (f32[], f32[4]) attrs(input_updates=[[0, 1]]) {
      %p1 = aten.add.Tensor(%p, %g, alpha=-0.5) : f32[4]
      %l = aten.sum.default(%p1) : f32[]
      return (%l, %p1)
    }
""")


def test_input_updates_applied_in_place() -> None:
    p, g = torch.ones(4), torch.full((4,), 2.0)
    p_before = p.data_ptr()
    res = run(STEP, [p, g], apply_updates=True)
    assert len(res.outputs) == 1
    torch.testing.assert_close(res.outputs[0], torch.tensor(0.0))
    torch.testing.assert_close(p, torch.zeros(4))
    assert p.data_ptr() == p_before
    assert list(res.updates) == [0]
    torch.testing.assert_close(res.updates[0], torch.zeros(4))
    torch.testing.assert_close(g, torch.full((4,), 2.0))


def test_input_updates_not_applied_unless_asked() -> None:
    p, g = torch.ones(4), torch.full((4,), 2.0)
    res = run(STEP, [p, g])
    torch.testing.assert_close(p, torch.ones(4))
    torch.testing.assert_close(res.updates[0], torch.zeros(4))
    assert run_graph(parse(STEP), [p, g])[0].shape == ()


def test_input_updates_work_on_leaf_that_requires_grad() -> None:
    p = torch.ones(4, requires_grad=True)
    run(STEP, [p, torch.full((4,), 2.0)], apply_updates=True)
    torch.testing.assert_close(p.detach(), torch.zeros(4))


# ---- check_types ------------------------------------------------------------------------------

LIAR = ir("""
    ember.ir 1.0
    symbol s0 hint=4
    graph @f(%x: f32[s0]) -> (f32[s0]) {
      %y = aten.neg.default(%x) : TYPE
      return (%x)
    }
""")


@pytest.mark.parametrize(("declared", "message"), [
    ("f32[s0 + 1]", "4:3: aten.neg.default: result is torch.float32 (3,), declared f32[s0 + 1] "
     "= (4,)"),
    ("f64[s0]", "4:3: aten.neg.default: result is torch.float32 (3,), declared f64[s0]"),
    ("f32[s0, 1]", "declared f32[s0, 1] = (3, 1)"),
    ("i64", "4:3: aten.neg.default: result is a tensor, declared scalar i64"),
])
def test_check_types_catches_a_lying_type(declared: str, message: str) -> None:
    text = LIAR.replace("TYPE", declared)
    fails(text, [torch.randn(3)], message)
    # without the check the graph runs (and the lie goes unnoticed)
    m = parse(text)
    assert Interpreter(m, check_types=False).run([torch.randn(3)]).outputs[0].shape == (3,)


def test_check_types_on_scalar_results() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[3]) -> (bool) {
          %k = aten.sym_size.int(%x, 0) : bool
          return (%k)
        }
    """)
    fails(text, [torch.randn(3)], "3:3: aten.sym_size.int: result is int 3, declared scalar bool")
    fails(text.replace(": bool\n", ": f32[3]\n"), [torch.randn(3)],
          "aten.sym_size.int: result is int, declared f32[3]")


def test_check_types_with_a_symbol_no_input_binds() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=4
        symbol s1 hint=4
        graph @f(%x: f32[s0]) -> (f32[s0]) {
          %y = aten.neg.default(%x) : f32[s1]
          return (%x)
        }
    """)
    fails(text, [torch.randn(3)], "5:3: aten.neg.default: cannot check the result against f32[s1]:"
          " symbol s1 is not bound")


# ---- failures of ops ------------------------------------------------------------------------

def test_unknown_op() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[3]) -> (f32[3]) {
          %y = mydialect.frob(%x) : f32[3]
          return (%y)
        }
    """)
    fails(text, [torch.randn(3)], "3:3: unknown op mydialect.frob")


def test_op_failure_keeps_its_type_with_position() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=4
        graph @f(%x: f32[s0, 3], %y: f32[s0, 3]) -> (f32[s0, s0]) {
          %z = aten.mm.default(%x, %y) : f32[s0, s0]
          return (%z)
        }
    """)
    # as eager raises it (issue 19 #11), with the node's position in a note
    with pytest.raises(RuntimeError, match="cannot be multiplied") as ei:
        Interpreter(parse(text)).run([torch.randn(4, 3), torch.randn(4, 3)])
    assert not isinstance(ei.value, InterpretError)
    assert "ember.ir: raised by aten.mm.default at line 4:3" in ei.value.__notes__
    assert failed_node(ei.value) is not None
