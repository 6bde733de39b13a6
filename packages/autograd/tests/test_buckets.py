"""The split-buckets pass (DDP's gradient buckets): every cap gives a valid module whose chain of
pieces computes what the graph did, each parameter held by exactly one piece, pieces filled to
the cap walking the graph last-first; the pass prints, parses and verifies."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ember.autograd.buckets import piece_modules, plan_buckets, split_buckets
from ember.ir import Interpreter, parse, verify
from ember.ir.passes import PipelineError, run_pipeline

# a 3-layer MLP as captured: parameters 1..6 (weights 64 B, 256 B, 64 B; biases 16 B...)
TEXT = """ember.ir 1.0

graph @mlp(%x: f32[2, 4], %w0: f32[4, 4], %b0: f32[4], %w1: f32[16, 4], %b1: f32[16], %w2: f32[1, 16], %b2: f32[1]) -> (f32[2, 1]) {
  %t0 = aten.t.default(%w0) : f32[4, 4]
  %h0 = aten.addmm.default(%b0, %x, %t0) : f32[2, 4]
  %r0 = aten.relu.default(%h0) : f32[2, 4]
  %t1 = aten.t.default(%w1) : f32[4, 16]
  %h1 = aten.addmm.default(%b1, %r0, %t1) : f32[2, 16]
  %r1 = aten.tanh.default(%h1) : f32[2, 16]
  %t2 = aten.t.default(%w2) : f32[16, 1]
  %h2 = aten.addmm.default(%b2, %r1, %t2) : f32[2, 1]
  %y = aten.add.Tensor(%h2, %r0) : f32[2, 4]
  %s = aten.sum.dim_IntList(%y, [1], true) : f32[2, 1]
  return (%s)
}
"""
PARAMS = [1, 2, 3, 4, 5, 6]


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 4), (4, 4), (4,), (16, 4), (16,), (1, 16), (1,)]
    return [torch.randn(s, generator=g) for s in shapes]


@given(st.integers(1, 600))
def test_any_cap_gives_a_chain_computing_the_same(cap: int) -> None:
    mod = parse(TEXT)
    split, plan = split_buckets(mod, PARAMS, cap)
    verify(split)
    again = parse(str(split))  # the cut dumps and reads back
    verify(again)
    held = sorted(i for p in plan.params for i in p)
    assert held == PARAMS  # every parameter in exactly one piece
    assert all(b >= cap for b in plan.bytes[1:])  # every piece but the first is a full bucket
    want = Interpreter(mod).run(_inputs(), "mlp").outputs
    got = Interpreter(again).run(_inputs(), "mlp").outputs
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if len(plan.starts) > 1:
        assert len(piece_modules(again, "mlp")) == len(plan.starts)


def test_buckets_fill_last_first_like_ddps() -> None:
    g = parse(TEXT).graph("mlp")
    # the backward meets b2, w2 (68 B) first, then b1 (64 B), w1 (256 B), then b0, w0 (80 B);
    # a bucket closes once it holds the cap
    plan = plan_buckets(g, PARAMS, 300)
    assert plan.params == [[1, 2], [3, 4, 5, 6]] and plan.bytes == [80, 388]
    plan = plan_buckets(g, PARAMS, 64)
    assert plan.params == [[1, 2], [3], [4], [5, 6]] and plan.bytes == [80, 256, 64, 68]
    assert plan_buckets(g, PARAMS, 10_000).starts == [0]  # one bucket: no cut


def test_the_pass_by_name_and_its_errors() -> None:
    mod = parse(TEXT)
    out = run_pipeline(mod, "split-buckets{params=1:2:3:4:5:6, bytes=64}")
    assert [n.op for n in out.graph("mlp").nodes] == ["graph.call"] * 4
    with pytest.raises(PipelineError, match="no parameter 9"):
        run_pipeline(mod, "split-buckets{params=1:9}")
    with pytest.raises(PipelineError, match="positive"):
        run_pipeline(mod, "split-buckets{bytes=0}")
