"""Compiled code inside compiled code: a compiled module used as a submodule of a compiled model,
and a compiled function (or method) called by a compiled function. Capture traces the original
behind ember's wrapper (ember.capture.compiled), so the outer call is one graph with the inner
call's operators, guarded like any submodule or callee; without that, capture reached the
runtime's wrapper code and broke the graph there."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import ember.runtime as er


def _model(compiled_inner: bool = True) -> tuple[nn.Sequential, Any]:
    """Linear, Linear (compiled on its own), Linear; the same weights on every call."""
    torch.manual_seed(0)
    outer = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3))
    if compiled_inner:
        outer[1] = er.compile(outer[1], backend="eager")
    return outer, outer[1]


def _one_graph(compiled: Any) -> er.ExplainReport:
    rep = er.explain(compiled)
    assert rep.break_count == 0 and not rep.fallbacks, str(rep)
    assert len(rep.graphs) == 1, str(rep)
    return rep


def test_compiled_submodule_is_traced_into_the_outer_graph() -> None:
    outer, inner = _model()
    eager, _ = _model(compiled_inner=False)
    compiled = er.compile(outer, backend="eager")
    x = torch.randn(2, 4, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    y, ye = compiled(x), eager(xe)
    torch.testing.assert_close(y, ye)
    rep = _one_graph(compiled)
    g = rep.graphs[0]
    assert g.op_counts["aten.addmm.default"] == 3
    assert "self.1._orig_mod.weight" in g.inputs  # the inner module's own parameter
    y.sum().backward()
    ye.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad)
    for p, pe in zip(outer.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, pe.grad)
    # the inner wrapper was never called on its own
    assert inner.compiled.history.calls == 0


def test_compiled_submodule_with_the_inductor() -> None:
    outer, _ = _model()
    compiled = er.compile(outer)
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), outer(x))
    _one_graph(compiled)


def test_swapping_the_compiled_submodule_recompiles() -> None:
    outer, _ = _model()
    compiled = er.compile(outer, backend="eager")
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        outer[1] = er.compile(nn.Linear(6, 6), backend="eager")
        torch.testing.assert_close(compiled(x), outer(x))
    history = compiled.compiled.history
    assert len(history.recompilations) == 1 and "self.1" in history.recompilations[0]


def _sin1(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def _cos1(x: torch.Tensor) -> torch.Tensor:
    return x.cos() - 1


HELPER = er.compile(_sin1, backend="eager")


def _calls_helper(x: torch.Tensor) -> torch.Tensor:
    return HELPER(x) * 2


def test_compiled_function_inside_a_compiled_function() -> None:
    global HELPER
    compiled = er.compile(_calls_helper, backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), _sin1(x) * 2)
    rep = _one_graph(compiled)
    assert rep.graphs[0].op_counts == {"aten.sin.default": 1, "aten.add.Tensor": 1,
                                       "aten.mul.Tensor": 1}
    assert HELPER.history.calls == 0
    saved = HELPER
    try:
        HELPER = er.compile(_cos1, backend="eager")  # a different compiled function: guarded
        torch.testing.assert_close(compiled(x), _cos1(x) * 2)
    finally:
        HELPER = saved
    assert len(compiled.history.recompilations) == 1


class WithCompiledMethod(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @er.compile(backend="eager")
    def head(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x) + x


def test_compiled_method_called_by_a_compiled_forward() -> None:
    m = WithCompiledMethod()
    compiled = er.compile(m, backend="eager")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), torch.tanh(m.lin(x)) + x)
    _one_graph(compiled)


class Breaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.sum().item() > 0)  # data-dependent: a graph break
        return self.lin(x) * (n + 1)


def test_a_break_inside_the_compiled_submodule_calls_its_wrapper() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(3, 3), Breaks(), nn.ReLU())
    torch.manual_seed(0)
    outer = nn.Sequential(nn.Linear(3, 3), Breaks(), nn.ReLU())
    inner = outer[1] = er.compile(outer[1], backend="eager")
    compiled = er.compile(outer, backend="eager")
    with torch.no_grad():
        for x in (torch.randn(2, 3), -torch.ones(2, 3) * 5):
            torch.testing.assert_close(compiled(x), plain(x))
    assert er.explain(compiled).break_count == 1
    # at the break the wrapper itself runs (its own captures), not a compile of the wrapper
    assert inner.compiled.history.calls >= 2
    assert all(obj is not inner for obj, _ in compiled.compiled._spawned.values())


class CallsForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = er.compile(nn.Linear(4, 4), backend="eager")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b.forward(self.a(x)).relu()  # the compiled submodule's forward, by name


def test_the_compiled_submodules_forward_called_by_name() -> None:
    m = CallsForward()
    compiled = er.compile(m, backend="eager")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x))
    _one_graph(compiled)
