"""Values leaving a capture (outputs.OutputSpecs: a return value, or the live values of a graph
break) and sets coming in: a mutable value is new on every call, a set argument is guarded by
its own type and contents."""

from __future__ import annotations

import torch

import ember.runtime as er


def test_a_set_argument_is_guarded_by_type_and_contents() -> None:
    def f(x: torch.Tensor, s: set[int]) -> torch.Tensor:
        return x + len(s)

    cf = er.compile(f, backend="eager")
    x = torch.randn(3)
    for s in ({1, 2}, {1, 2}, frozenset({1, 2}), {1, 2, 3}):
        torch.testing.assert_close(cf(x, s), f(x, s))
    h = er.explain(f, x, {5})
    assert not h.fallbacks, h.fallbacks


def test_a_returned_set_is_new_on_every_call() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, set[int], frozenset[int]]:
        return x + 1, {1, 2}, frozenset({3})

    cf = er.compile(f, backend="eager")
    x = torch.randn(2)
    first = cf(x)[1]
    first.add(7)
    second = cf(x)
    assert second[1] == {1, 2} and second[1] is not first
    assert second[2] == frozenset({3})


def test_a_set_live_at_a_graph_break_is_rebuilt_per_call() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        s = {1, 2}
        print("graph break")
        s.add(3)
        return x + len(s)

    cf = er.compile(f, backend="eager")
    x = torch.randn(2)
    for _ in range(3):
        torch.testing.assert_close(cf(x), x + 3)
    h = er.explain(f, x)
    assert len(h.breaks) == 1 and not h.fallbacks, (h.breaks, h.fallbacks)
