"""mode="reduce-overhead": a result the caller let go of is written again in place.

Each replay clones its results out of the recording's pool. Where the tensor a result was
cloned into last time is held by nothing but the runner (the caller dropped it, no view, no
storage reference, no weak reference), the next replay writes into it again: the result keeps
its address. That is what keeps a static KV cache where it was: transformers' generate() makes
its static cache in the prefill (a graph's results), and the decode step's recording reads
the cache in place; a cache at a new address per generate() meant a re-recording of the whole
decode step per generate(). On the CPU, with the stand-in recorder of test_cudagraphs.py.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.cudagraphs import CudaGraphs
from packages.runtime.tests.test_cudagraphs import ReplayingRecorder
from packages.runtime.tests.test_cudagraphs_reuse import ForgetfulRecorder

compile_mod = importlib.import_module("ember.runtime.compile")


@pytest.fixture
def replaying(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_mod, "CudaGraphs",
                        lambda: CudaGraphs(ReplayingRecorder(), device_type="cpu"))


def prefill(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(64, 256) + x  # a new "cache" (a pool result: cloned out per call)


def step(cache: torch.Tensor, pos: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(0, pos, v)  # the cache is updated in place: a static input
    return cache.sum(0)


def test_a_new_cache_lands_where_the_dropped_one_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four "generate()"s: each makes its cache in a recorded prefill and runs recorded decode
    steps against it; the caller drops the cache after each. From the second on (the first
    one's cache is the prefill's warm-up, compiled code's) the cache is at the same address:
    the decode step is recorded again once, not once per "generate()". (A recorder that, as a
    CUDA graph, keeps no reference to the inputs it recorded: replays compute nothing here;
    the values are tested below with the replaying one.)"""
    recorder = ForgetfulRecorder()
    monkeypatch.setattr(compile_mod, "CudaGraphs",
                        lambda: CudaGraphs(recorder, device_type="cpu"))
    make = er.compile(prefill, mode="reduce-overhead")
    decode = er.compile(step, mode="reduce-overhead")
    x = torch.randn(256)
    addresses = []
    for g in range(5):
        cache = make(x)
        addresses.append(cache.data_ptr())
        for k in range(4):
            decode(cache, torch.tensor([k + g]), torch.randn(1, 256))
        del cache
        # (the freed memory taken by something else: without writing in place, the next
        # cache could not land at its address)
        taken = torch.empty(64, 256)  # noqa: F841
    rep = er.explain(decode).cuda_graphs[0]
    assert rep.recordings == 2 and rep.rerecorded == 1, rep.text()
    assert er.explain(make).cuda_graphs[0].recycled == 3
    assert len(set(addresses[1:])) == 1


@pytest.mark.parametrize("hold", ["tensor", "view", "storage", "weakref"])
def test_a_result_the_caller_still_holds_is_not_overwritten(replaying: None, hold: str) -> None:
    """Anything still reaching the last result (the tensor, a view, its storage, a weak
    reference) keeps it from being written again: the next result is a new tensor, and the
    old one keeps its values (a weak reference's is released, not overwritten)."""
    import weakref
    make = er.compile(prefill, mode="reduce-overhead")
    for _ in range(2):  # a warm-up, then the recording (its result cloned)
        make(torch.zeros(256))
    first = make(torch.ones(256))
    kept: object = {"tensor": lambda: first, "view": lambda: first[3:],
                    "storage": lambda: first.untyped_storage(),
                    "weakref": lambda: weakref.ref(first)}[hold]()
    ptr = first.data_ptr()
    if hold != "tensor":
        del first
    second = make(torch.full((256,), 2.0))
    assert second.data_ptr() != ptr
    old = kept if hold == "tensor" else None
    if hold == "view":
        old = kept._base  # type: ignore[attr-defined]
    elif hold == "storage":
        old = torch.empty(0).set_(kept)  # type: ignore[call-overload]
    if hold == "weakref":  # released, never overwritten under the reference
        assert kept() is None  # type: ignore[operator]
    else:
        assert old is not None and float(old.reshape(-1)[0]) == 1.0
    third = make(torch.full((256,), 3.0))
    torch.testing.assert_close(third, prefill(torch.full((256,), 3.0)))
    torch.testing.assert_close(second, prefill(torch.full((256,), 2.0)))
    ptr = third.data_ptr()
    del third
    fourth = make(torch.full((256,), 4.0))  # written into the dropped one: same address
    assert fourth.data_ptr() == ptr
    torch.testing.assert_close(fourth, prefill(torch.full((256,), 4.0)))


def test_a_recording_does_not_hold_a_cache_the_backend_wrote_in_place() -> None:
    """The CUDA target writes a static KV cache's new rows in place and returns the cache
    itself as the graph's result for it (cache-inplace). The recording kept its results, so
    it kept that cache alive: the next generate()'s prefill could not write its new cache
    into the dropped one (still held), the cache moved, and the decode step was recorded
    again every generate() (seen on the H200 at 51cfd9c). The recording keeps none of it."""
    import gc
    import weakref

    from ember.ir import RunResult
    from ember.runtime.cudagraphs import GraphInfo
    from ember.runtime.history import History

    def runner(graph: str | None, inputs: Any) -> RunResult:
        cache, v = inputs
        cache.add_(v)  # (the backend's in-place write: the result is the input itself)
        return RunResult([cache, cache.sum(0), cache[:2]])

    graphs = CudaGraphs(ForgetfulRecorder(), device_type="cpu")
    cache, v = torch.zeros(64, 256), torch.ones(256)
    run = graphs.wrap(History(), runner, "step", 0, [cache, v],
                      GraphInfo({0: 0}, frozenset({1, 2})), None)
    for _ in range(3):  # a warm-up, the recording, a replay
        outs = run(None, [cache, v]).outputs
    assert outs[0] is cache and outs[2].data_ptr() == cache.data_ptr()  # (in place; a view)
    gone = weakref.ref(cache)
    del cache, outs
    gc.collect()
    assert gone() is None
