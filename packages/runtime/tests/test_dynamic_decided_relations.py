"""Size comparisons that sympy decides for every size (issue 17): `64 * s0 + 64 == 0` is False
for any non-negative s0 (T5's attention-bias code compares such a size), `s0 == s0` is True. The
answer needs no guard; before, the relation became a SHAPE guard of a bare `True`, which has no
Python form, and the compile died building its guard function."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.runtime.compile import compile, compiled_function_of


def decided_false(x: torch.Tensor) -> torch.Tensor:
    if (x.shape[0] + 1) * 64 == 0:  # never true: sizes are >= 0
        return x - 1
    return x * 2


def decided_true(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    if n == n and n + 1 != n:
        return x.sum(0) + n
    return x


def mixed(x: torch.Tensor) -> torch.Tensor:
    # a decided comparison next to one that must stay a guard
    if x.shape[0] * 4 + 4 != 0 and x.shape[0] > 8:
        return x * 3
    return x + 1


def _run(fn: Any, sizes: list[int], dynamic: bool | None) -> Any:
    cf = compile(fn, dynamic=dynamic, backend="eager")
    with torch.no_grad():
        for n in sizes:
            x = torch.randn(n, 3)
            torch.testing.assert_close(cf(x), fn(x))
    f = compiled_function_of(cf)
    assert f is not None
    return f.history


@pytest.mark.parametrize("fn", [decided_false, decided_true])
def test_a_decided_size_comparison_needs_no_guard(fn: Any) -> None:
    h = _run(fn, list(range(2, 12)), True)
    assert h.recompilations == [], h.recompilations
    assert "symbol s0" in h.graphs[-1].ir
    guards = " ".join(h.graphs[-1].guards)
    assert "sizes:" not in guards, guards


def test_a_decided_comparison_beside_a_real_branch_keeps_only_the_real_guard() -> None:
    h = _run(mixed, list(range(2, 21)), None)
    guards = " ".join(h.graphs[-1].guards)
    assert "s0 > 8" in guards and "True" not in guards, guards


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6),
       st.sampled_from([None, True]))
def test_decided_comparisons_match_eager_at_any_sizes(sizes: list[int],
                                                      dynamic: bool | None) -> None:
    for fn in (decided_false, decided_true, mixed):
        _run(fn, sizes, dynamic)
