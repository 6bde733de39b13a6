"""Per-call host work of a compiled function in a decode loop (issue 20): every step calls the
same entry with the same ~400 tensors, so the other entries' guards and the inputs' storages
are not read again each step."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.runtime as er
import ember.runtime.writeback as wb


def _counting(obj: Any, name: str) -> list[int]:
    n = [0]
    f = getattr(obj, name)

    def counted(*a: Any, **k: Any) -> Any:
        n[0] += 1
        return f(*a, **k)
    setattr(obj, name, counted)
    return n


def test_the_entry_the_last_call_ran_is_checked_first() -> None:
    c = er.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    a, b = torch.randn(3), torch.randn(5)
    for x in (a, a, b, b):  # two entries; the second ran last
        torch.testing.assert_close(c(x), x * 2 + 1)
    assert len(c.entries) == 2
    first = _counting(c.entries[0].code, "guard")
    for _ in range(3):
        torch.testing.assert_close(c(b), b * 2 + 1)
    assert first[0] == 0  # the first entry's (failing) check is not paid per call
    torch.testing.assert_close(c(a), a * 2 + 1)  # and it still serves its inputs
    assert first[0] >= 1 and len(c.entries) == 2


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """[how many times the runtime has read the input storages (writeback.aliasing)]."""
    calls = [0]
    real = wb.aliasing

    def counted(inputs: Any) -> Any:
        calls[0] += 1
        return real(inputs)
    monkeypatch.setattr(wb, "aliasing", counted)
    return calls


def test_storages_are_read_again_only_when_an_address_changes(calls: list[int]) -> None:
    def step(cache: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache.add_(v)
        return cache.sum()

    c = er.compile(step, backend="eager")
    cache, ref, v = torch.zeros(4), torch.zeros(4), torch.ones(4)
    for _ in range(5):
        torch.testing.assert_close(c(cache, v), step(ref, v))
    assert calls[0] <= 3  # the capture's, then once for the first call's addresses
    before = calls[0]
    # a view of the cache as v: v's address changed, so the storages are read again, and
    # the new aliasing pattern is a cache miss (the result is still eager's)
    torch.testing.assert_close(c(cache, cache[:]), step(ref, ref[:]))
    assert calls[0] > before
    torch.testing.assert_close(cache, ref)


def test_only_the_inputs_that_move_have_their_storage_read(calls: list[int]) -> None:
    """A decode step's token ids are a new tensor every call: after two calls, only that
    input's storage is read per call; one that shares the cache's storage is still a miss."""
    def step(cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        cache.add_(ids[:1])
        return cache * 2

    c = er.compile(step, backend="eager")
    base, rbase = torch.zeros(8), torch.zeros(8)
    cache, ref = base[:4], rbase[:4]
    kept = []  # (alive: each call's ids at a new address)
    for _ in range(6):
        ids = torch.randn(4)
        kept.append(ids)
        torch.testing.assert_close(c(cache, ids), step(ref, ids))
    assert calls[0] <= 3, calls  # the capture's and two full checks, then incremental
    # ids sharing the cache's storage: the incremental check sees it (a miss, eager's result)
    assert len(c.entries) == 1
    got, want = c(cache, base[4:]), step(ref, rbase[4:])
    assert len(c.entries) == 2  # a capture for the new aliasing pattern
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cache, ref)
