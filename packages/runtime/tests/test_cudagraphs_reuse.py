"""mode="reduce-overhead": recordings outlive the caller's static tensors, and come back to them.

transformers' generate() makes a new static cache per call: with the recording holding the old
cache alive, the new one could never land at its addresses, and every generate() paid a
re-recording (a capture of the whole decode step). A recording now holds only the buffers it
owns; the caller's static inputs are checked by address before each replay. An earlier
recording is kept per binding (an alternate) and replayed again when the static inputs come
back to its addresses. On the CPU, with the stand-in recorders of test_cudagraphs.py.
"""

from __future__ import annotations

import gc
import importlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.cudagraphs import MAX_ALTERNATES, CudaGraphs
from ember.testing.triton_mode import NEEDS_CUDA
from packages.runtime.tests.test_cudagraphs import ReplayingRecorder, mlp

compile_mod = importlib.import_module("ember.runtime.compile")


@pytest.fixture
def replaying(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile()'s CUDA graphs recorded by test_cudagraphs.py's CPU stand-in."""
    monkeypatch.setattr(compile_mod, "CudaGraphs",
                        lambda: CudaGraphs(ReplayingRecorder(), device_type="cpu"))


class ForgetfulRecorder:
    """As a CUDA graph: keeps no Python reference to what it recorded (its replays do
    nothing: only what the recording keeps alive is tested with it)."""

    def __init__(self) -> None:
        self.captures = 0

    def capture(self, fn: Callable[[], list[Any]], device: torch.device,
                inputs: Sequence[Any], warm: Callable[[], Any]) -> tuple[Any, list[Any]]:
        self.captures += 1
        warm()
        return object(), fn()

    def replay(self, graph: Any) -> None:
        pass


def test_a_recording_does_not_keep_the_callers_static_tensors_alive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = ForgetfulRecorder()
    monkeypatch.setattr(compile_mod, "CudaGraphs",
                        lambda: CudaGraphs(recorder, device_type="cpu"))
    c = er.compile(mlp, mode="reduce-overhead")
    x = torch.randn(4, 160)
    first = torch.randn(160, 160)  # large: static (read in place) from its second call
    c(x, first)  # (the capture keeps its example inputs: this one)
    c(x, first)
    w = torch.randn(160, 160)  # another: recorded again with it in place
    for _ in range(3):
        torch.testing.assert_close(c(x, w), mlp(x, w))
    assert recorder.captures == 2 and er.explain(c).cuda_graphs[0].rerecorded == 1
    gone = weakref.ref(w)
    del w
    gc.collect()
    assert gone() is None  # the recording held its address only


def test_static_inputs_coming_back_replay_the_earlier_recording(replaying: None) -> None:
    """Two caches used in turn, each for a run of replays (two generate()s alternating): two
    recordings, then each replayed again where its addresses come back; no third capture."""
    c = er.compile(mlp, mode="reduce-overhead")
    a, b = torch.randn(160, 160), torch.randn(160, 160)
    x = torch.randn(4, 160)
    for w in (a, b, a, b, a):
        for _ in range(6):
            torch.testing.assert_close(c(x, w), mlp(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert (g.recordings, g.rerecorded, g.reused) == (2, 1, 3), g.text()
    assert "3 return(s) to an earlier recording's addresses" in g.text()
    assert g.bindings == ["(static shapes)"]  # one binding, two recordings of it


def test_alternates_per_binding_are_bounded(replaying: None) -> None:
    c = er.compile(mlp, mode="reduce-overhead")
    ws = [torch.randn(160, 160) for _ in range(MAX_ALTERNATES + 2)]
    x = torch.randn(4, 160)
    for w in [*ws, ws[0]]:  # the first one again: its recording was dropped, recorded anew
        for _ in range(6):
            torch.testing.assert_close(c(x, w), mlp(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert g.reused == 0 and g.recordings == len(ws) + 1, g.text()


@NEEDS_CUDA
def test_a_new_tensor_at_a_freed_static_address_replays_without_recording_again() -> None:
    """On a GPU: the caller frees its static tensor (the last generate()'s cache) and makes a
    new one of its size, which the caching allocator puts at the same address: the recording
    replays on it (nothing re-recorded), and reads the new values."""
    def weight() -> torch.nn.Parameter:  # (a parameter: always read in place)
        return torch.nn.Parameter(torch.randn(160, 160, device="cuda"), requires_grad=False)

    c = er.compile(mlp, mode="reduce-overhead")
    x = torch.randn(4, 160, device="cuda")
    first = weight()
    for _ in range(2):  # compiled (the capture keeps this one as its example), recorded
        c(x, first)
    w = weight()
    for _ in range(6):  # recorded again with w in place, then replayed
        torch.testing.assert_close(c(x, w), mlp(x, w))
    at = w.data_ptr()
    del w
    w = weight()
    if w.data_ptr() != at:
        pytest.skip("the allocator put the new tensor elsewhere")
    (g,) = er.explain(c).cuda_graphs
    before = (g.recordings, g.rerecorded)
    for _ in range(3):
        torch.testing.assert_close(c(x, w), mlp(x, w))
    assert (g.recordings, g.rerecorded) == before and g.recordings == 2, g.text()


def _step(cache: torch.Tensor, pos: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(0, pos, v)
    return cache.sum(0) * 2


def test_a_cache_copied_after_short_sessions_is_read_in_place_again(replaying: None) -> None:
    """A static cache that moves right after being recorded twice (generate()s of one token)
    is copied in and written back per call from then on; once a cache stays put for a run of
    calls (a long generate()), the binding is recorded again with it read in place."""
    c = er.compile(_step, mode="reduce-overhead")

    def session(calls: int) -> None:
        cache, ref = torch.zeros(6, 4), torch.zeros(6, 4)
        for i in range(calls):
            pos, v = torch.tensor([i]), torch.randn(1, 4)
            torch.testing.assert_close(c(cache, pos, v), _step(ref, pos, v))
            torch.testing.assert_close(cache, ref)

    session(6)
    for _ in range(3):  # three 1-call sessions: the cache is demoted to a copied input
        session(1)
    runner = _runner(c)
    assert runner.demoted == [0] and runner.recordings[()][0].copied[:1] == [0]
    session(6)  # stays put: after a run of replays, recorded again with it in place
    (g,) = er.explain(c).cuda_graphs
    assert g.restored == 1 and "1 re-recording(s) reading copied inputs in place" in g.text()
    assert runner.demoted == [] and 0 in dict(runner.recordings[()][0].static)


def _runner(c: Any) -> Any:
    """The compiled function's CUDA-graph runner (one graph)."""
    from ember.runtime.cudagraphs import _GraphRunner
    found = [o for o in gc.get_referrers(er.explain(c).cuda_graphs[0])
             if isinstance(o, _GraphRunner)]
    assert len(found) == 1
    return found[0]
