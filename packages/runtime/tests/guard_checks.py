"""What the guard tests share (test_guards_fast.py, test_guards_tensorcheck.py,
test_guards_program.py): a module compiled with the eager backend, called once; eager's and
the compiled call's outcomes after a change; the fast guard check against the full one."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import ember.runtime as er
from ember.runtime.compile import CompiledFunction
from ember.runtime.testing import assert_same


def compiled_eager(m: nn.Module, *shape: int) -> tuple[Any, CompiledFunction, torch.Tensor]:
    """`m` compiled with the eager backend and called once on a random `x` of `shape`, eager's
    value bit for bit: the compiled module, its compiled function (entries, history) and x."""
    c = er.compile(m, backend="eager")
    x = torch.randn(*shape)
    assert_same(m(x), c(x))
    cf = c.compiled
    assert isinstance(cf, CompiledFunction)
    return c, cf, x


def assert_checks_agree(code: Any, m: nn.Module, y: torch.Tensor) -> None:
    """The entry code's fast check on `m(y)` gives what its full check gives: the same inputs
    (the same objects) where the guards hold, the same failing index where not."""
    fast, full = code.guard(m, (y,), {}), code.full(m, (y,), {})
    if isinstance(full, list):
        assert isinstance(fast, list) and len(fast) == len(full)
        assert all(a is b for a, b in zip(fast, full, strict=True))
    else:
        assert fast == full


def both_ways(m: nn.Module, c: Any, x: torch.Tensor) -> tuple[Any, Any]:
    """(eager's, the compiled module's) outcome on `x`: each a result or the RuntimeError it
    raised (a mutation eager refuses must be refused by the compiled call too)."""
    outcomes: list[Any] = []
    for f in (m, c):
        try:
            outcomes.append(f(x))
        except RuntimeError as e:
            outcomes.append(e)
    return outcomes[0], outcomes[1]
