"""ir-v1.1: loop variables as expression atoms, body domains, the version a text needs, and the
one table-driven printer of expressions to C++ / Python / Triton."""

from __future__ import annotations

import re

import pytest
import sympy
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ember.ir import IRParseError, parse
from ember.ir.expr import CPP, PYTHON, TRITON, FloorDiv, PyMod, parse_expr, print_expr, symbol

V11 = """ember.ir 1.1

symbol s0 hint=8 min=2

graph @k(%x: f32[s0, 8]) -> (f32[]) domain(i0 < s0, i1 < 8, r0 < 3) {
  %a = loop.load(%x, index=[i0, mod(i1 + r0, 8)]) : f32[]
  %b = loop.load(%x, index=[(i8), i8 + 1]) : f32[]
  %c = prims.convert_element_type(%a, dtype=i8) : i8[]
  return (%a)
}
"""


def test_v11_text_round_trips_with_domains_and_positions() -> None:
    m = parse(V11)
    assert str(m) == V11
    g = m.graph("k")
    assert g.domain == {"i0": symbol("s0"), "i1": 8, "r0": 3}
    load = g.nodes[0]
    assert load.kwargs["index"] == [symbol("i0"), PyMod(symbol("i1") + symbol("r0"), 8)]
    assert load.arg_pos is not None and load.arg_pos[("index", 1)].col == 33
    # a loop variable named like a dtype is a dtype alone, a variable in parentheses or with
    # an operator after it
    assert g.nodes[1].kwargs["index"] == [symbol("i8"), symbol("i8") + 1]
    assert str(g.nodes[2].kwargs["dtype"]) == "DType.i8"


def test_a_module_prints_the_version_it_needs() -> None:
    aten = "ember.ir 1.0\n\ngraph @f(%x: f32[4]) -> (f32[4]) {\n  return (%x)\n}\n"
    assert str(parse(aten)) == aten  # no 1.1 feature: still 1.0
    one = parse(aten.replace("1.0", "1.1"))
    assert str(one).startswith("ember.ir 1.1\n")  # the text's own version is kept
    m = parse(aten)
    m.graph("f").domain = {"i0": 4}
    assert str(m).startswith("ember.ir 1.1\n") and "domain(i0 < 4)" in str(m)


@pytest.mark.parametrize(("text", "where", "message"), [
    ("ember.ir 1.0\ngraph @k(%x: f32[4]) -> (f32[]) domain(i0 < 4) {\n  return (%x)\n}\n",
     (2, 33), "needs ember.ir 1.1"),
    ("ember.ir 1.0\ngraph @k(%x: f32[4]) -> (f32[]) {\n  %a = loop.load(%x, index=[i0]) : f32[]"
     "\n  return (%a)\n}\n", (3, 29), "loop variable i0 needs ember.ir 1.1"),
    ("ember.ir 1.1\ngraph @k(%x: f32[i0]) -> (f32[]) {\n  return (%x)\n}\n", (2, 18),
     "outside a node's arguments"),
    ("ember.ir 1.1\ngraph @k(%x: f32[4]) -> (f32[]) domain(i1 < 4) {\n  return (%x)\n}\n",
     (2, 40), "i0 or r0"),
    ("ember.ir 1.1\ngraph @k(%x: f32[4]) -> (f32[]) domain(r0 < 4, i0 < 3) {\n  return (%x)\n}"
     "\n", (2, 48), "r1"),
    ("ember.ir 1.1\ngraph @k(%x: f32[4]) -> (f32[]) domain(i0 < r0) {\n  return (%x)\n}\n",
     (2, 45), "outside a node's arguments"),
])
def test_malformed_v11_is_a_parse_error_with_a_position(text: str, where: tuple[int, int],
                                                         message: str) -> None:
    with pytest.raises(IRParseError) as e:
        parse(text)
    assert (e.value.line, e.value.col) == where and message in e.value.message


def test_parse_expr_is_the_module_parser() -> None:
    assert parse_expr("i0 * 8 + mod(r0, 4) // 2") == \
        8 * symbol("i0") + FloorDiv(PyMod(symbol("r0"), 4), 2)
    assert parse_expr("2 * 3 + s9") == symbol("s9") + 6  # symbols need no declaration here
    for bad, col in [("i0 +", 5), ("i0 $ 1", 4), ("1" * 30, 1), ("i0 + r", 6)]:
        with pytest.raises(IRParseError) as e:
            parse_expr(bad)
        assert e.value.col == col, bad
    with pytest.raises(IRParseError, match="loop variable"):
        parse_expr("i0 + 1", loop_vars=False)
    with pytest.raises(IRParseError, match="longer than"):
        parse_expr(" + ".join(["i0"] * 3000))


E = parse_expr("max(i0, 3) * 8 + mod(r0, 4) // 2 + 4000000000 + min(min(s0, 2), i1)")


@pytest.mark.parametrize(("lang", "want"), [
    (CPP, "(4000000000LL + (8 * std::max<int64_t>(3, i0)) + ((r0 % 4) / 2)"
          " + std::min<int64_t>(std::min<int64_t>(2, i1), s0))"),
    (PYTHON, "(4000000000 + (8 * max(3, i0)) + ((r0 % 4) // 2) + min(2, i1, s0))"),
    (TRITON, "(4000000000 + (8 * tl.maximum(3, i0)) + _floordiv(_mod(r0, 4), 2)"
             " + tl.minimum(tl.minimum(2, i1), s0))"),
])
def test_one_printer_per_language_table(lang: object, want: str) -> None:
    assert print_expr(E, lang) == want  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "want"), [
    # never negative (loop variables and sizes are non-negative): C++'s own / and %
    ("mod(i0, 64)", "(i0 % 64)"),
    ("i0 // 8 * 7 + mod(r0 + 3 * s0, 7)", "((7 * (i0 / 8)) + ((r0 + (3 * s0)) % 7))"),
    ("max(0, i3 - 288) // 2", "(std::max<int64_t>(0, (-288 + i3)) / 2)"),
    ("mod(i0 // 3, 5)", "((i0 / 3) % 5)"),
    # a dividend that may be negative keeps the helpers (C++ truncates toward zero)
    ("mod(i0 - 3, 7)", "ember_mod((-3 + i0), 7)"),
    ("(i0 - 3) // 4", "ember_floordiv((-3 + i0), 4)"),
    ("min(i0 - 3, 5) // 2", "ember_floordiv(std::min<int64_t>(5, (-3 + i0)), 2)"),
])
def test_cpp_divides_non_negative_indices_with_its_own_operators(text: str, want: str) -> None:
    # the helpers' sign fix-up is a branch that kept g++ from hoisting a loop-invariant
    # `mod(i0, 64)` out of an `omp simd` loop (docs/perf-notes.md)
    assert print_expr(parse_expr(text), CPP) == want


def test_printer_spells_symbols_and_relations_through_its_caller() -> None:
    e = symbol("s0") ** 2 - 1
    assert print_expr(e, PYTHON, lambda n: f"_S_{n}") == "(-1 + (_S_s0 * _S_s0))"
    rel = sympy.Not(sympy.Lt(symbol("s0"), 4))
    assert print_expr(rel, PYTHON, lambda n: f"_S_{n}") == "_S_s0 >= 4"
    with pytest.raises(KeyError):
        print_expr(sympy.Lt(symbol("s0"), 4), CPP, error=KeyError)  # C++ writes no relations
    with pytest.raises(KeyError):
        print_expr(symbol("s0"), CPP, lambda n: (_ for _ in ()).throw(KeyError(n)))


_ATOMS = st.one_of(st.integers(-20, 20).map(sympy.Integer),
                   st.sampled_from(["i0", "i1", "i8", "i64", "r0", "r3", "s0"]).map(symbol))
_EXPRS = st.recursive(_ATOMS, lambda sub: st.one_of(
    st.tuples(sub, sub).map(lambda t: t[0] + t[1]),
    st.tuples(sub, sub).map(lambda t: t[0] * t[1]),
    st.tuples(sub, st.integers(1, 9)).map(lambda t: FloorDiv(t[0], t[1])),
    st.tuples(sub, st.integers(1, 9)).map(lambda t: PyMod(t[0], t[1])),
    st.tuples(sub, sub).map(lambda t: sympy.Max(t[0], t[1]))), max_leaves=6)


@settings(max_examples=40)
@given(st.lists(_EXPRS, min_size=1, max_size=3))
def test_random_loop_indices_round_trip_through_module_text(index: list[sympy.Expr]) -> None:
    """Any index over loop variables (dtype-named ones included) prints as 1.1 text that reads
    back to the same expressions, and prints again byte for byte."""
    lines = "".join(f"  %a{k} = loop.index(index=0) : i64[]\n" for k in range(len(index)))
    m = parse(f"ember.ir 1.1\n\nsymbol s0 hint=4\n\ngraph @k() -> (i64[]) {{\n{lines}"
              f"  return (%a0)\n}}\n")
    for node, e in zip(m.graph("k").nodes, index, strict=True):
        node.kwargs["index"] = e
    printed = str(m)
    again = parse(printed)
    got = [n.kwargs["index"] for n in again.graph("k").nodes]
    assert [sympy.Integer(g) if isinstance(g, int) else g for g in got] == index
    assert str(again) == printed


_SIGNED = st.recursive(_ATOMS, lambda sub: st.one_of(
    st.tuples(sub, sub).map(lambda t: t[0] + t[1]),
    st.tuples(sub, sub).map(lambda t: t[0] - t[1]),
    st.tuples(sub, sub).map(lambda t: t[0] * t[1]),
    st.tuples(sub, st.integers(1, 9)).map(lambda t: FloorDiv(t[0], t[1])),
    st.tuples(sub, st.integers(1, 9)).map(lambda t: PyMod(t[0], t[1])),
    st.tuples(sub, sub).map(lambda t: sympy.Max(t[0], t[1])),
    st.tuples(sub, sub).map(lambda t: sympy.Min(t[0], t[1]))), max_leaves=8)


def _c_int(text: str, env: dict[str, int]) -> int:
    """Evaluate printed C++ index text with C's truncating / and % (the helpers as Python)."""
    def trunc_div(a: int, b: int) -> int:
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q

    class C(int):  # C's operators on ints: / truncates, % takes the dividend's sign
        def __add__(self, o: int) -> C:
            return C(int(self) + int(o))

        __radd__ = __add__

        def __mul__(self, o: int) -> C:
            return C(int(self) * int(o))

        __rmul__ = __mul__

        def __neg__(self) -> C:
            return C(-int(self))

        def __truediv__(self, o: int) -> C:
            return C(trunc_div(int(self), int(o)))

        def __mod__(self, o: int) -> C:
            return C(int(self) - trunc_div(int(self), int(o)) * int(o))

    ns: dict[str, object] = {k: C(v) for k, v in env.items()}
    ns.update(ember_floordiv=lambda a, b: C(int(a) // int(b)),
              ember_mod=lambda a, b: C(int(a) % int(b)))
    text = text.replace("std::max<int64_t>", "max").replace("std::min<int64_t>", "min")
    text = re.sub(r"(?<![\w.])(-?\d+)(LL)?", r"C(\1)", text)  # every literal a C int
    ns["C"] = C
    return int(eval(text, {"__builtins__": {"max": max, "min": min}}, ns))  # noqa: S307


@settings(max_examples=150)
@given(_SIGNED, st.lists(st.integers(0, 6), min_size=7, max_size=7))
@example(PyMod(symbol("i0") - 3, 7), [1, 0, 0, 0, 0, 0, 0])
def test_cpp_index_text_computes_python_floor_semantics(e: sympy.Expr, vals: list[int]) -> None:
    """Where the printer writes C's own / and % (a dividend it proves non-negative), the value
    is Python's // and mod for every non-negative value of the symbols."""
    env = dict(zip(["i0", "i1", "i8", "i64", "r0", "r3", "s0"], vals, strict=True))
    want = eval(print_expr(e, PYTHON), {"__builtins__": {"max": max, "min": min}}, env)  # noqa: S307
    assert _c_int(print_expr(e, CPP), env) == want
