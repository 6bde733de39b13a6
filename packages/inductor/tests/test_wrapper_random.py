"""Graphs with random ops (%philox_seed/%philox_offset parameters) through the generated call
(wrapper.py): the same bits as the reference interpreter at the same seed and offset, the
runner's offset advanced by each call's count (a size expression under symbolic sizes) and
shared by its graphs and threads, torch.manual_seed replayed by a new runner, dead draws
dropped (the wav2vec2 LayerDrop case), and training with dropout through the wrapper too."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
import ember.runtime as er
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, Module, parse
from ember.prims import philox
from ember.prims.decomp.random import PhiloxOffsets, philox_params, with_philox_inputs

# rand, randn (two counters an element), bernoulli, dropout (its mask too), rand with a
# static shape and no tensor operand, and a fused pointwise use of the draws
TEXT = """ember.ir 1.0

graph @f(%x: f32[6, 5]) -> (f32[6, 5], f32[6, 5], f32[6, 5], f32[6, 5], b8[6, 5], f32[3]) {
  %a = aten.rand_like.default(%x) : f32[6, 5]
  %b = aten.randn_like.default(%x) : f32[6, 5]
  %bx = aten.add.Tensor(%b, %x) : f32[6, 5]
  %c = aten.bernoulli.p(%x, 0.3) : f32[6, 5]
  %d, %m = aten.native_dropout.default(%x, 0.25, true) : (f32[6, 5], b8[6, 5])
  %e = aten.rand.default([3]) : f32[3]
  return (%a, %bx, %c, %d, %m, %e)
}

graph @g(%x: f32[4]) -> (f32[4]) {
  %a = aten.rand_like.default(%x) : f32[4]
  return (%a)
}
"""
COUNT = 30 + 60 + 30 + 30 + 3  # what one call of @f consumes

SYMBOLIC = """ember.ir 1.0

symbol s0 hint=4 min=2

graph @f(%x: f32[s0, 3]) -> (f32[s0, 3], f32[s0, 3]) {
  %a = aten.randn_like.default(%x) : f32[s0, 3]
  %b = aten.rand_like.default(%x) : f32[s0, 3]
  %c = aten.mul.Tensor(%b, %x) : f32[s0, 3]
  return (%a, %c)
}
"""

_COMPILED: dict[str, Module] = {}


def compiled(text: str = TEXT) -> Module:
    if text not in _COMPILED:
        _COMPILED[text] = compile_module(parse(text))
    return _COMPILED[text]


def reference(m: Module, graph: str, inputs: list[Any], seed: int, offset: int) -> list[Any]:
    g = m.graph(graph)
    return Interpreter(m).run(with_philox_inputs(g, inputs, seed, offset), graph).outputs


def bit_equal(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


X = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).abs() / 4


def test_the_compiled_runner_runs_random_graphs_through_the_generated_call() -> None:
    m = compiled()
    assert philox_params(m.graph("f")) == (1, 2, COUNT)
    assert any(n.kwargs.get("op") == "prims.philox_uniform" for n in m.graph("f").nodes)
    run = compiled_runner(m)
    run("f", [X])
    assert run.calls["f"] is not None  # type: ignore[attr-defined]
    src = generate(m, "f").source
    assert "_seed()" in src and f"_take({COUNT})" in src


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), offset=st.integers(0, 2**40))
def test_wrapper_draws_the_interpreters_bits(seed: int, offset: int) -> None:
    m = compiled()
    call = generate(m, "f").draw_from(PhiloxOffsets(offset)).call
    torch.manual_seed(seed)
    got = call([X]).outputs
    bit_equal(got, reference(m, "f", [X], seed, offset))
    # a caller giving the seed and offset itself (a decomposed graph's own parameters):
    # they are used as given, and the counter is left alone
    offsets = PhiloxOffsets(7)
    given_call = generate(m, "f").draw_from(offsets).call
    bit_equal(given_call([X, seed, offset]).outputs, got)
    assert offsets.value == 7


def test_successive_calls_continue_the_stream_and_graphs_share_it() -> None:
    m = compiled()
    torch.manual_seed(11)
    run = compiled_runner(m)
    first, second = run("f", [X]).outputs, run("f", [X]).outputs
    assert not torch.equal(first[0], second[0])
    bit_equal(first, reference(m, "f", [X], 11, 0))
    bit_equal(second, reference(m, "f", [X], 11, COUNT))
    # @g draws after @f's two calls: one counter for the runner's graphs
    y = torch.zeros(4)
    assert torch.equal(run("g", [y]).outputs[0], philox.uniform(11, 2 * COUNT, (4,),
                                                                 torch.float32))
    assert run.calls["g"] is not None  # type: ignore[attr-defined]
    # the interpreter path (a graph the wrapper does not cover) takes from the same counter
    run.calls["f"] = None  # type: ignore[attr-defined]
    bit_equal(run("f", [X]).outputs, reference(m, "f", [X], 11, 2 * COUNT + 4))
    run.calls["f"] = generate(m, "f").draw_from(PhiloxOffsets(0)).call  # type: ignore[attr-defined]


def test_manual_seed_replays_a_new_runners_calls() -> None:
    m = compiled()
    outs = []
    for _ in range(2):
        torch.manual_seed(5)
        run = compiled_runner(m)
        outs.append([run("f", [X]).outputs, run("f", [X]).outputs])
    for a, b in zip(outs[0], outs[1], strict=True):
        bit_equal(a, b)
    torch.manual_seed(6)
    assert not torch.equal(compiled_runner(m)("f", [X]).outputs[0], outs[0][0][0])


def test_symbolic_sizes_advance_the_offset_by_their_count() -> None:
    m = compiled(SYMBOLIC)
    assert "_take((9 * s0))" in generate(m).source
    torch.manual_seed(3)
    run = compiled_runner(m)
    x5, x2 = torch.rand(5, 3), torch.rand(2, 3)
    a = run("f", [x5]).outputs
    b = run("f", [x2]).outputs
    c = run("f", [x5]).outputs
    assert run.calls["f"] is not None  # type: ignore[attr-defined]
    bit_equal(a, reference(m, "f", [x5], 3, 0))
    bit_equal(b, reference(m, "f", [x2], 3, 45))
    bit_equal(c, reference(m, "f", [x5], 3, 45 + 18))


def test_concurrent_calls_never_share_counters() -> None:
    m = compiled()
    torch.manual_seed(2)
    run = compiled_runner(m)
    y = torch.zeros(4)
    run("g", [y])  # (generated before the threads start)
    got: list[torch.Tensor] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(50):
            out = run("g", [y]).outputs[0]
            with lock:
                got.append(out)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = {tuple(philox.uniform(2, 4 * k, (4,), torch.float32).tolist())
            for k in range(1, 201)}
    assert {tuple(o.tolist()) for o in got} == want  # 200 calls, 200 distinct offsets


def layerdrop(x: torch.Tensor) -> torch.Tensor:
    """transformers 5.17's Wav2Vec2Encoder: a LayerDrop draw per layer, also in eval, its
    result unused there."""
    training = False
    for _ in range(3):
        p = torch.rand([])
        if not (training and p < 0.1):
            x = torch.tanh(x * 1.5) + x
    return x


def test_a_dead_draw_is_dropped_and_the_graph_runs_through_the_wrapper() -> None:
    """ember drops a random op whose result is unused, as torch.compile does
    (docs/decisions.md): nothing is drawn; the graph keeps its seed and offset parameters
    (the declared count still advances the runner's offset) and the generated call runs it."""
    c = er.compile(layerdrop, backend="inductor")
    x = torch.randn(4, 8)
    torch.testing.assert_close(c(x), layerdrop(x))
    rep = er.explain(c)
    assert not rep.fallbacks, str(rep)
    text = str(rep)
    assert "aten.rand" in text  # captured, then dropped when compiled


class _Drop(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.lin(x), 0.5, training=True).relu()


@pytest.mark.parametrize("grad", [True, False])
def test_dropout_runs_through_the_wrapper(grad: bool) -> None:
    """Training (ember.autograd's forward with the dropout draw) and inference alike."""
    torch.manual_seed(0)
    m = _Drop()
    c = er.compile(m, backend="inductor")
    x = torch.randn(16, 8)
    with torch.set_grad_enabled(grad):
        y = c(x)
        y2 = c(x)
    assert not torch.equal(y, y2)  # successive calls draw anew
    kept = y != 0
    assert 0 < int(kept.sum()) < y.numel()
    with torch.no_grad():
        torch.testing.assert_close(y, (m.lin(x) * kept * 2).relu())
    if grad:
        y.sum().backward()
        w = m.lin.weight.grad
        assert w is not None
        torch.testing.assert_close(w, kept.float().mul(2).t().mm(x))  # (relu: kept is y > 0)
    rep = er.explain(c)
    assert not rep.fallbacks, str(rep)
