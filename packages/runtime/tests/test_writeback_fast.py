"""The Epilogue's per-call fast paths (writeback.py): the grad mode is switched only where the
write-back or a view replay needs another mode than the call's, and a plan of plain results
returns them as they are. Each keeps eager's autograd record, requires_grad and `_base`."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.runtime as er


def _twice(c: Any, f: Any, make: Any) -> None:
    for _ in range(3):  # first call, then the entry (the fast paths run from the 2nd on)
        a, b = make(), make()
        got, want = c(a), f(b)
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("grad", [False, True])
def test_a_view_made_under_no_grad_is_replayed_under_no_grad(grad: bool) -> None:
    w = torch.randn(4, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * w
        with torch.no_grad():
            return y.view(2, 2)

    c = er.compile(f, backend="eager")
    with torch.set_grad_enabled(grad):
        _twice(c, f, lambda: torch.ones(4))
        out, ref = c(torch.ones(4)), f(torch.ones(4))
        assert out._base is not None
    if grad:  # a view made in no_grad mode refuses an in-place write under grad mode
        for t in (ref, out):
            with pytest.raises(RuntimeError, match="no_grad mode"):
                t.mul_(2)


def test_a_mutated_input_is_recorded_by_autograd_only_as_in_eager() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x.view(-1)

    c = er.compile(f, backend="eager")
    leaf = torch.randn(4, requires_grad=True)
    for _ in range(3):
        a, b = leaf * 1, leaf * 1  # non-leaf inputs: the in-place write is recorded
        got, want = c(a), f(b)
        assert a.grad_fn is not None and got._base is a
        g1, = torch.autograd.grad(got.sum(), leaf)
        g2, = torch.autograd.grad(want.sum(), leaf)
        torch.testing.assert_close(g1, g2)
    with torch.no_grad():  # not recorded, and a leaf that requires grad may be written
        for _ in range(3):
            a, b = torch.randn(4), torch.randn(4)
            b.copy_(a)
            torch.testing.assert_close(c(a), f(b))
            torch.testing.assert_close(a, b)
            assert a.grad_fn is None


def test_plain_results_come_back_as_the_graph_made_them() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x * 2

    c = er.compile(f, backend="eager")
    x = torch.randn(3, 5)
    for _ in range(3):
        got = c(x)
        assert isinstance(got, tuple) and len(got) == 2
        torch.testing.assert_close(got[0], x + 1)
        torch.testing.assert_close(got[1], x * 2)
        assert got[0]._base is None
    e = c.entries[0]
    assert e.epilogue._plain is not None



def test_the_fast_aliasing_path_never_rejects_by_itself() -> None:
    """The aliasing check's fast path (only moved inputs' storages are read) answers only
    "no alias". What it takes for an alias is decided by the full check: the cache below keeps
    its address, but the record the fast path compares a moved `pos` with may be stale (a
    freed storage's, its address reused by `pos`'s new storage, as happened to a recycled KV
    cache one time in ten: a spurious recompilation). Here the record is made to name `pos`."""
    def step(cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.index_fill_(0, pos, 1.0)
        return cache.sum()

    c = er.compile(step, backend="eager")
    cache = torch.zeros(64)
    for k in range(3):  # compiled, a full check, then one where only `pos` moved
        c(cache, torch.tensor([k]))
    ep = c.entries[0].epilogue
    assert ep._stable is not None  # the fast path is armed
    pos = torch.tensor([5])
    s = pos.untyped_storage()
    ep._stable_storages = frozenset({s._cdata, s.data_ptr()})  # a stale record naming `pos`
    torch.testing.assert_close(c(cache, pos), cache.clone().index_fill_(0, pos, 1.0).sum())
    assert len(c.entries) == 1 and not er.explain(c).recompilations
