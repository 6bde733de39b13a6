"""ir-v1 text round trips: `print(parse(print(m))) == print(m)`, byte for byte, and the re-parsed
module equals the original one structurally; expressions round-trip through `to_text` + parse."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from hypothesis import example, given

from ember.ir import (
    F64,
    DType,
    FloorDiv,
    GraphBuilder,
    Kernel,
    Loc,
    Module,
    PrintError,
    PyMod,
    Ref,
    Symbol,
    TensorType,
    parse,
    print_module,
    symbol,
    to_text,
)
from ember.ir.expr import INT64_MAX, INT64_MIN
from packages.ir.tests import runnable_modules as R
from packages.ir.tests import strategies as S
from packages.ir.tests.strategies import SPEC_EXAMPLE

# The format's specification in the repository: its example must be the canonical text.
SPEC = Path(__file__).parents[3] / "docs" / "ir-spec.md"


def assert_round_trip(m: Module) -> str:
    text = print_module(m)
    again = parse(text)
    assert print_module(again) == text
    assert S.module_key(again) == S.module_key(m)
    assert S.module_key(parse(print_module(again))) == S.module_key(m)
    return text


@S.slow_draws
@given(S.text_modules())
def test_text_modules_round_trip(m: Module) -> None:
    assert_round_trip(m)


@S.slow_draws
@given(R.runnable_cases())
def test_runnable_modules_round_trip(case: R.RunnableCase) -> None:
    assert_round_trip(case.module)


# ---- expressions -------------------------------------------------------------------------

EXPR_SYMBOLS = ["s0", "s1", "s2"]
_HEAD = "ember.ir 1.0\n\nsymbol s0\nsymbol s1\nsymbol s2\n\n"


def parse_expr_text(text: str) -> tuple[object, object]:
    """Parse an expression as a graph attribute and as a dim of a type, in one tiny module."""
    m = parse(f"{_HEAD}graph @g(%x: f32[{text}]) -> () attrs(e={text}) {{\n  return ()\n}}\n")
    g = m.graph("g")
    t = g.params[0].type
    assert isinstance(t, TensorType)
    return g.attrs["e"], t.shape[0]


@given(S.raw_exprs(EXPR_SYMBOLS, big_ints=True))
@example(-((symbol("s0") + 1) ** 2))
@example(-symbol("s1") * (symbol("s0") + 1) * (symbol("s2") + 2))
@example(symbol("s0") - 2**63)
@example(-(2**63) * symbol("s0"))
@example(symbol("s1") - (2**63) * symbol("s0"))
@example(FloorDiv(symbol("s0"), sympy.Integer(-(2**63))))
@example(sympy.Max(symbol("s0"), sympy.Integer(-(2**63))))
@example(symbol("s0") * 2**62 * 4)
def test_expressions_round_trip(e: sympy.Expr) -> None:
    d = S.simplify_dim(e)
    m = Module()
    for s in EXPR_SYMBOLS:
        m.add_symbol(Symbol(s))
    gb = GraphBuilder(m, "g")
    gb.param("x", TensorType(DType.f32, (d,)))
    gb.ret([], {"e": d})
    if not S.fits_int64(d):  # no INT holds it: the printer refuses rather than print bad text
        with pytest.raises(PrintError):
            print_module(m)
        return
    text = to_text(d)
    assert print_module(m) == (f"{_HEAD}graph @g(%x: f32[{text}]) -> () attrs(e={text}) {{\n"
                               "  return ()\n}\n")
    for parsed in parse_expr_text(text):
        assert parsed == d, (text, parsed, d)
        assert to_text(parsed) == text


@pytest.mark.parametrize("e, text", [
    (symbol("s0") * 2 + 1, "s0 * 2 + 1"),
    (FloorDiv(symbol("s1"), sympy.Integer(2)), "s1 // 2"),
    (PyMod(symbol("s0"), sympy.Integer(3)), "mod(s0, 3)"),
    (sympy.Max(symbol("s0"), symbol("s1")), "max(s0, s1)"),
    (sympy.Min(symbol("s0"), 3), "min(3, s0)"),
    (symbol("s0") - symbol("s1") * 2, "s0 - s1 * 2"),
    (-symbol("s0"), "-s0"),
    (-3 * symbol("s0"), "-s0 * 3"),
    (symbol("s0") ** 2, "s0 * s0"),
    (FloorDiv(symbol("s0") + 1, symbol("s1") * 2), "(s0 + 1) // (s1 * 2)"),
    (sympy.Max(symbol("s0"), symbol("s1"), symbol("s2")), "max(max(s0, s1), s2)"),
    (-((symbol("s0") + 1) ** 2), "(s0 + 1) * (s0 + 1) * -1"),
    (symbol("s0") - 2**63, "s0 + -9223372036854775808"),
    (-(2**63) * symbol("s0"), "s0 * -9223372036854775808"),
])
def test_expression_text(e: sympy.Expr, text: str) -> None:
    assert to_text(e) == text
    assert parse_expr_text(text) == (e, e)


@pytest.mark.parametrize("text, value", [
    ("2 * 3", 6), ("7 // 2", 3), ("-7 // 2", -4), ("mod(-7, 3)", 2), ("mod(7, -3)", -2),
    ("max(2, 3) - min(2, 3)", 1), ("-9223372036854775808", INT64_MIN),
    ("9223372036854775807", INT64_MAX), ("(((1)))", 1), ("s0 - s0", 0), ("mod(s0, 1)", 0),
])
def test_constant_expressions_fold(text: str, value: int) -> None:
    assert parse_expr_text(text) == (value, value)


def test_out_of_range_expressions_are_refused_by_the_printer() -> None:
    m = Module()
    m.add_symbol(Symbol("s0"))
    gb = GraphBuilder(m, "g")
    gb.param("x", TensorType(DType.f32, (symbol("s0") * 2**63,)))
    gb.ret([])
    with pytest.raises(PrintError):
        print_module(m)
    m2 = Module()
    gb = GraphBuilder(m2, "g")
    gb.param("x", TensorType(DType.f32, (2**63,)))
    gb.ret([])
    with pytest.raises(PrintError):
        print_module(m2)


# ---- explicit cases ------------------------------------------------------------------------


def test_spec_example_round_trips_byte_identically() -> None:
    text = SPEC.read_text()  # the example exactly as the spec states it
    assert text.split("## Example", 1)[1].split("```\n", 1)[1].split("```", 1)[0] \
        == SPEC_EXAMPLE
    m = parse(SPEC_EXAMPLE)
    assert print_module(m) == SPEC_EXAMPLE
    assert S.module_key(parse(print_module(m))) == S.module_key(m)


@pytest.mark.parametrize("x", S.SPECIAL_FLOATS + [float.fromhex("0x1p-1074"), -1e-320])
def test_float_literals_keep_their_bits(x: float) -> None:
    m = Module()
    gb = GraphBuilder(m, "g")
    v = gb.param("x", F64)
    gb.op("aten.mul.Scalar", [v, x], type=F64)
    gb.ret([])
    again = parse(assert_round_trip(m))
    got = again.graph("g").nodes[0].args[1]
    assert isinstance(got, float)
    assert R.same_value(got, x)


def test_negative_nan_prints_with_its_sign() -> None:
    m = Module()
    m.add(parse(f"ember.ir 1.0\ngraph @g() -> () attrs(a={-math.nan!r}, b=-nan) {{\n"
                "  return ()\n}\n").graph("g"))
    text = assert_round_trip(m)
    assert "attrs(a=nan, b=-nan)" in text


@pytest.mark.parametrize("source", ["", '"', '""', 'a"', '"a', '"""'[:2] + "x" + '""',
                                    "# c\n\"s\" '#'\n", "x\x00y\r\n", "é😀"])
def test_kernel_sources_round_trip(source: str) -> None:
    m = Module()
    m.add(Kernel("k0", "cpp", source))
    text = assert_round_trip(m)
    assert parse(text).kernels["k0"].source == source


def test_kernel_with_triple_quote_is_refused() -> None:
    m = Module()
    m.add(Kernel("k0", "cpp", 'a """ b'))
    with pytest.raises(PrintError):
        print_module(m)


def test_locs_devices_strides_and_scalars_round_trip() -> None:
    m = Module(version=(1, 7))
    m.add_symbol(Symbol("s0", hint=3, min=0, max=math.inf))
    m.add_symbol(Symbol("s12", max=INT64_MAX))
    gb = GraphBuilder(m, "true")
    s0 = symbol("s0")
    a = gb.param("0", TensorType(DType.bf16, (s0, 4), (4, 1), "cuda:0"))
    b = gb.param("b.c", F64)
    r = gb.emit("my.op", [a, [b, [None, True, DType.c32]], "\"\n\u2028"],
                {"min": -0.0, "loc": FloorDiv(s0, sympy.Integer(2))},
                types=[TensorType(DType.f8e4m3fn, (s0 * 2 + 1,), device="meta"), F64],
                loc=Loc("we\"ird\\name.py", 0))
    gb.emit("x.y", [r[0]], types=[TensorType(DType.u64, ())], loc=Loc("", 9, 2**63 - 1))
    gb.ret([r[0], r[1]], {"input_updates": [[1, 1]], "inf": math.inf})
    text = assert_round_trip(m)
    assert '@cuda:0' in text and "loc(\"\":9:9223372036854775807)" in text
    assert "{4, 1}" in text and "ember.ir 1.7\n" in text


def _one_node_module(**change: Any) -> Module:
    """`%0 = aten.relu.default(%x)` in @g, with one thing changed."""
    m = Module()
    gb = GraphBuilder(m, "g")
    x = gb.param("x", TensorType(DType.f32, (2,)))
    gb.op("aten.relu.default", [x], type=TensorType(DType.f32, (2,)))
    g = gb.ret([x])
    node = g.nodes[0]
    for k, v in change.items():
        if k == "loc":
            node.loc = v
        elif k == "arg":
            node.args.append(v)
        elif k == "kw":
            node.kwargs[v] = 1
        elif k == "type":
            node.results[0].type = v
        elif k == "value":
            node.results[0].name = v
        elif k == "op":
            node.op = v
        elif k == "graph":
            g.name = v
    return m


@pytest.mark.parametrize("change", [
    {"value": "a b"}, {"value": ""}, {"op": "relu"}, {"op": "aten.relu-x"}, {"graph": "1g"},
    {"graph": "g.h"}, {"kw": "a.b"}, {"arg": Ref("x y")}, {"loc": Loc("f.py", -1)},
    {"loc": Loc("f.py", 1, -2)}, {"arg": "\ud83d\ude00"}, {"arg": 2**63}, {"arg": -(2**63) - 1},
    {"type": TensorType(DType.f32, (2,), device="cuda:x")},
    {"type": TensorType(DType.f32, (2**64,))}, {"arg": sympy.floor(symbol("s0") / 2)},
    {"type": TensorType(DType.f32, (symbol("s0") / 2,))},
])
def test_printer_refuses_what_would_not_read_back(change: dict[str, Any]) -> None:
    with pytest.raises(PrintError):
        print_module(_one_node_module(**change))
    assert_round_trip(_one_node_module())


def test_zero_dim_types_state_no_strides() -> None:
    """ir-v1's `{...}` needs a stride: a 0-dim type given strides `()` holds none."""
    assert TensorType(DType.f32, (), ()).strides is None
    assert TensorType.of(torch.tensor(1.0), strides=True).strides is None
    assert_round_trip(_one_node_module(type=TensorType(DType.f32, (), ())))


def test_printer_refuses_bad_symbols() -> None:
    for sym in (Symbol("s0", hint=-1), Symbol("s0", min=-2), Symbol("n"), Symbol("s0", max=-1)):
        m = Module()
        m.add_symbol(sym)
        with pytest.raises(PrintError):
            print_module(m)
    m = Module()
    m.add(Kernel("k", "c++", ""))
    with pytest.raises(PrintError):
        print_module(m)
