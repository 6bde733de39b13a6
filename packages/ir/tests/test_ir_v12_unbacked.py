"""ir-v1.2: unbacked symbols (`u0`), sizes a graph reads from a tensor's data (`.item()`),
bound by `graph.bind_symbol(%t, u0, le=[...])` and checked when bound (docs/ir-spec.md)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.ir import Interpreter, IRParseError, parse, verify
from ember.ir.interpreter import SymbolAssertionError
from ember.ir.verifier import VerificationError

TEXT = """ember.ir 1.2

symbol s0 hint=8 min=2
symbol u0 hint=4 min=0

graph @f(%x: f32[s0, 3], %m: i64[]) -> (f32[u0, 3], f32[s0 - u0, 3], f32[u0 * 2]) {
  %n = graph.bind_symbol(%m, u0, le=[s0]) : i64
  %y = aten.slice.Tensor(%x, 0, 0, u0) : f32[u0, 3]
  %r = aten.slice.Tensor(%x, 0, u0, 9223372036854775807) : f32[s0 - u0, 3]
  %z = aten.new_zeros.default(%x, [u0 * 2]) : f32[u0 * 2]
  return (%y, %r, %z)
}
"""


def test_text_round_trips_and_verifies() -> None:
    m = parse(TEXT)
    assert str(m) == TEXT
    verify(m)


def test_a_module_with_an_unbacked_symbol_prints_1_2() -> None:
    m = parse(TEXT.replace("ember.ir 1.2", "ember.ir 1.5"))
    assert str(m).startswith("ember.ir 1.5")  # a newer minor it was read with is kept
    m = parse(TEXT)
    m.version = (1, 0)  # the printer writes the oldest minor that holds the module
    assert str(m).startswith("ember.ir 1.2")
    del m.symbols["u0"]
    m.items.clear()
    assert str(m).startswith("ember.ir 1.0")


@pytest.mark.parametrize("text, words", [
    (TEXT.replace("ember.ir 1.2", "ember.ir 1.1"), "needs ember.ir 1.2"),
    (TEXT.replace("symbol u0 hint=4 min=0\n", ""), "undeclared symbol u0"),
])
def test_parse_errors(text: str, words: str) -> None:
    with pytest.raises(IRParseError, match=words):
        parse(text)


@pytest.mark.parametrize("edit, words", [
    # used before its bind node
    (lambda t: t.replace("  %n = graph.bind_symbol(%m, u0, le=[s0]) : i64\n", "").replace(
        "  %z = ", "  %n = graph.bind_symbol(%m, u0, le=[s0]) : i64\n  %z = "),
     "used before the graph.bind_symbol"),
    # bound twice
    (lambda t: t.replace("  %y = ", "  %n2 = graph.bind_symbol(%m, u0) : i64\n  %y = "),
     "bound twice"),
    # in an input's type
    (lambda t: t.replace("%m: i64[]", "%m: i64[u0]"), "in an input's type"),
    # a float tensor
    (lambda t: t.replace("%m: i64[]", "%m: f32[]"), "one-element integer tensor"),
    # not an unbacked symbol
    (lambda t: t.replace("bind_symbol(%m, u0, le=[s0])", "bind_symbol(%m, s0)"),
     "unbacked symbol"),
])
def test_verifier_errors(edit: object, words: str) -> None:
    m = parse(edit(TEXT))  # type: ignore[operator]
    with pytest.raises(VerificationError, match=words):
        verify(m)


def _run(n: int, rows: int) -> list[torch.Tensor]:
    return Interpreter(parse(TEXT)).run([torch.randn(rows, 3), torch.tensor(n)]).outputs


@settings(deadline=None)
@given(rows=st.integers(2, 12), data=st.data())
def test_the_interpreter_binds_the_value_at_any_value_in_range(rows: int,
                                                               data: st.DataObject) -> None:
    n = data.draw(st.integers(0, rows))  # 0 and the bound included
    x = torch.randn(rows, 3)
    y, r, z = Interpreter(parse(TEXT)).run([x, torch.tensor(n)]).outputs
    torch.testing.assert_close(y, x[:n])
    torch.testing.assert_close(r, x[n:])
    assert z.shape == (2 * n,)


def test_broken_assumptions_raise_a_symbol_assertion() -> None:
    with pytest.raises(SymbolAssertionError, match="above 5"):
        _run(6, 5)
    with pytest.raises(SymbolAssertionError, match="outside the range"):
        _run(-1, 5)
