"""mode="reduce-overhead": CUDA graphs of compiled graphs (runtime/cudagraphs.py), on the CPU.

The decisions (what is recorded, per binding, when, which inputs are copied, which results are
cloned out of the pool, fallbacks and their reasons, explain's text) are tested here through
compile() with a recorder that stands in for torch.cuda.CUDAGraph on CPU tensors: it runs the
recorded function again on replay and copies the results into the tensors the recording
returned, as a replay writes the same addresses. So a caller that kept an earlier output sees it
overwritten exactly where a real replay would overwrite it. test_cudagraphs_cuda.py runs the
same paths with real CUDA graphs on a GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.cudagraphs import CudaGraphs, binding, skip_reason

compile_mod = importlib.import_module("ember.runtime.compile")


class ReplayingRecorder:
    """Records by running fn (restoring the inputs it wrote: a recording runs nothing) and
    replays by running it again into the recorded results' memory."""

    def __init__(self, fail: str | None = None):
        self.fail = fail
        self.outs: dict[int, list[Any]] = {}

    def capture(self, fn: Callable[[], list[Any]], device: torch.device,
                inputs: Sequence[Any], warm: Callable[[], Any]) -> tuple[Any, list[Any]]:
        if self.fail:
            raise RuntimeError(self.fail)
        warm()
        saved = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        outs = fn()
        for x, s in zip(inputs, saved, strict=True):
            if isinstance(x, torch.Tensor):
                x.copy_(s)
        self.outs[id(fn)] = outs
        return fn, outs

    def replay(self, graph: Any) -> None:  # the recorded results' memory is rewritten
        for old, new in zip(self.outs[id(graph)], graph(), strict=True):
            if isinstance(old, torch.Tensor) and old is not new:
                old.copy_(new)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[ReplayingRecorder]]:
    """Route compile()'s CUDA-graph managers to CPU recorders; returns a configurer (which
    returns the list of recorders made: one per compiled function)."""
    state: dict[str, Any] = {"fail": None, "max": 8, "recorders": []}

    def make() -> CudaGraphs:
        rec = ReplayingRecorder(state["fail"])
        state["recorders"].append(rec)
        return CudaGraphs(rec, device_type="cpu", max_recordings=state["max"])

    monkeypatch.setattr(compile_mod, "CudaGraphs", make)

    def configure(fail: str | None = None, max_recordings: int = 8) -> Any:
        state["fail"], state["max"] = fail, max_recordings
        return state["recorders"]
    return configure


def mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu() * 2 + 1


def test_records_after_one_warmup_then_replays(fake: Any) -> None:
    fake()
    c = er.compile(mlp, mode="reduce-overhead")
    w = torch.randn(8, 8)
    for _ in range(4):
        x = torch.randn(4, 8)
        torch.testing.assert_close(c(x, w), mlp(x, w))
    rep = er.explain(c)
    (g,) = rep.cuda_graphs
    assert (g.warmups, g.recordings, g.replays, g.plain) == (1, 1, 3, 0), g.text()
    assert rep.recordings == 1 and rep.replays == 3
    text = str(rep)
    assert "CUDA graphs: 1 recording(s), 3 replay(s); 0 of 1 graph(s) not recorded" in text
    assert "graph 0 @mlp: 1 recording(s), 3 replay(s), 1 warm-up call(s)" in text
    assert "bindings (static shapes)" in text  # the guards hold every dim


def test_kept_outputs_are_not_overwritten_by_the_next_replay(fake: Any) -> None:
    """The caller keeps every output (a KV cache across decode steps): each stays its own
    call's value, because outputs are cloned out of the recording's memory."""
    fake()
    c = er.compile(mlp, mode="reduce-overhead")
    w = torch.randn(8, 8)
    xs = [torch.randn(4, 8) for _ in range(5)]
    kept = [c(x, w) for x in xs]
    for x, y in zip(xs, kept, strict=True):
        torch.testing.assert_close(y, mlp(x, w))
    assert er.explain(c).replays == 4
    assert len({y.data_ptr() for y in kept}) == len(kept)


def test_copied_inputs_follow_the_caller_static_ones_are_read_in_place(fake: Any) -> None:
    """x is a new tensor each call (copied into the recording's buffer); w is a parameter
    (read where it is, never copied): updating w in place is seen by the next replay."""
    fake()
    lin = torch.nn.Linear(8, 8)
    c = er.compile(lin, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(3, 8)
            torch.testing.assert_close(c(x), lin(x))
            lin.weight.mul_(0.5)  # the same address: the recording reads the new values
    rep = er.explain(c)
    assert rep.recordings == 1 and rep.replays == 3, str(rep)


def test_input_mutation_is_written_back_once_per_call(fake: Any) -> None:
    """A static buffer updated in place (a static KV cache's index_copy_): the write-back is in
    the recording, applied once per replay."""
    def step(cache: torch.Tensor, pos: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, v)
        return cache.sum(0) * 2

    fake()
    c = er.compile(step, mode="reduce-overhead")
    cache, ref = torch.zeros(6, 4), torch.zeros(6, 4)
    for i in range(5):
        pos, v = torch.tensor([i]), torch.randn(1, 4)
        got = c(cache, pos, v)
        want = step(ref, pos, v)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(cache, ref)
    rep = er.explain(c)
    assert rep.recordings == 1 and rep.replays == 4, str(rep)


def test_accumulating_mutation_matches_eager(fake: Any) -> None:
    def acc(total: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        total.add_(x)
        return total * 1

    fake()
    c = er.compile(acc, mode="reduce-overhead")
    t, ref = torch.zeros(5), torch.zeros(5)
    outs = []
    for _ in range(4):
        x = torch.randn(5)
        outs.append((c(t, x), acc(ref, x).clone()))
        torch.testing.assert_close(t, ref)
    for got, want in outs:
        torch.testing.assert_close(got, want)


def test_a_static_input_that_moves_is_recorded_again_then_copied(fake: Any) -> None:
    """w is static (same tensor at warm-up and recording, and large: a small one is always
    copied); a new w is recorded again with it static; a second move makes it a copied input
    (recorded once more, then replayed)."""
    fake()
    c = er.compile(mlp, mode="reduce-overhead")
    w1, w2, w3 = (torch.randn(160, 160) for _ in range(3))  # 100 KiB each
    x = torch.randn(4, 160)
    for w in (w1, w1, w1, w2, w2, w3, w1, w2):
        torch.testing.assert_close(c(x, w), mlp(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert (g.rerecorded, g.recordings, g.replays) == (2, 3, 7), g.text()
    assert "2 re-recording(s) (a static input moved)" in g.text()


def test_a_static_input_that_moves_after_a_run_of_replays_stays_static(fake: Any) -> None:
    """Each generate() may bring a new static cache: an input that stays put for a run of
    replays and then moves is recorded again in place every time, never demoted to a copy."""
    fake()
    c = er.compile(mlp, mode="reduce-overhead")
    x = torch.randn(4, 160)
    for _ in range(4):
        w = torch.randn(160, 160)
        for _ in range(6):
            torch.testing.assert_close(c(x, w), mlp(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert (g.rerecorded, g.recordings) == (3, 4), g.text()


def test_a_growing_binding_stops_recording_clearly(fake: Any) -> None:
    """A DynamicCache's decode graph meets a new cache length every call: after twice the
    recording limit of new bindings in a row, none met twice, the graph is not recorded (no
    captures for the few lengths a next generate() brings back), and explain says why."""
    fake(max_recordings=2)
    c = er.compile(mlp, mode="reduce-overhead", dynamic=True)
    w = torch.randn(8, 8)
    for n in [*range(2, 9), 2, 3]:  # 7 new sizes, then two that come back
        x = torch.randn(n, 8)
        torch.testing.assert_close(c(x, w), mlp(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert g.recordings == 0 and g.skipped is not None and "growing cache" in g.skipped, g.text()


def test_a_small_input_at_the_same_address_is_copied(fake: Any) -> None:
    """A step's token ids are a new small tensor each call that can land at the same address
    as the last one: small inputs the graph does not update are copied, never read in place
    (no re-recording when the next one lands elsewhere)."""
    fake()
    c = er.compile(mlp, mode="reduce-overhead")
    w = torch.randn(8, 8)
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
    for x in (x1, x1, x2, x1, x2):  # x1 at the warm-up and the recording, then elsewhere
        torch.testing.assert_close(c(x, w), mlp(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert (g.rerecorded, g.recordings, g.replays) == (0, 1, 4), g.text()


def test_one_recording_per_size_binding_up_to_the_limit(fake: Any) -> None:
    fake(max_recordings=2)
    c = er.compile(mlp, mode="reduce-overhead", dynamic=True)
    w = torch.randn(8, 8)
    for n in (2, 3, 5):
        for _ in range(3):
            x = torch.randn(n, 8)
            torch.testing.assert_close(c(x, w), mlp(x, w))
    rep = er.explain(c)
    assert rep.graph_count == 1, rep.recompilations
    (g,) = rep.cuda_graphs
    assert (g.recordings, g.replays, g.warmups, g.over_limit) == (2, 4, 2, 3), g.text()
    assert g.bindings == ["(s0=2, s1=8)", "(s0=3, s1=8)"]  # the symbols' values
    assert "(3 past the recording limit)" in g.text()


def test_a_failed_recording_runs_the_graph_as_compiled_with_the_reason(fake: Any) -> None:
    fake(fail="operation not permitted when stream is capturing")
    c = er.compile(mlp, mode="reduce-overhead")
    w = torch.randn(8, 8)
    for _ in range(4):
        x = torch.randn(4, 8)
        torch.testing.assert_close(c(x, w), mlp(x, w))
    rep = er.explain(c)
    (g,) = rep.cuda_graphs
    assert g.skipped == ("recording failed: RuntimeError: operation not permitted when stream "
                         "is capturing")
    assert (g.recordings, g.replays, g.plain) == (0, 0, 2), g.text()
    assert "1 of 1 graph(s) not recorded" in str(rep)
    assert rep.fallbacks == []  # the compiled code still runs: not a fallback of the backend


def test_gradients_run_without_a_graph(fake: Any) -> None:
    fake()
    c = er.compile(mlp, mode="reduce-overhead")
    w = torch.randn(8, 8)
    x = torch.randn(4, 8)
    for _ in range(3):
        c(x, w)
    wg = w.clone().requires_grad_()
    y = c(x, wg)  # a training graph: compiled as such, never recorded
    y.sum().backward()
    assert wg.grad is not None
    assert er.explain(c).recordings == 1


def test_graph_break_pieces_each_have_their_own_graphs(fake: Any) -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        y = x.sin() + 1
        print("break")
        return y.cos() * 2

    recorders = fake()
    c = er.compile(broken, mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(6)
        torch.testing.assert_close(c(x), broken(x))
    rep = er.explain(c)
    assert rep.break_count == 1 and rep.graph_count == 2
    assert len(rep.cuda_graphs) == 2 and all(g.recordings == 1 and g.replays == 2
                                             for g in rep.cuda_graphs), str(rep)
    assert len(recorders) == 2  # one pool per compiled function: the resume function's own


def test_cpu_graphs_are_not_recorded_and_say_why() -> None:
    c = er.compile(mlp, mode="reduce-overhead")
    w = torch.randn(8, 8)
    for _ in range(3):
        x = torch.randn(4, 8)
        torch.testing.assert_close(c(x, w), mlp(x, w))
    rep = er.explain(c)
    (g,) = rep.cuda_graphs
    assert g.skipped == "its tensors are on cpu: CUDA graphs record cuda work only"
    assert g.plain == 3 and rep.fallbacks == []
    assert "graph 0 @mlp: not recorded: its tensors are on cpu" in str(rep)


def test_default_mode_and_other_backends_record_nothing() -> None:
    c = er.compile(mlp)
    c(torch.randn(2, 8), torch.randn(8, 8))
    rep = er.explain(c)
    assert rep.cuda_graphs == [] and "CUDA graphs" not in str(rep)
    e = er.compile(mlp, backend="eager", mode="reduce-overhead")
    e(torch.randn(2, 8), torch.randn(8, 8))
    assert any("records CUDA graphs of the inductor's compiled graphs only" in n
               for n in e.history.notes)
    assert er.explain(e).cuda_graphs == []


def test_skip_reasons() -> None:
    cpu = torch.zeros(2)
    meta = torch.zeros(2, device="meta")
    assert skip_reason([cpu, 3], None) == ("its tensors are on cpu: CUDA graphs record cuda "
                                           "work only")
    assert skip_reason([meta], None, "meta") is None
    assert skip_reason([meta, 2.5, None, True], None, "meta") is None
    assert skip_reason([meta, [1, 2]], None, "meta") == (
        "input 1 is a list (recordings take tensors and scalars)")
    assert skip_reason([3], None) == "it has no tensor inputs"
    assert skip_reason([meta], "kernel @k0 on the reference", "meta") == (
        "part of it runs on the reference interpreter, which may sync with the host (kernel "
        "@k0 on the reference)")


def test_binding_is_shapes_and_scalar_values() -> None:
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert binding([a, 4]) == binding([b, 4])
    assert binding([a, 4]) != binding([b, 5])
    assert binding([a]) != binding([torch.zeros(3, 2)])
    assert binding([1]) != binding([1.0]) and binding([True]) != binding([1])


def generate_through_recordings(model: Any, ids: torch.Tensor, cache: str,
                                max_new_tokens: int) -> Any:
    """Greedy generate() twice through a forward compiled under reduce-overhead; asserts both
    give eager's tokens and returns the compiled forward (for its explain report)."""
    # (disable_compile: on CUDA, generate() would wrap a static-cache step in torch.compile)
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                              disable_compile=True)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        want = model.generate(ids, **kw)
        cf = er.compile(model.forward, mode="reduce-overhead")
        model.forward = cf
        try:
            got = model.generate(ids, **kw)
            again = model.generate(ids, **kw)
        finally:
            del model.forward
    assert torch.equal(got, want) and torch.equal(again, want)
    return cf


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_generate_returns_eager_tokens_through_recordings(fake: Any, cache: str) -> None:
    """Greedy generate() through a recorded forward: a static cache has one decode binding
    (recorded once, replayed every later step, its in-place cache update written back in the
    recording); a DynamicCache grows every step, so each binding is met once: warm-ups only."""
    pytest.importorskip("transformers")
    from ember.runtime.testing import tiny_hf_model

    fake()
    model: Any = tiny_hf_model("neox")[0]
    torch.manual_seed(1)
    ids = torch.randint(2, 100, (2, 5))
    cf = generate_through_recordings(model, ids, cache, 6)
    rep = er.explain(cf)
    assert rep.fallbacks == [], str(rep)
    if cache == "static":
        decode = rep.cuda_graphs[-1]
        # (the second generate() makes a new cache: recorded again with it in place)
        assert decode.recordings == 2 and decode.rerecorded == 1, str(rep)
        assert decode.replays >= 2 * 6 - 4, str(rep)
    else:  # each cache length met once per generate(): a warm-up, then recorded in the second
        decode = rep.cuda_graphs[-1]
        assert decode.recordings == decode.warmups == decode.replays >= 2, str(rep)


def test_binder_reads_only_symbolic_dims_and_scalars() -> None:
    import types

    import sympy

    from ember.runtime.cudagraphs import Binder

    def param(*shape: Any) -> Any:
        return types.SimpleNamespace(type=types.SimpleNamespace(shape=shape))

    s0 = sympy.Symbol("s0")
    b = Binder([param(s0, 8), param(), param(8, s0)],
               [torch.zeros(2, 8), 3, torch.zeros(8, 2)])
    key = b([torch.zeros(5, 8), 3, torch.zeros(8, 5)])
    assert key == (5, (int, 3)) and b.text(key) == "(s0=5, input 1=3)"
    assert Binder([param(8)], [torch.zeros(8)]).text(()) == "(static shapes)"
    unknown = Binder(None, [torch.zeros(2)])  # no types: every shape is read
    assert unknown([torch.zeros(4)]) == binding([torch.zeros(4)])


def test_a_graph_on_the_reference_interpreter_is_not_recorded(fake: Any) -> None:
    """A pipeline that stops at prims: the reference interpreter runs them, which may sync
    with the host, so the graph is not recorded, and explain says why."""
    fake()
    c = er.compile(lambda x: x.sin() * 2, mode="reduce-overhead",
                   options={"pipeline": "to-prims"})
    with pytest.warns(er.FallbackWarning):
        for _ in range(3):
            c(torch.randn(4))
    (g,) = er.explain(c).cuda_graphs
    assert g.skipped is not None and g.skipped.startswith(
        "part of it runs on the reference interpreter, which may sync with the host"), g.text()
    assert (g.recordings, g.plain) == (0, 3)


def test_a_graph_that_draws_random_numbers_is_not_recorded(fake: Any) -> None:
    """The generated call runs random ops (a new philox offset each call); a replay would
    repeat the recorded seed and offset: such a graph runs plain, each call drawing anew. One
    whose draws are all dead (transformers 5.17's LayerDrop draw in eval) is recorded."""
    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)

    def dead(x: torch.Tensor) -> torch.Tensor:
        p = torch.rand([])
        if not (False and p < 0.1):
            x = x * 2
        return x

    fake()
    c = er.compile(noisy, mode="reduce-overhead")
    x = torch.zeros(4)
    outs = [c(x) for _ in range(3)]
    assert not torch.equal(outs[1], outs[2])
    (g,) = er.explain(c).cuda_graphs
    assert g.skipped is not None and g.skipped.startswith("it draws random numbers"), g.text()
    assert (g.recordings, g.plain) == (0, 3)
    c2 = er.compile(dead, mode="reduce-overhead")
    for _ in range(3):
        torch.testing.assert_close(c2(x + 1), x + 2)
    (g2,) = er.explain(c2).cuda_graphs
    assert g2.skipped is None, g2.text()
