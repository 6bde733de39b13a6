"""paramcache's by-value test of a kept call's non-Parameter inputs (BatchNorm's running
statistics) in C: one memcmp call per kept kernel call against the copies taken at store
time, instead of torch.equal per input; torch.equal stays for an input not contiguous when
stored. Either way a write that bypasses the version counter is seen."""

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
    e = _entry(ins)
    check = e[5]
    # contiguous statistics: the C test; a strided one: torch.equal
    assert isinstance(check, paramcache._Bytes) is var.is_contiguous()
    assert paramcache.same(check, ins)
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
    e = _entry(ins)
    assert e[5] == (None, None) and paramcache.same(e[5], ins)


def test_the_copies_live_with_the_entry() -> None:
    """The table points into the copies taken at store time: the entry holds them."""
    _needs_c()
    stat = torch.randn(64)
    ins = (torch.nn.Parameter(torch.randn(64)), stat)
    check = _entry(ins)[5]
    assert isinstance(check, paramcache._Bytes)
    assert check.copies[0].data_ptr() == check.table[2] and check.table[1] == stat.data_ptr()
    torch.testing.assert_close(check.copies[0], stat, rtol=0, atol=0)


def test_a_failed_build_is_tried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the comparator does not build, stores keep torch.equal without compiling again
    on every store (a training step stores every kept call)."""
    from ember.inductor.targets.cpu import cache
    tries: list[str] = []

    def fail(source: str) -> Any:
        tries.append(source)
        raise cache.CompileError("no compiler")
    monkeypatch.setattr(cache, "load", fail)
    monkeypatch.setattr(paramcache, "_NO_BUILD", [])
    ins = (torch.nn.Parameter(torch.randn(8)), torch.randn(8))
    for _ in range(3):
        e = _entry(ins)
        assert isinstance(e[5], tuple) and paramcache.same(e[5], ins)
    assert len(tries) == 1
