"""Global nn.Module hooks registered after compiling: capture refuses a module call while one is
registered (capture/modules.py), and a capture that called a module holds one guard on torch's
global call-hook tables, so a hook registered later fails it (the call runs eagerly, the hook
with it) under the full and the fast guard check alike."""

from __future__ import annotations

import torch
from torch import nn

import ember.runtime as er


def test_a_global_forward_hook_added_after_compiling_is_seen() -> None:
    m = nn.Sequential(nn.Linear(3, 3))  # the hook is on the submodule call capture inlined
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        torch.testing.assert_close(c(x), m(x))  # (the fast check is built and used)
        handle = nn.modules.module.register_module_forward_hook(
            lambda mod, i, o: o * 3 if isinstance(mod, nn.Linear) else o)
        try:
            got, want = c(x), m(x)
        finally:
            handle.remove()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(c(x), m(x))  # removed again: the compiled graph holds
    assert any("no global nn.Module forward/backward hooks" in r
               for r in c.compiled.history.recompilations), c.compiled.history.recompilations
