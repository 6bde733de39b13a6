"""paramcache's by-value test of a kept call's non-Parameter inputs (BatchNorm's running
statistics) in C: from an entry's first hit on, one memcmp call per kept kernel call against
the copies taken at store time, instead of torch.equal per input; torch.equal stays for an
input not contiguous. Either way a write that bypasses the version counter is seen."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.inductor import paramcache


def _entry(ins: tuple[torch.Tensor, ...]) -> paramcache.Entry:
    k = paramcache.key([paramcache.empty(len(ins))], paramcache.empty(len(ins)), ins)
    assert k is not None
    return paramcache.store(paramcache.empty(len(ins)), k, ins, (torch.zeros(1),))


def _check(ins: tuple[torch.Tensor, ...]) -> paramcache._Check:
    c = _entry(ins)[5]
    assert isinstance(c, paramcache._Check)
    return c


def _needs_c() -> None:
    if paramcache._memeq() is None:
        pytest.skip("no C++ compiler here: torch.equal only")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
       at=st.integers(0, 10**6), which=st.integers(0, 1), stride=st.booleans())
def test_a_write_past_the_version_counter_is_seen(n: int, dtype: torch.dtype, at: int,
                                                   which: int, stride: bool) -> None:
    _needs_c()
    w = torch.nn.Parameter(torch.randn(n))
    mean = torch.arange(n).to(dtype)
    var = (torch.arange(2 * n).to(dtype)[::2] if stride else torch.arange(n).to(dtype) + 1)
    ins = (w, mean, var)
    check = _check(ins)
    assert check.ready is None  # (nothing made at the store)
    assert paramcache.same(check, ins)
    # contiguous statistics: the C test from the first hit on; a strided one: torch.equal
    assert (check.ready is not None) is var.is_contiguous()
    t = ins[1 + which]
    before = t._version
    t.data[at % n] += 1  # (through .data: the version counter does not move)
    assert t._version == before
    assert not paramcache.same(check, ins)
    t.data[at % n] -= 1
    assert paramcache.same(check, ins)
    w.data.add_(1)  # a Parameter is not compared by value (its version is its key)
    assert paramcache.same(check, ins)


def test_parameters_alone_have_nothing_to_compare() -> None:
    ins = (torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4)))
    check = _check(ins)
    assert check.copies == (None, None) and paramcache.same(check, ins)
    assert check.ready is None


def test_the_table_points_into_the_held_copies() -> None:
    _needs_c()
    stat = torch.randn(64)
    ins = (torch.nn.Parameter(torch.randn(64)), stat)
    check = _check(ins)
    assert paramcache.same(check, ins) and check.ready is not None
    copy = check.copies[1]
    assert check.ready is not None
    table = check.ready[3]
    assert copy is not None and copy.data_ptr() == table[2] and table[1] == stat.data_ptr()
    torch.testing.assert_close(copy, stat, rtol=0, atol=0)


def test_stores_without_hits_build_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step stores every kept call and hits none: the C test is made at an entry's
    first hit only (its table costs ~10 us)."""
    made: list[int] = []
    real = paramcache._memeq

    def counted() -> Any:
        made.append(1)
        return real()
    monkeypatch.setattr(paramcache, "_memeq", counted)
    ins = (torch.nn.Parameter(torch.randn(8)), torch.randn(8))
    checks = [_check(ins) for _ in range(3)]
    assert made == []
    assert paramcache.same(checks[0], ins) and paramcache.same(checks[0], ins)
    assert made == [1]


def test_a_failed_build_is_tried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the comparator does not build, entries keep torch.equal without compiling again
    at every entry's first hit."""
    from ember.inductor.targets.cpu import cache
    tries: list[str] = []

    def fail(source: str) -> Any:
        tries.append(source)
        raise cache.CompileError("no compiler")
    monkeypatch.setattr(cache, "load", fail)
    monkeypatch.setattr(cache, "_LOADED", {})
    monkeypatch.setattr(paramcache, "_NO_BUILD", [])
    monkeypatch.setattr(paramcache, "_LIB", [None, None])
    ins = (torch.nn.Parameter(torch.randn(8)), torch.randn(8))
    for _ in range(3):
        check = _check(ins)
        assert paramcache.same(check, ins) and check.ready is None
    assert len(tries) == 1
