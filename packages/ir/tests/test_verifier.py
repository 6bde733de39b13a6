"""The verifier: every rule is shown to reject a violating module, at the right line:col, and to
accept the valid twin.

Modules are read from hand-written text where the parser lets the violation through, and built
with the data classes where the parser already refuses it (use before definition, duplicate
names, undeclared symbols).
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from ember.ir import (
    DType,
    Graph,
    Module,
    Node,
    Pos,
    Symbol,
    TensorType,
    Value,
    VerificationError,
    VerifyError,
    check,
    parse,
    run_graph,
    symbol,
    verify,
)
from packages.ir.tests import strategies as S


def ir(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def rejected(module_or_text: Module | str, needle: str, line: int | None, col: int | None = None,
             *, allow_unregistered: bool = False) -> VerifyError:
    """Assert that verification fails with an error containing `needle` at `line:col`."""
    m = parse(module_or_text) if isinstance(module_or_text, str) else module_or_text
    with pytest.raises(VerificationError) as ei:
        verify(m, allow_unregistered=allow_unregistered)
    hits = [e for e in ei.value.errors if needle in e.message]
    assert hits, f"no error mentions {needle!r}: {[str(e) for e in ei.value.errors]}"
    err = hits[0]
    if line is None:
        assert err.pos is None
    else:
        assert err.pos == Pos(line, col or 0), str(err)
        assert str(err).startswith(f"{line}:{col}: ")
    return err


def accepted(module_or_text: Module | str, *, allow_unregistered: bool = False) -> Module:
    m = parse(module_or_text) if isinstance(module_or_text, str) else module_or_text
    assert check(m, allow_unregistered=allow_unregistered) == []
    return m


SPEC_EXAMPLE = ir(S.SPEC_EXAMPLE)


def test_spec_example_verifies() -> None:
    accepted(SPEC_EXAMPLE)


def test_error_carries_position_and_all_violations() -> None:
    m = parse(ir("""
        ember.ir 1.0
        graph @f(%x: f32[4]) -> (f32[4]) {
          %a = aten.neg.default(%x) : i64[4]
          %b = aten.neg.default(%x) : f32[5]
          return (%x)
        }
    """))
    with pytest.raises(VerificationError) as ei:
        verify(m)
    e = ei.value
    assert (e.line, e.col) == (3, 3)
    assert [err.pos for err in e.errors] == [Pos(3, 3), Pos(4, 3)]
    assert "(and 1 more)" in str(e)


# ---- SSA: undefined and duplicate values (the parser refuses these, so build them) ----------

SSA_TEXT = ir("""
    ember.ir 1.0
    graph @f(%x: f32[4]) -> (f32[4]) {
      %a = aten.neg.default(%x) : f32[4]
      %b = aten.relu.default(%a) : f32[4]
      return (%b)
    }
""")


def test_use_before_definition() -> None:
    m = accepted(SSA_TEXT)
    m.graph().nodes.reverse()  # the relu (line 4) now uses %a before the neg defines it
    rejected(m, "aten.relu.default: operand %a is not defined before its use", 4, 3)


def test_undefined_operand() -> None:
    m = accepted(SSA_TEXT)
    node = m.graph().nodes[1]
    node.args = [Value("ghost", TensorType(DType.f32, (4,)))]
    rejected(m, "operand %ghost is not defined", 4, 3)


def test_undefined_returned_value() -> None:
    m = accepted(SSA_TEXT)
    m.graph().outputs = [Value("ghost", TensorType(DType.f32, (4,)))]
    rejected(m, "returned value %ghost is not defined", 2, 1)


def test_duplicate_value_name() -> None:
    m = accepted(SSA_TEXT)
    m.graph().nodes[1].results[0].name = "a"
    rejected(m, "value %a is defined twice", 4, 3)


def test_duplicate_parameter_name() -> None:
    t = TensorType(DType.f32, (4,))
    g = Graph("f", [Value("x", t), Value("x", t)], [t], [], [], pos=Pos(7, 1))
    g.outputs = [g.params[0]]
    m = Module(items={"f": g})
    rejected(m, "value %x is defined twice", 7, 1)
    g.params[1].name = "y"
    accepted(m)


def test_value_defined_by_two_nodes() -> None:
    m = accepted(SSA_TEXT)
    g = m.graph()
    again = Node("aten.neg.default", [g.params[0]], {}, [g.nodes[0].results[0]], pos=Pos(9, 3))
    g.nodes.insert(1, again)
    rejected(m, "value %a is defined by two nodes", 9, 3)


def test_node_without_results() -> None:
    m = accepted(SSA_TEXT)
    g = m.graph()
    g.nodes.insert(1, Node("aten.neg.default", [g.params[0]], {}, [], pos=Pos(3, 9)))
    rejected(m, "a node needs at least one result", 3, 9)


# ---- aten result types: dtype, rank, shape (at the symbols' hints), count ---------------------

ATEN = """
    ember.ir 1.0
    symbol s0 hint=8 min=2
    graph @f(%x: f32[s0, 4]) -> () {
      %y = aten.relu.default(%x) : TYPE
      return ()
    }
"""


@pytest.mark.parametrize(("declared", "needle"), [
    ("i64[s0, 4]", "result %y is declared i64[s0, 4], but the op gives f32[8, 4]"),
    ("f32[s0]", "result %y is declared f32[s0], but the op gives f32[8, 4]"),
    ("f32[s0, 5]", "at the symbols' hints it is [8, 5] and the op gives f32[8, 4]"),
    ("f32[s0 + 1, 4]", "at the symbols' hints it is [9, 4]"),
    ("f32[s0, 4]@cuda", "the op gives f32[8, 4]"),
])
def test_aten_result_type_mismatch(declared: str, needle: str) -> None:
    rejected(ir(ATEN.replace("TYPE", declared)), needle, 4, 3)


def test_aten_result_type_valid_twin() -> None:
    accepted(ir(ATEN.replace("TYPE", "f32[s0, 4]")))


def test_aten_types_are_compared_at_the_hints() -> None:
    # The meta kernel runs at the hints, so a declared constant equal to s0 * 4 at s0=8 passes:
    # the verifier states what it can check; the interpreter checks the real sizes.
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=8 min=2
        graph @f(%x: f32[s0, 4]) -> (f32[s0 * 4]) {
          %y = aten.view.default(%x, [s0 * 4]) : f32[s0 * 4]
          %z = aten.view.default(%x, [s0 * 4]) : f32[32]
          return (%y)
        }
    """)
    accepted(text)


def test_aten_missing_hint_is_reported() -> None:
    rejected(ir(ATEN.replace("TYPE", "f32[s0, 4]").replace(" hint=8", "")),
             "symbol s0 is not bound (declare a hint for it)", 4, 3)


@pytest.mark.parametrize(("results", "rtype", "ok"), [
    ("%m", "f32[8]", False),
    ("%m, %i, %j", "(f32[8], i64[8], i64[8])", False),
    ("%m, %i", "(f32[8], i64[8])", True),
])
def test_aten_result_count(results: str, rtype: str, ok: bool) -> None:
    text = ir(f"""
        ember.ir 1.0
        graph @f(%x: f32[8, 4]) -> () {{
          {results} = aten.max.dim(%x, 1) : {rtype}
          return ()
        }}
    """)
    if ok:
        accepted(text)
    else:
        n = results.count("%")
        rejected(text, f"aten.max.dim: declares {n} result(s), the op gives 2", 3, 3)


def test_aten_meta_kernel_rejects_arguments() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[8, 4], %y: f32[3, 5]) -> () {
          %z = aten.mm.default(%x, %y) : f32[8, 5]
          return ()
        }
    """)
    rejected(text, "aten.mm.default: its meta kernel rejected the arguments", 3, 3)
    accepted(text.replace("f32[3, 5]", "f32[4, 5]"))


def test_scalar_result_of_sym_size() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=8
        graph @f(%x: f32[s0, 4]) -> (i64) {
          %n = aten.sym_size.int(%x, 0) : i64
          return (%n)
        }
    """)
    accepted(text)
    rejected(text.replace(": i64\n", ": f64\n").replace("-> (i64)", "-> (f64)"),
             "result %n is declared f64, but the op gives i64", 4, 3)


# ---- unregistered ops -------------------------------------------------------------------

@pytest.mark.parametrize("op", ["mydialect.frob", "aten.no_such_op.default", "prims.no_such_op",
                                "aten.relu.NoSuchOverload"])
def test_unregistered_op(op: str) -> None:
    text = ir(f"""
        ember.ir 1.0
        graph @f(%x: f32[4]) -> (f32[4]) {{
          %y = {op}(%x) : f32[4]
          return (%y)
        }}
    """)
    rejected(text, f"unregistered op {op}", 3, 3)
    accepted(text, allow_unregistered=True)


# ---- @ references and graph.call ----------------------------------------------------------

CALL = """
    ember.ir 1.0
    graph @inner(%a: f32[4]) -> (f32[4]) {
      %b = aten.neg.default(%a) : f32[4]
      return (%b)
    }

    graph @outer(%x: f32[4]) -> (f32[4]) {
      %y = graph.call(CALLEE) : f32[4]
      return (%y)
    }
"""


def test_ref_to_missing_graph() -> None:
    rejected(ir(CALL.replace("CALLEE", "@nowhere, %x")), "@nowhere is not defined in this module",
             8, 3)
    accepted(ir(CALL.replace("CALLEE", "@inner, %x")))


def test_ref_to_missing_graph_in_attrs() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[4]) -> (f32[4]) attrs(backward=@nowhere) {
          return (%x)
        }
    """)
    rejected(text, "@f attrs: @nowhere is not defined in this module", 2, 1)
    accepted(text.replace("@nowhere", "@f"))


def test_graph_call_ref_to_kernel() -> None:
    text = ir(CALL.replace("CALLEE", "@k, %x")) + '\nkernel @k cpp """int x;"""\n'
    rejected(text, "graph.call: @k is not a graph of this module", 8, 3)


@pytest.mark.parametrize("args", ["@inner", "@inner, %x, %x"])
def test_graph_call_arity(args: str) -> None:
    n = args.count("%")
    rejected(ir(CALL.replace("CALLEE", args)), f"@inner takes 1 arguments, got {n}", 8, 3)


def test_graph_call_argument_type() -> None:
    text = ir(CALL.replace("CALLEE", "@inner, %x").replace("@outer(%x: f32[4])",
                                                             "@outer(%x: f32[5])"))
    rejected(text, "argument 1 of @inner (parameter %a: f32[4]) cannot be %x: f32[5]", 8, 3)


def test_graph_call_result_type() -> None:
    text = ir(CALL.replace("CALLEE", "@inner, %x")).replace(
        "graph.call(@inner, %x) : f32[4]", "graph.call(@inner, %x) : i64[4]")
    rejected(text, "result %y is declared i64[4], but the type rule gives f32[4]", 8, 3)


def test_graph_call_with_other_symbols() -> None:
    # The callee's symbols are bound from the arguments: s1 := s0 * 2 here.
    text = ir("""
        ember.ir 1.0

        symbol s0 hint=4
        symbol s1 hint=3

        graph @inner(%a: f32[s1, 3]) -> (f32[s1 * 3]) {
          %b = aten.view.default(%a, [s1 * 3]) : f32[s1 * 3]
          return (%b)
        }

        graph @outer(%x: f32[s0 * 2, 3]) -> (f32[s0 * 6]) {
          %y = graph.call(@inner, %x) : f32[s0 * 6]
          return (%y)
        }
    """)
    accepted(text)
    rejected(text.replace(": f32[s0 * 6]\n", ": f32[s0 * 3]\n").replace(
        "-> (f32[s0 * 6])", "-> (f32[s0 * 3])"),
        "is declared f32[s0 * 3], but the type rule gives f32[s0 * 6]", 12, 3)


# ---- the return -------------------------------------------------------------------------

RET = """
    ember.ir 1.0
    graph @f(%x: f32[4]) -> (RESULTS) {
      %y = aten.neg.default(%x) : f32[4]
      return (%y)
    }
"""


def test_return_type_mismatch() -> None:
    rejected(ir(RET.replace("RESULTS", "f32[5]")),
             "result 0 (%y) has type f32[4], the signature says f32[5]", 2, 1)
    rejected(ir(RET.replace("RESULTS", "f64[4]")), "the signature says f64[4]", 2, 1)
    accepted(ir(RET.replace("RESULTS", "f32[4]")))


def test_return_count_mismatch() -> None:
    rejected(ir(RET.replace("RESULTS", "f32[4], f32[4]")),
             "returns 1 values but declares 2 result types", 2, 1)


# ---- input_updates ----------------------------------------------------------------------

UPD = """
    ember.ir 1.0
    graph @step(%p: f32[4], %g: f32[4], %n: i64) -> (f32[], f32[4]) attrs(input_updates=UPD) {
      %p1 = aten.add.Tensor(%p, %g) : f32[4]
      %l = aten.sum.default(%p1) : f32[]
      return (%l, %p1)
    }
"""


@pytest.mark.parametrize(("updates", "needle"), [
    ("[[3, 1]]", "parameter index 3 out of range"),
    ("[[-1, 1]]", "parameter index -1 out of range"),
    ("[[0, 2]]", "result index 2 out of range"),
    ("[[0, 0]]", "result 0 has type f32[] but parameter %p has type f32[4]"),
    ("[[2, 1]]", "result 1 has type f32[4] but parameter %n has type i64"),
    ("[[0, 1], [1, 1]]", "parameter 1 or result 1 is named twice"),
    ("[[0, 1], [0, 1]]", "parameter 0 or result 1 is named twice"),
    ("[0, 1]", "expected a list of [parameter, result] index pairs"),
    ("[[0]]", "expected a list of [parameter, result] index pairs"),
    ("[[0, 1, 2]]", "expected a list of [parameter, result] index pairs"),
    ("[[true, 1]]", "expected a list of [parameter, result] index pairs"),
    ("[[0, 1.0]]", "expected a list of [parameter, result] index pairs"),
    ('"p"', "expected a list of [parameter, result] index pairs"),
])
def test_input_updates_rejected(updates: str, needle: str) -> None:
    rejected(ir(UPD.replace("UPD", updates)), "@step input_updates: " + needle, 2, 1)


@pytest.mark.parametrize("updates", ["[[0, 1]]", "[[1, 1]]", "[]"])
def test_input_updates_accepted(updates: str) -> None:
    accepted(ir(UPD.replace("UPD", updates)))


# ---- expressions: division by zero, undeclared symbols, hints ------------------------------

def test_division_by_zero_in_result_type() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=8 min=2
        graph @f(%x: f32[s0]) -> () {
          %y = aten.view.default(%x, [s0 // 1]) : f32[s0 // 1]
          return ()
        }
    """)
    accepted(text)
    err = rejected(text.replace("s0 // 1]) : f32[s0 // 1]", "s0]) : f32[s0 // 0]"),
                   "division by zero in s0 // 0", 4, 3)
    assert "result %y" in err.message


def test_division_by_zero_in_argument() -> None:
    text = ir("""
        ember.ir 1.0
        symbol s0 hint=8 min=2
        graph @f(%x: f32[s0]) -> () {
          %y = aten.view.default(%x, [s0 // 0]) : f32[s0]
          return ()
        }
    """)
    m = parse(text)
    errors = check(m)
    assert [str(e) for e in errors] == ["4:3: aten.view.default: division by zero in s0 // 0"]


@pytest.mark.parametrize(("dim", "shown"), [("s0 // 0", "s0 // 0"), ("mod(s0, 0)", "mod(s0, 0)"),
                                            ("2 // 0", "2 // 0"), ("s0 // (s0 - s0)", "s0 // 0")])
def test_division_by_zero_in_parameter_type(dim: str, shown: str) -> None:
    text = ir(f"""
        ember.ir 1.0
        symbol s0 hint=8
        graph @f(%x: f32[{dim}]) -> () {{
          return ()
        }}
    """)
    rejected(text, f"@f parameter %x: division by zero in {shown}", 3, 1)


@pytest.mark.parametrize(("decl", "ok"), [
    ("hint=1 min=2", False), ("hint=2 min=2", True), ("hint=9 min=2 max=8", False),
    ("hint=8 min=2 max=8", True), ("hint=0", True), ("hint=3 max=2", False), ("min=5", True),
])
def test_symbol_hint_within_bounds(decl: str, ok: bool) -> None:
    text = f"ember.ir 1.0\nsymbol s0 {decl}\n"
    if ok:
        accepted(text)
    else:
        err = rejected(text, "symbol s0: hint", None)
        assert "lies outside [" in err.message


def test_symbol_hint_outside_bounds_message() -> None:
    err = rejected("ember.ir 1.0\nsymbol s0 hint=1 min=2\n", "symbol s0", None)
    assert err.message == "symbol s0: hint 1 lies outside [2, inf]"


def test_undeclared_symbol_in_built_type() -> None:
    t = TensorType(DType.f32, (symbol("s7"), 4))
    x = Value("x", t)
    y = Value("y", TensorType(DType.f32, (symbol("s7") * 2, 4)))
    node = Node("aten.cat.default", [[x, x]], {}, [y], pos=Pos(3, 3))
    y.node = node
    g = Graph("f", [x], [t], [node], [x], pos=Pos(2, 1))
    m = Module(items={"f": g})
    errors = [str(e) for e in check(m)]
    assert "2:1: @f parameter %x: undeclared symbol(s) s7" in errors
    assert "3:3: aten.cat.default result %y: undeclared symbol(s) s7" in errors
    m.add_symbol(Symbol("s7", hint=5))
    accepted(m)


def test_undeclared_symbol_in_built_argument() -> None:
    m = accepted(ir("""
        ember.ir 1.0
        graph @f(%x: f32[4, 2]) -> () {
          %y = aten.view.default(%x, [8]) : f32[8]
          return ()
        }
    """))
    m.graph().nodes[0].args[1] = [symbol("s9") * 2]
    rejected(m, "aten.view.default: undeclared symbol(s) s9", 3, 3)


# ---- custom torch.library ops resolve out of the box -------------------------------------

def _define_custom_op() -> None:
    if hasattr(torch.ops.mylib, "myop"):
        return

    @torch.library.custom_op("mylib::myop", mutates_args=())
    def myop(x: torch.Tensor, k: int) -> torch.Tensor:
        return x.repeat(k) * 2

    @myop.register_fake
    def _(x: torch.Tensor, k: int) -> torch.Tensor:
        return x.new_empty(x.shape[0] * k)


CUSTOM = ir("""
    ember.ir 1.0
    symbol s0 hint=4 min=1
    graph @f(%x: f32[s0]) -> (f32[s0 * 3]) {
      %y = mylib.myop.default(%x, 3) : f32[s0 * 3]
      return (%y)
    }
""")


def test_custom_torch_library_op_verifies_and_runs() -> None:
    _define_custom_op()
    m = accepted(CUSTOM)
    x = torch.arange(5, dtype=torch.float32)
    (y,) = run_graph(m, [x])
    torch.testing.assert_close(y, x.repeat(3) * 2)


def test_custom_torch_library_op_type_is_checked() -> None:
    _define_custom_op()
    bad = CUSTOM.replace("(%x, 3) : f32[s0 * 3]", "(%x, 2) : f32[s0 * 3]")
    rejected(bad, "mylib.myop.default: result %y is declared f32[s0 * 3], but at the symbols' "
             "hints it is [12] and the op gives f32[8]", 4, 3)


def test_convolution_is_typed_by_its_standin_when_its_meta_kernel_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.11's aten._convolution rejected meta tensors the op database drew (on the H200):
    # typed through aten.convolution instead, the same results
    import ember.ir.torch_ops as torch_ops
    real = torch_ops.call_torch

    def no_meta(op: torch._ops.OpOverload, args: list[object], kwargs: dict[str, object]
                ) -> object:
        if op is torch.ops.aten._convolution.default:
            raise NotImplementedError("convolution_overrideable not implemented")
        return real(op, args, kwargs)
    monkeypatch.setattr(torch_ops, "call_torch", no_meta)
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[2, 4, 5, 5]@cuda:0, %w: f32[3, 4, 3, 3]@cuda:0) -> () {
          %y = aten._convolution.default(%x, %w, none, [1, 1], [0, 0], [1, 1], false, [0, 0], 1, false, true, true, true) : f32[2, 3, 3, 3]@cuda:0
          return ()
        }
    """)
    accepted(text)
    rejected(text.replace("f32[2, 3, 3, 3]@cuda:0", "f32[2, 3, 4, 4]@cuda:0"), "", 3, 3)
    monkeypatch.delitem(torch_ops._META_STANDINS, torch.ops.aten._convolution.default)
    rejected(text, "its meta kernel rejected the arguments", 3, 3)
