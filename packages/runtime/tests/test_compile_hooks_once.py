"""Global nn.Module hooks fire once per module call under a compiled module, as in eager: the
compiled module's own nn.Module call runs them, and a call that ember runs eagerly inside it
(capture refuses module calls while a global hook is registered) runs the forward alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ember.runtime as er


def _fired(run: Callable[[], Any]) -> tuple[list[str], Any]:
    seen: list[str] = []
    hooks = [
        nn.modules.module.register_module_forward_pre_hook(
            lambda m, a: seen.append("pre " + type(m).__name__)),
        nn.modules.module.register_module_forward_hook(
            lambda m, a, o: seen.append(type(m).__name__)),
    ]
    try:
        out = run()
    finally:
        for h in hooks:
            h.remove()
    return seen, out


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_global_hooks_fire_once_per_call(backend: str) -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    c = er.compile(m, backend=backend)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))  # compiled without hooks first
        want, ref = _fired(lambda: m(x))
        for _ in range(2):  # the hooks fail the guards: ember runs the call eagerly
            got, out = _fired(lambda: c(x))
            assert got == want, (got, want)
            torch.testing.assert_close(out, ref)


def test_an_output_rewriting_global_hook_applies_once() -> None:
    m = nn.Linear(3, 3)
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 3)
    h = nn.modules.module.register_module_forward_hook(lambda mod, a, o: o * 3)
    try:
        with torch.no_grad():
            for _ in range(3):  # (first call, then the entry it made)
                torch.testing.assert_close(c(x), m(x))
    finally:
        h.remove()
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))


def test_a_global_backward_hook_fires_once() -> None:
    m = nn.Linear(3, 3)
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 3, requires_grad=True)
    counts = []
    for fn in (m, c):
        n = [0]
        h = nn.modules.module.register_module_full_backward_hook(
            lambda mod, gi, go, n=n: n.__setitem__(0, n[0] + 1))
        try:
            fn(x).sum().backward()
        finally:
            h.remove()
        counts.append(n[0])
    assert counts[0] == counts[1] == 1, counts
