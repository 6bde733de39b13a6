"""mode="reduce-overhead": every graph not recorded, and every recording made again, says why.

On the H200 the batch-8 decode step of a static-cache generate() was recorded again in each
generate(), and explain said only "a static input moved"; the batch-8 prefill was not
recorded "(None)". Now each re-recording names the inputs that moved, by their capture
source, and whether they moved soon after the recording (a new tensor each call: copied once
moved twice) or after a run of replays (a new long-lived tensor: another generate()'s cache);
a call past the recording limit and a restore of copied inputs say so too; a graph with a
kernel on the reference interpreter is not recorded with that kernel's reason. On the CPU,
with the stand-in recorders of test_cudagraphs.py / test_cudagraphs_reuse.py.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.cudagraphs import CudaGraphs, input_names, moved_reason
from ember.runtime.history import CudaGraphRecord
from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.runtime.tests.test_cudagraphs_reuse import ForgetfulRecorder

pytestmark = INTERPRETER_ONLY

compile_mod = importlib.import_module("ember.runtime.compile")


@pytest.fixture
def forgetful(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_mod, "CudaGraphs",
                        lambda: CudaGraphs(ForgetfulRecorder(), device_type="cpu"))


def step(cache: torch.Tensor, pos: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(0, pos, v)  # updated in place: a static input of the recording
    return cache.sum(0)


def test_a_new_long_lived_input_names_itself(forgetful: None) -> None:
    """Two "generate()"s, each with its own cache kept alive: the decode step is recorded
    again once, because input 0 (`cache`) moved after a run of replays."""
    decode = er.compile(step, mode="reduce-overhead")
    keep = []
    for _ in range(2):
        cache = torch.zeros(64, 256)
        keep.append(cache)
        for k in range(6):
            decode(cache, torch.tensor([k]), torch.randn(1, 256))
    rec = er.explain(decode).cuda_graphs[0]
    assert rec.rerecorded == 1
    assert rec.reasons == {moved_reason("input 0 (cache)", False): 1}, rec.reasons
    assert "recorded again: input 0 (cache) moved after a run of replays" in rec.text()
    assert "recorded again: input 0 (cache)" in str(er.explain(decode))


def test_a_new_tensor_each_call_is_churn_then_copied(forgetful: None) -> None:
    """A static input replaced right after its recording: each re-recording says it moved
    within a few replays; after two such moves it is copied (no more re-recordings)."""
    decode = er.compile(step, mode="reduce-overhead")
    keep = []
    for k in range(8):
        cache = torch.zeros(64, 256)
        keep.append(cache)
        decode(cache, torch.tensor([k % 64]), torch.randn(1, 256))
        decode(cache, torch.tensor([k % 64]), torch.randn(1, 256))
    rec = er.explain(decode).cuda_graphs[0]
    soon = moved_reason("input 0 (cache)", True)
    assert set(rec.reasons) == {soon} and rec.reasons[soon] == rec.rerecorded >= 1, rec.text()
    assert "within 4 replays of its recording" in rec.text()


def test_past_the_recording_limit_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_mod, "CudaGraphs", lambda: CudaGraphs(
        ForgetfulRecorder(), device_type="cpu", max_recordings=1))

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0)
    cf = er.compile(f, mode="reduce-overhead", dynamic=True)
    for n in (3, 3, 5, 5, 5):
        cf(torch.randn(n, 4))
    rec = er.explain(cf).cuda_graphs[0]
    assert rec.over_limit >= 1
    assert rec.reasons == {"a binding past the limit of 1 recordings runs without a graph":
                           rec.over_limit}, rec.reasons


def test_reasons_are_bounded_and_shown_with_counts() -> None:
    rec = CudaGraphRecord(0, "g")
    for k in range(CudaGraphRecord.MAX_REASONS + 3):
        rec.because(f"why {k}")
    rec.because("why 0")
    assert len(rec.reasons) == CudaGraphRecord.MAX_REASONS + 1  # and "other reasons"
    assert rec.reasons["why 0"] == 2 and rec.reasons["other reasons"] == 3
    assert "; why 0 (x2)" in rec.text() and "; other reasons (x3)" in rec.text()


def test_input_names() -> None:
    names = ["a", "b['k']", "c", "d", "e"]
    assert input_names([1], names) == "input 1 (b['k'])"
    assert input_names([0, 1, 2, 3, 4], names) == \
        "input 0 (a), input 1 (b['k']), input 2 (c) and 2 more"
    assert input_names([7], []) == "input 7"


def test_a_graph_with_a_kernel_on_the_reference_is_not_recorded_with_its_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton target (interpreted, in the CPU's place) leaves a kernel to the reference
    interpreter: the graph is not recorded, and explain names the kernel and the renderer's
    reason (it was "(None)")."""
    pytest.importorskip("triton", reason="the Triton target's tests need the triton package")
    import dataclasses

    from ember.inductor.targets import add_target, targets, unregister_target
    from ember.inductor.targets.cuda import render
    monkeypatch.setitem(render.OPS, "prims.sub", {})
    monkeypatch.setattr(compile_mod, "CudaGraphs",
                        lambda: CudaGraphs(ForgetfulRecorder(), device_type="cpu"))
    cpu = targets()["cpu"]
    unregister_target("cpu")
    try:
        add_target(dataclasses.replace(
            cpu, pipeline="inductor-cuda-interpret", loader="triton", lowerings={},
            front="decompose,cse,dce", description="Triton in the interpreter (a test)"))

        def f(x: torch.Tensor) -> torch.Tensor:
            return (x - 1).exp()
        cf = er.compile(f, mode="reduce-overhead")
        x = torch.randn(4, 8)
        for _ in range(3):
            torch.testing.assert_close(cf(x), f(x))
    finally:
        unregister_target("cpu")
        add_target(cpu)
    rec = er.explain(cf).cuda_graphs[0]
    assert rec.skipped is not None and rec.recordings == 0
    assert "prims.sub has no Triton template" in rec.skipped, rec.skipped
    assert "(None)" not in str(er.explain(cf))


def test_a_call_recording_gradients_says_so() -> None:
    """The runner's decision alone (compile() keeps training graphs apart, so this is the
    runner given an input that requires grad): run as compiled, with the reason counted."""
    from ember.ir import RunResult
    from ember.runtime.cudagraphs import GraphInfo
    from ember.runtime.history import History

    def runner(graph: str | None, inputs: Any) -> RunResult:
        return RunResult([inputs[0] * 2])
    h = History()
    x = torch.randn(3)
    run = CudaGraphs(ForgetfulRecorder(), device_type="cpu").wrap(
        h, runner, "g", 0, [x], GraphInfo(), None)
    xg = x.clone().requires_grad_()
    out = run(None, [xg]).outputs[0]
    assert out.requires_grad
    rec = h.cuda_graphs[0]
    assert rec.plain == 1 and rec.recordings == 0
    assert rec.reasons == {"a call recording gradients runs without a graph": 1}
