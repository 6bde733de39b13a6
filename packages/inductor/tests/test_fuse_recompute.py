"""fuse, rule 5: a cheap pointwise value read by several kernels is inlined into each of them
(recomputed) instead of written and read back, by default on the CPU target
(`FusionHooks.recompute`); values that read many buffers, graph outputs and producers holding
reductions are still written. Numbers in C++ against eager."""

from __future__ import annotations

import torch

import ember.inductor  # noqa: F401
from ember.inductor.fusion import RECOMPUTE_NODES, recompute_veto
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets import targets
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline

# a BatchNorm backward's shape: d = x - mean is read by a reduction (sum(d * g)) and by the
# pointwise result (d * s + g): two readers, so rules 1-4 write d
SHARED = """ember.ir 1.0

graph @f(%x: f32[6, 5], %m: f32[5], %g: f32[6, 5]) -> (f32[5], f32[6, 5]) {
  %b = prims.broadcast_in_dim(%m, shape=[6, 5], broadcast_dims=[1]) : f32[6, 5]
  %d = prims.sub(%x, %b) : f32[6, 5]
  %p = prims.mul(%d, %g) : f32[6, 5]
  %s = prims.sum(%p, dims=[0]) : f32[5]
  %sb = prims.broadcast_in_dim(%s, shape=[6, 5], broadcast_dims=[1]) : f32[6, 5]
  %q = prims.mul(%d, %sb) : f32[6, 5]
  %r = prims.add(%q, %g) : f32[6, 5]
  return (%s, %r)
}
"""

# the shared value reads four buffers: recomputing it would cost each reader four reads
FOUR_READS = """ember.ir 1.0

graph @f(%x: f32[6, 5], %y: f32[6, 5], %z: f32[6, 5], %w: f32[6, 5]) -> (f32[5], f32[6, 5]) {
  %a = prims.add(%x, %y) : f32[6, 5]
  %b = prims.mul(%a, %z) : f32[6, 5]
  %d = prims.sub(%b, %w) : f32[6, 5]
  %s = prims.sum(%d, dims=[0]) : f32[5]
  %e = prims.exp(%d) : f32[6, 5]
  return (%s, %e)
}
"""


def _written(m: Module) -> list[str]:
    return [r.name for n in m.graph("f").nodes if n.op == "kernels.call" for r in n.results]


def _run(m: Module, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(compiled_runner(m)("f", xs).outputs)


def test_the_cpu_target_recomputes_by_default() -> None:
    assert targets()["cpu"].fusion.recompute == RECOMPUTE_NODES > 0


def test_a_shared_cheap_value_is_recomputed_not_written() -> None:
    m = parse(SHARED)
    fused = compile_module(m)
    kept = compile_module(m, "decompose,lower-loops,fuse{recompute=0},codegen-cpp")
    assert "d" not in _written(fused)  # inlined into the sum and the result
    assert "d" in _written(kept)
    assert len(_written(fused)) < len(_written(kept))
    g = torch.Generator().manual_seed(0)
    x, mu, ct = torch.randn(6, 5, generator=g), torch.randn(5, generator=g), \
        torch.randn(6, 5, generator=g)
    d = x - mu
    s = (d * ct).sum(0)
    want = [s, d * s + ct]
    for got in (_run(fused, [x, mu, ct]), _run(kept, [x, mu, ct])):
        torch.testing.assert_close(got, want)


def test_a_value_reading_four_buffers_is_written() -> None:
    m = parse(FOUR_READS)
    fused = compile_module(m)
    assert "d" in _written(fused)
    lowered = run_pipeline(m, "decompose,lower-loops,fuse{horizontal=false}")
    g = lowered.graph("f")
    d = next(n for n in g.nodes if n.results[0].name == "d")
    readers = [n for n in g.nodes if d.results[0] in list(n.operands())]
    assert len(readers) == 2
    why = recompute_veto(lowered, g, d, readers, RECOMPUTE_NODES)
    assert why is not None and "reads more than" in why
    xs = [torch.randn(6, 5, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    dd = (xs[0] + xs[1]) * xs[2] - xs[3]
    torch.testing.assert_close(_run(fused, xs), [dd.sum(0), dd.exp()])


def test_a_costly_or_output_value_is_not_recomputed() -> None:
    m = run_pipeline(parse(SHARED), "decompose,lower-loops")
    g = m.graph("f")
    d = next(n for n in g.nodes if n.results[0].name == "d")
    readers = [n for n in g.nodes if d.results[0] in list(n.operands())]
    assert recompute_veto(m, g, d, readers, RECOMPUTE_NODES) is None
    why = recompute_veto(m, g, d, readers, 0)  # its one sub is over the cap
    assert why is not None and "too costly" in why
    g.outputs.append(d.results[0])
    why = recompute_veto(m, g, d, readers, RECOMPUTE_NODES)
    assert why is not None and "graph output" in why
