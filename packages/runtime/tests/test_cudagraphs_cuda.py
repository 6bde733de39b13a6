"""mode="reduce-overhead" with real CUDA graphs (runtime/cudagraphs.py): skipped without a GPU.

The same paths as test_cudagraphs.py (which runs them on the CPU with a stand-in recorder)
through torch.cuda.CUDAGraph and ember's Triton target: recording after a warm-up, replays,
outputs kept across calls, static inputs updated in place, a mutated static buffer, a symbolic
graph's bindings, a host synchronization that cannot be recorded, and greedy generate() with a
static cache and a DynamicCache giving eager's tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.testing.triton_mode import NEEDS_CUDA
from packages.runtime.tests.test_cudagraphs import generate_through_recordings

pytestmark = NEEDS_CUDA


def mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu() * 2 + 1


def test_records_replays_and_kept_outputs_stay_correct() -> None:
    c = er.compile(mlp, mode="reduce-overhead")
    w = torch.randn(64, 64, device="cuda")
    xs = [torch.randn(32, 64, device="cuda") for _ in range(6)]
    kept = [c(x, w) for x in xs]
    for x, y in zip(xs, kept, strict=True):
        torch.testing.assert_close(y, mlp(x, w))
    rep = er.explain(c)
    (g,) = rep.cuda_graphs
    assert g.skipped is None and g.recordings == 1 and g.replays == 5, str(rep)


def test_parameters_are_read_in_place() -> None:
    lin = torch.nn.Linear(64, 64, device="cuda")
    c = er.compile(lin, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(8, 64, device="cuda")
            torch.testing.assert_close(c(x), lin(x))
            lin.weight.mul_(0.5)
    assert er.explain(c).replays == 4


def test_static_buffer_mutation_is_written_back() -> None:
    def step(cache: torch.Tensor, pos: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, v)
        return cache.sum(0) * 2

    c = er.compile(step, mode="reduce-overhead")
    cache = torch.zeros(8, 16, device="cuda")
    ref = cache.clone()
    for i in range(6):
        pos, v = torch.tensor([i], device="cuda"), torch.randn(1, 16, device="cuda")
        torch.testing.assert_close(c(cache, pos, v), step(ref, pos, v))
        torch.testing.assert_close(cache, ref)
    assert er.explain(c).recordings == 1


def test_symbolic_graph_records_per_binding() -> None:
    c = er.compile(mlp, mode="reduce-overhead", dynamic=True)
    w = torch.randn(64, 64, device="cuda")
    for n in (16, 24, 16, 24, 16):
        x = torch.randn(n, 64, device="cuda")
        torch.testing.assert_close(c(x, w), mlp(x, w))
    rep = er.explain(c)
    assert rep.graph_count == 1 and rep.recordings == 2 and rep.replays == 3, str(rep)


def test_a_re_recording_replacing_the_only_recording() -> None:
    # the first recording is dropped when its static input moves; the pool then has no live
    # graph while blocks of it are alive (torch's allocator asserted `use_count > 0` on the
    # next capture into it before the recorder kept its first graph)
    c = er.compile(mlp, mode="reduce-overhead")
    x = torch.randn(32, 256, device="cuda")
    kept = []
    for w in [torch.randn(256, 256, device="cuda")] * 2 + [torch.randn(256, 256, device="cuda")] * 3:
        kept.append(c(x, w))
        torch.testing.assert_close(kept[-1], mlp(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert g.skipped is None and g.recordings == 2 and g.rerecorded == 1, g.text()


def test_a_0_dim_cpu_input_is_moved_and_recorded() -> None:
    # eager reads a 0-dim CPU tensor as a scalar operand of CUDA ops (transformers 5.17's
    # static cache keeps `cumulative_length` so): compiled on the device, moved per call
    def f(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return x * n + n.to(x.device)

    for mode in (None, "reduce-overhead"):
        c = er.compile(f, mode=mode)
        for k in range(4):
            x, n = torch.randn(8, 8, device="cuda"), torch.tensor(k + 2)
            torch.testing.assert_close(c(x, n), f(x, n))
        rep = er.explain(c)
        assert rep.fallbacks == [], str(rep)
        if mode is not None:
            assert rep.recordings == 1 and rep.replays == 3, str(rep)


def test_cpu_inputs_are_not_recorded() -> None:
    c = er.compile(mlp, mode="reduce-overhead")
    c(torch.randn(4, 8), torch.randn(8, 8))
    (g,) = er.explain(c).cuda_graphs
    assert g.skipped is not None and "cpu" in g.skipped


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_generate_gives_eager_tokens(cache: str) -> None:
    pytest.importorskip("transformers")
    from ember.runtime.testing import tiny_hf_model

    model: Any = tiny_hf_model("neox")[0]
    model = model.cuda()
    torch.manual_seed(1)
    ids = torch.randint(2, 100, (2, 5), device="cuda")
    cf = generate_through_recordings(model, ids, cache, 12)
    rep = er.explain(cf)
    if cache == "static":
        assert rep.recordings >= 1 and rep.replays >= 12, str(rep)
