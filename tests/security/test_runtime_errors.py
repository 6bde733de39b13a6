"""Issue 19 #13: a data-dependent error in a compiled call raises what eager PyTorch raises for
that call, and the next call with good inputs runs the compiled code again. Only compiled code
failing where eager runs (a fault of the compiler, not of the data) makes the eager backend run
the graph from then on, with a note."""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.runtime as er
from ember.runtime.compile import compiled_function_of

# the module (ember.runtime's `compile` attribute is the function)
compile_mod = importlib.import_module("ember.runtime.compile")


pytestmark = pytest.mark.usefixtures("kernel_cache")  # (conftest.py)


class Counting:
    """compile.py's eager backend, counting the graph runs it makes."""

    def __init__(self) -> None:
        self.runs = 0
        self.real = compile_mod.eager_backend

    def __call__(self, module: Any, example_inputs: Sequence[Any]) -> Any:
        run = self.real(module, example_inputs)

        def counted(inputs: Sequence[Any]) -> list[Any]:
            self.runs += 1
            return run(inputs)
        return counted


@pytest.fixture
def eager_runs(monkeypatch: pytest.MonkeyPatch) -> Counting:
    c = Counting()
    monkeypatch.setattr(compile_mod, "eager_backend", c)
    return c


def floordiv(x, y):
    return x // y + 1


def remainder(x, y):
    return torch.remainder(x, y) * 2


def _eager_error(fn: Any, *args: Any) -> BaseException:
    with pytest.raises(Exception) as got:
        fn(*args)
    return got.value


@pytest.mark.parametrize("fn", [floordiv, remainder])
def test_division_by_zero_raises_eagers_error_and_the_compiled_code_stays(
        fn: Any, eager_runs: Counting) -> None:
    """The issue's reproducer: after an integer division by zero, the next good call runs the
    compiled code, not the interpreter."""
    c = er.compile(fn)
    a, b, zero = torch.tensor([7, -9, 4]), torch.tensor([2, 4, -3]), torch.tensor([1, 0, 2])
    torch.testing.assert_close(c(a, b), fn(a, b))
    want = _eager_error(fn, a, zero)
    with pytest.raises(type(want)) as got:
        c(a, zero)
    assert str(got.value) == str(want) == "ZeroDivisionError"
    runs = eager_runs.runs  # the eager backend judged the error once
    for _ in range(3):
        torch.testing.assert_close(c(a, b), fn(a, b))
    assert eager_runs.runs == runs  # ... and runs nothing for good inputs: the compiled code does
    cf = compiled_function_of(c)
    assert cf is not None
    notes = " ".join(cf.history.notes)
    assert "compiled it to" in notes and "compiled code failed" not in notes, notes
    assert len(cf.entries) == 1  # no recompilation either


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(-20, 20), min_size=4, max_size=4),
                          st.lists(st.integers(-2, 2), min_size=4, max_size=4)),
                min_size=1, max_size=4))
def test_compiled_calls_match_eager_results_and_errors(calls: list[tuple[list[int], list[int]]]
                                                       ) -> None:
    """A sequence of calls on one compiled function, some dividing by zero: each raises what
    eager raises (type and message) or returns eager's result."""
    c = _shared()
    for xs, ys in calls:
        x, y = torch.tensor(xs), torch.tensor(ys)
        try:
            want: Any = floordiv(x, y)
        except Exception as e:
            with pytest.raises(type(e), match=re.escape(str(e))):
                c(x, y)
        else:
            torch.testing.assert_close(c(x, y), want)
    cf = compiled_function_of(c)
    assert cf is not None and "compiled code failed" not in " ".join(cf.history.notes)


_SHARED: list[Any] = []


def _shared() -> Any:
    if not _SHARED:  # one compiled function for every example: compiled once
        _SHARED.append(er.compile(floordiv))
    return _SHARED[0]


def test_compiled_code_failing_where_eager_runs_falls_back_with_a_note(
        eager_runs: Counting, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault of the compiled code (simulated: its runner raises on good inputs) is not the
    data's: the eager backend gives this call's result and runs the graph from then on."""
    calls = []

    def broken(compiled: Any, source: Any = None) -> Any:
        def run(graph: Any, inputs: Any) -> Any:
            calls.append(1)
            raise ValueError("a bug in the generated code")
        return run

    monkeypatch.setattr(compile_mod, "compiled_runner", broken)
    c = er.compile(lambda x: torch.cos(x) * 2)
    x = torch.randn(5)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(c(x), torch.cos(x) * 2)
    assert len(calls) == 1  # tried once, then the eager backend for good
    cf = compiled_function_of(c)
    assert cf is not None
    assert any("compiled code failed: ValueError: a bug in the generated code" in n
               for n in cf.history.notes), cf.history.notes


def test_eager_backend_raises_the_ops_own_error() -> None:
    """backend="eager" too: the aten op's exception, not the interpreter's wrapper."""
    c = er.compile(floordiv, backend="eager")
    a, zero = torch.tensor([1, 2]), torch.tensor([0, 1])
    want = _eager_error(floordiv, a, zero)
    with pytest.raises(type(want)) as got:
        c(a, zero)
    assert type(got.value) is type(want) and str(got.value) == str(want)
