"""A compiled module whose class defines its own `__call__` (transformers'
GradientCheckpointingLayer, a Linear that scales its output) runs that `__call__` once per call,
as eager does: the compiled module is an instance of the model's class (modview), so it used to
inherit the `__call__` and run it around the compiled function, which runs it again (capture
starts at it): twice eager's scale, under every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ember.runtime as er

BACKENDS = ["eager", "aot_eager", "inductor"]


def _opaque(x: torch.Tensor) -> torch.Tensor:
    return x + 1


_OPAQUE = torch.jit.script(_opaque)
if hasattr(_OPAQUE, "_torchdynamo_inline"):  # no inlining: the call is a graph break
    del _OPAQUE._torchdynamo_inline


class Doubled(nn.Linear):
    def __init__(self, brk: bool = False) -> None:
        super().__init__(4, 4)
        self.brk = brk
        self.ran = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.ran += 1  # (a side effect the compiled function replays: once per call)
        out = super().__call__(*args, **kwargs) * 2
        if self.brk:
            out = _OPAQUE(out) * 3  # a graph break inside the class's own __call__
        return out


def _check(m: Doubled, c: Callable[..., Any], calls: int = 3) -> None:
    x = torch.randn(2, 4)
    with torch.no_grad():
        ref = m(x)
        for _ in range(calls):  # (the first call captures; the later ones run its entry)
            m.ran = 0
            torch.testing.assert_close(c(x), ref)
            assert m.ran == 1, f"the class's __call__ ran {m.ran} times in one call"


@pytest.mark.parametrize("brk", [False, True], ids=["whole", "graph_break"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_own_call_runs_once(backend: str, brk: bool) -> None:
    m = Doubled(brk)
    c: Any = er.compile(m, backend=backend)
    history = c.compiled.history
    assert isinstance(c, Doubled)  # (still the model's class: the view)
    _check(m, c)
    # (with the break, the graph before it, the break and the resume all ran)
    assert bool(history.breaks) == brk


def test_own_call_runs_once_with_grad() -> None:
    m = Doubled()
    c = er.compile(m, backend="aot_eager")
    x = torch.randn(2, 4, requires_grad=True)
    ref = m(x)
    (gref,) = torch.autograd.grad(ref.sum(), x)
    for _ in range(2):
        m.ran = 0
        out = c(x)
        assert m.ran == 1
        torch.testing.assert_close(out, ref)
        (g,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(g, gref)


@pytest.mark.parametrize("on", ["original", "compiled"])
def test_own_call_runs_once_with_a_module_hook(on: str) -> None:
    m = Doubled(brk=True)
    c = er.compile(m, backend="eager")
    fired: list[int] = []
    ref_fired: list[int] = []

    def hook(mod: nn.Module, a: Any, o: torch.Tensor) -> torch.Tensor:
        fired.append(1)
        return o + 1

    x = torch.randn(2, 4)
    with torch.no_grad():
        h = m.register_forward_hook(hook)
        ref = m(x)  # eager: the hook rewrites Linear's output, then * 2, + 1, * 3
        h.remove()
        ref_fired, fired = fired, []
        h = (m if on == "original" else c).register_forward_hook(hook)
        try:
            for _ in range(2):
                m.ran = 0
                fired.clear()
                out = c(x)
                assert m.ran == 1 and fired == ref_fired == [1], (m.ran, fired)
                if on == "original":  # (a hook on the compiled module sees its output)
                    torch.testing.assert_close(out, ref)
        finally:
            h.remove()


def test_own_call_runs_once_with_a_global_hook() -> None:
    m = Doubled()
    c = er.compile(m, backend="inductor")
    x = torch.randn(2, 4)
    seen: list[str] = []
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))  # compiled without hooks first
        h = nn.modules.module.register_module_forward_hook(
            lambda mod, a, o: seen.append(type(mod).__name__))
        try:
            ref = m(x)
            want, seen[:] = list(seen), []
            for _ in range(2):  # the hook fails the guards: ember runs the call eagerly
                m.ran = 0
                torch.testing.assert_close(c(x), ref)
                assert m.ran == 1 and seen == want, (m.ran, seen, want)
                seen.clear()
        finally:
            h.remove()
