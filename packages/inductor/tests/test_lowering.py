"""lower-loops and fuse: golden text, round trip, and the interpreter's numbers."""

from __future__ import annotations

import torch

import ember.inductor  # noqa: F401
from ember.inductor.fusion import why_not_fused
from ember.ir import Interpreter, parse, verify
from ember.ir.passes import run_pipeline

PRIMS_TEXT = """ember.ir 1.0

graph @f(%x: f32[4, 8], %b: f32[8]) -> (f32[4]) {
  %bb = prims.broadcast_in_dim(%b, shape=[4, 8], broadcast_dims=[1]) : f32[4, 8]
  %y = prims.add(%x, %bb) : f32[4, 8]
  %z = prims.maximum(%y, 0.0) : f32[4, 8]
  %t = prims.permute(%z, dims=[1, 0]) : f32[8, 4]
  %s = prims.sum(%t, dims=[0]) : f32[4]
  return (%s)
}
"""

LOWERED = """ember.ir 1.1

graph @f(%x: f32[4, 8], %b: f32[8]) -> (f32[4]) {
  %y = loop.pointwise(@f_k0, %x, %b, ranges=[4, 8]) : f32[4, 8]
  %z = loop.pointwise(@f_k1, %y, ranges=[4, 8]) : f32[4, 8]
  %s = loop.reduction(@f_k2, %z, ranges=[4], reduce_ranges=[8], reduction="sum") : f32[4]
  return (%s)
}

graph @f_k0(%x: f32[4, 8], %b: f32[8]) -> (f32[]) domain(i0 < 4, i1 < 8) {
  %x.load = loop.load(%x, index=[i0, i1]) : f32[]
  %b.load = loop.load(%b, index=[i1]) : f32[]
  %y = prims.add(%x.load, %b.load) : f32[]
  return (%y)
}

graph @f_k1(%y: f32[4, 8]) -> (f32[]) domain(i0 < 4, i1 < 8) {
  %y.load = loop.load(%y, index=[i0, i1]) : f32[]
  %z = prims.maximum(%y.load, 0.0) : f32[]
  return (%z)
}

graph @f_k2(%z: f32[4, 8]) -> (f32[]) domain(i0 < 4, r0 < 8) {
  %z.load = loop.load(%z, index=[i0, r0]) : f32[]
  return (%z.load)
}
"""

FUSED = """ember.ir 1.1

graph @f(%x: f32[4, 8], %b: f32[8]) -> (f32[4]) {
  %s = loop.reduction(@f_k2, %x, %b, ranges=[4], reduce_ranges=[8], reduction="sum") : f32[4]
  return (%s)
}

graph @f_k2(%x: f32[4, 8], %b: f32[8]) -> (f32[]) domain(i0 < 4, r0 < 8) {
  %x.load = loop.load(%x, index=[i0, r0]) : f32[]
  %b.load = loop.load(%b, index=[r0]) : f32[]
  %y = prims.add(%x.load, %b.load) : f32[]
  %z = prims.maximum(%y, 0.0) : f32[]
  return (%z)
}
"""


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 8, generator=g), torch.randn(8, generator=g)]


def test_lower_loops_golden_round_trip_and_numbers() -> None:
    m = parse(PRIMS_TEXT)
    low = run_pipeline(m, "lower-loops", verify_each=True)
    assert str(low) == LOWERED
    assert str(parse(LOWERED)) == LOWERED
    want = Interpreter(m).run(_inputs()).outputs
    got = Interpreter(parse(LOWERED)).run(_inputs()).outputs
    torch.testing.assert_close(got, want)


def test_fuse_golden_and_numbers() -> None:
    fused = run_pipeline(parse(LOWERED), "fuse", verify_each=True)
    assert str(fused) == FUSED
    assert str(parse(FUSED)) == FUSED
    want = Interpreter(parse(PRIMS_TEXT)).run(_inputs()).outputs
    torch.testing.assert_close(Interpreter(fused).run(_inputs()).outputs, want)


def test_fuse_respects_max_nodes_and_says_why() -> None:
    low = parse(LOWERED)
    assert str(run_pipeline(low, "fuse{max_nodes=0}")) == LOWERED
    g = low.graph("f")
    reason = why_not_fused(low, g, g.nodes[0], g.nodes[1], max_nodes=0)
    assert reason is not None and "max_nodes=0" in reason


def test_views_extern_and_creation_lower_and_run() -> None:
    text = """ember.ir 1.0

graph @g(%x: f32[2, 3, 4], %w: f32[4, 5]) -> (f32[6, 5], i64[3], f32[3, 2], f32[4]) {
  %r = prims.reshape(%x, shape=[6, 4]) : f32[6, 4]
  %m = prims.matmul(%r, %w) : f32[6, 5]
  %a = prims.argmax(%x, dim=2) : i64[2, 3]
  %s = prims.slice(%a, start=[1, 0], limit=[2, 3], step=[1, 1]) : i64[1, 3]
  %q = prims.squeeze(%s, dims=[0]) : i64[3]
  %i0 = prims.iota(length=3, start=2, step=3, dtype=i32) : i32[3]
  %i = prims.convert_element_type(%i0, dtype=f32) : f32[3]
  %u = prims.unsqueeze(%i, dims=[1]) : f32[3, 1]
  %e = prims.broadcast_in_dim(%u, shape=[3, 2], broadcast_dims=[0, 1]) : f32[3, 2]
  %v = prims.rev(%x, dims=[2]) : f32[2, 3, 4]
  %mx = prims.amax(%v, dims=[0, 1]) : f32[4]
  return (%m, %q, %e, %mx)
}
"""
    m = parse(text)
    verify(m)
    low = run_pipeline(m, "lower-loops,fuse", verify_each=True)
    ops = {n.op for n in low.graph("g").nodes}
    assert "loop.extern" in ops and not any(o.startswith("prims.") for o in ops)
    assert str(parse(str(low))) == str(low)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 3, 4, generator=g), torch.randn(4, 5, generator=g)]
    torch.testing.assert_close(Interpreter(low).run(xs).outputs, Interpreter(m).run(xs).outputs)


def test_compiled_module_prints_parses_and_replays_bitwise() -> None:
    m = parse(PRIMS_TEXT)
    compiled = run_pipeline(m, "lower-loops,fuse,codegen-cpp", verify_each=True)
    text = str(compiled)
    assert str(parse(text)) == text
    src = compiled.kernels["f_k2"].source
    assert "%z = prims.maximum" in src and "kernel @f_k2: loop.reduction of @f" in src
    live = Interpreter(compiled).run(_inputs()).outputs
    replay = Interpreter(parse(text)).run(_inputs()).outputs
    assert torch.equal(live[0], replay[0])
    torch.testing.assert_close(live, Interpreter(m).run(_inputs()).outputs)
