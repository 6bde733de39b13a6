"""Guards: a change the graph depends on recompiles; a change it does not depend on does not;
past the cache limit the function runs eagerly with one warning naming the reason."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import ember.runtime as er
from ember.runtime.compile import CompiledFunction
from ember.runtime.testing import assert_same


def compiled_history(c: Any) -> Any:
    cf = c.compiled if isinstance(c, er.CompiledModule) else c
    assert isinstance(cf, CompiledFunction)
    return cf.history


def run_both(fn: Any, c: Any, *args: Any, **kwargs: Any) -> None:
    assert_same(fn(*args, **kwargs), c(*args, **kwargs))


def f_basic(x, n=2):
    return x * n + x.shape[0]


def test_same_inputs_hit_the_cache() -> None:
    c = er.compile(f_basic, backend="eager")
    for _ in range(5):
        run_both(f_basic, c, torch.randn(3, 4))
    h = compiled_history(c)
    assert len(h.graphs) == 1 and h.recompilations == [] and h.cache_hits == 4


@pytest.mark.parametrize("change,reason", [
    (lambda: (torch.randn(5, 4),), "x: shape [5, 4], expected [3, 4]"),
    (lambda: (torch.randn(3, 4, dtype=torch.float64),), "x: dtype float64, expected float32"),
    (lambda: (torch.randn(3, 4, requires_grad=True),), "x: requires_grad True, expected False"),
    (lambda: (torch.randn(4, 3).t(),), "x: stride [1, 3], expected [4, 1]"),
    (lambda: (torch.randn(3, 4), 3), "len(*args)"),
    (lambda: (torch.randn(3, 4),) if False else (torch.randn(3, 4), 2.0), "n"),
])
def test_tensor_and_argument_changes_recompile(change: Any, reason: str) -> None:
    c = er.compile(f_basic, backend="eager")
    run_both(f_basic, c, torch.randn(3, 4))
    run_both(f_basic, c, *change())
    h = compiled_history(c)
    assert len(h.graphs) == 2, h.recompilations
    assert len(h.recompilations) == 1 and reason in h.recompilations[0], h.recompilations


def test_kwargs_structure_recompiles() -> None:
    c = er.compile(f_basic, backend="eager")
    run_both(f_basic, c, torch.randn(2))
    run_both(f_basic, c, torch.randn(2), n=3)
    run_both(f_basic, c, x=torch.randn(2), n=3)
    h = compiled_history(c)
    assert len(h.graphs) == 3
    assert all("kwargs" in r or "args" in r for r in h.recompilations), h.recompilations


def test_int_argument_value_is_guarded() -> None:
    c = er.compile(f_basic, backend="eager")
    x = torch.randn(2)
    run_both(f_basic, c, x, 2)
    run_both(f_basic, c, x, 2)
    run_both(f_basic, c, x, 5)
    h = compiled_history(c)
    assert len(h.graphs) == 2 and "n is 5, expected 2" in h.recompilations[0]


class Flagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 2.0
        self.use_relu = True

    def forward(self, x):
        y = self.lin(x) * self.scale
        if self.use_relu:
            y = y.relu()
        if self.training:
            y = y + 1
        return y


def test_module_attribute_and_flag_changes() -> None:
    m = Flagged()
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 3)
    run_both(m, c, x)
    m.scale = 3.0
    run_both(m, c, x)
    m.use_relu = False
    run_both(m, c, x)
    c.eval()  # propagates to the original (shared submodule)
    assert not m.training
    run_both(m, c, x)
    run_both(m, c, x)
    h = compiled_history(c)
    assert len(h.graphs) == 4
    assert "self.scale is 3.0, expected 2.0" in h.recompilations[0]
    assert "self.use_relu is False, expected True" in h.recompilations[1]
    assert "self.training is False, expected True" in h.recompilations[2]


def test_parameter_update_needs_no_recompile() -> None:
    m = Flagged()
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 3)
    run_both(m, c, x)
    with torch.no_grad():
        m.lin.weight.mul_(2)  # same tensor, new values: read by reference
    run_both(m, c, x)
    m.lin.weight = nn.Parameter(torch.randn(3, 3))  # a new tensor of the same type: no recompile
    run_both(m, c, x)
    assert len(compiled_history(c).graphs) == 1
    m.lin.weight = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        m(x)  # eager fails on the dtype mix ...
    with pytest.raises(RuntimeError):
        c(x)  # ... and so does the recompiled function (the guard caught the change)
    h = compiled_history(c)
    assert len(h.recompilations) == 1 and "self.lin.weight: dtype float64" in h.recompilations[0]


def test_submodule_swap_recompiles() -> None:
    m = Flagged()
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 3)
    run_both(m, c, x)
    m.lin = nn.Linear(3, 3)
    run_both(m, c, x)
    h = compiled_history(c)
    assert len(h.graphs) == 2 and "self.lin is" in h.recompilations[0]


FACTOR = 2.0
ACT = torch.relu


def uses_globals(x):
    return ACT(x) * FACTOR


def test_global_changes_recompile() -> None:
    global FACTOR, ACT
    c = er.compile(uses_globals, backend="eager")
    x = torch.randn(4)
    try:
        run_both(uses_globals, c, x)
        FACTOR = 3.0
        run_both(uses_globals, c, x)
        ACT = torch.tanh
        run_both(uses_globals, c, x)
    finally:
        FACTOR, ACT = 2.0, torch.relu
    h = compiled_history(c)
    assert len(h.graphs) == 3
    assert "FACTOR is 3.0, expected 2.0" in h.recompilations[0]
    assert "ACT is" in h.recompilations[1]


def test_shadowing_a_builtin_recompiles() -> None:
    c = er.compile(f_len, backend="eager")
    x = torch.randn(3)
    run_both(f_len, c, x)
    g = f_len.__globals__
    g["len"] = lambda v: 100
    try:
        assert c(x).item() == f_len(x).item()
    finally:
        del g["len"]
    h = compiled_history(c)
    assert len(h.graphs) == 2 and "'len' not in" in h.recompilations[0]


def f_len(x):
    return x.sum() * 0 + len(x)


def test_grad_mode_is_guarded() -> None:
    def f(x):
        return x * 2

    c = er.compile(f, backend="eager")
    x = torch.randn(3, requires_grad=True)
    assert c(x).requires_grad
    with torch.no_grad():
        assert not c(x).requires_grad
    h = compiled_history(c)
    assert len(h.graphs) == 2 and "is_grad_enabled" in h.recompilations[0]


def test_closure_cell_change_recompiles() -> None:
    k = 2

    def f(x):
        return x * k

    c = er.compile(f, backend="eager")
    x = torch.randn(3)
    run_both(f, c, x)
    k = 3
    run_both(f, c, x)
    assert len(compiled_history(c).graphs) == 2


def test_list_argument_structure() -> None:
    def f(xs, cfg):
        return sum(xs) * cfg["scale"]

    c = er.compile(f, backend="eager")
    run_both(f, c, [torch.randn(2), torch.randn(2)], {"scale": 2})
    run_both(f, c, [torch.randn(2), torch.randn(2)], {"scale": 2})
    run_both(f, c, [torch.randn(2)] * 3, {"scale": 2})
    run_both(f, c, [torch.randn(2)] * 3, {"scale": 2, "other": 1})
    h = compiled_history(c)
    assert len(h.graphs) == 3


def test_aliased_inputs_are_guarded() -> None:
    def f(a, b):
        return a + b

    c = er.compile(f, backend="eager")
    x, y = torch.randn(3), torch.randn(3)
    run_both(f, c, x, x)
    g = compiled_history(c).graphs[0]
    assert len(g.inputs) == 1  # one graph input for the tensor passed twice
    run_both(f, c, x, y)
    assert len(compiled_history(c).graphs) == 2


def test_cache_limit_falls_back_with_one_warning() -> None:
    def f(x):
        return x + 1

    # dynamic=False: a new shape is a new capture (automatic dynamic would make one graph)
    c = er.compile(f, backend="eager", dynamic=False, options={"cache_limit": 3})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(1, 8):
            run_both(f, c, torch.randn(n))
    ours = [x for x in w if "cache limit" in str(x.message)]
    assert len(ours) == 1
    assert "shape" in str(ours[0].message) or "tensor" in str(ours[0].message)
    h = compiled_history(c)
    assert len(h.graphs) == 3 and any("cache limit" in n for n in h.notes)


def test_default_cache_limit_is_8() -> None:
    def f(x):
        return x - 1

    c = er.compile(f, backend="eager", dynamic=False)  # every new shape a new capture
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(1, 12):
            c(torch.randn(n))
    assert len(compiled_history(c).graphs) == 8
    assert sum("cache limit" in str(x.message) for x in w) == 1


def test_guard_source_is_generated_code() -> None:
    m = Flagged()
    c = er.compile(m, backend="eager")
    c(torch.randn(2, 3))
    entry = c.compiled.entries[0]
    src = entry.code.source
    assert src.startswith("def guard(S, A, K):")
    assert "= S._modules['lin']" in src and "._parameters['weight']" in src
    assert src.count("S._modules['lin']") == 1  # read once into a local, then reused
    assert entry.code.check(m, (torch.randn(2, 3),), {}) == -1
    assert entry.code.check(m, (torch.randn(2, 4),), {}) >= 0
