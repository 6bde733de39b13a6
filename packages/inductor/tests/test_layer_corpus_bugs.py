"""Two bugs the layer corpus (tests/ir_corpus/layers/) found, kept fixed:

1. the loop IR's reference left a size symbol used as a value (a mean's `prims.div(%sum, s1)`)
   unevaluated, and a body whose buffers do not carry that symbol could not bind it at all;
2. the inductor backend compiled an already compiled (kernels.*) module again, and plan-buffers,
   planning a second time, gave a buffer that one kernel already reused to another as well
   (two live outputs in one storage: wrong numbers).
"""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import ember.inductor  # noqa: F401  (registers the loop/kernels ops and passes)
from ember.inductor.backend import compile_module, compiled_runner, is_compiled
from ember.ir import Interpreter, Module, Value, parse
from ember.ir.passes import run_pipeline

LAYERS = Path(__file__).resolve().parents[3] / "tests" / "ir_corpus" / "layers"

# a mean over a symbolic row: the second body reads a buffer of shape [s0] and divides by s1
MEAN_LOOPS = """ember.ir 1.0

symbol s0 hint=4 min=1
symbol s1 hint=3 min=1

graph @mean(%x: f32[s0, s1]) -> (f32[s0]) {
  %0 = loop.reduction(@mean_k0, %x, ranges=[s0], reduce_ranges=[s1], reduction="sum") : f32[s0]
  %1 = loop.pointwise(@mean_k1, %0, ranges=[s0]) : f32[s0]
  return (%1)
}

graph @mean_k0(%x: f32[s0, s1]) -> (f32[]) {
  %x.load = loop.load(%x, index=["i0", "r0"]) : f32[]
  return (%x.load)
}

graph @mean_k1(%0: f32[s0]) -> (f32[]) {
  %0.load = loop.load(%0, index=["i0"]) : f32[]
  %1 = prims.div(%0.load, s1) : f32[]
  %2 = prims.add(%1, s0 * s1 + 1) : f32[]
  return (%2)
}
"""

# the same, fused: the symbol is bound from the body's buffer, the reduction is a loop.reduce
MEAN_FUSED = """ember.ir 1.0

symbol s0 hint=4 min=1
symbol s1 hint=3 min=1

graph @mean(%x: f32[s0, s1]) -> (f32[s0, s1]) {
  %1 = loop.pointwise(@mean_k1, %x, ranges=[s0, s1]) : f32[s0, s1]
  return (%1)
}

graph @mean_k0(%x: f32[s0, s1]) -> (f32[]) {
  %x.load = loop.load(%x, index=["i0", "r0"]) : f32[]
  return (%x.load)
}

graph @mean_k1(%x: f32[s0, s1]) -> (f32[]) {
  %x.load = loop.load(%x, index=["i0", "i1"]) : f32[]
  %0 = loop.reduce(@mean_k0, %x, ranges=[s0], reduce_ranges=[s1], reduction="sum") : f32[]
  %1 = prims.div(%0, s1) : f32[]
  %2 = prims.sub(%x.load, %1) : f32[]
  return (%2)
}
"""


@settings(max_examples=15, deadline=None)
@given(s0=st.integers(1, 6), s1=st.integers(1, 6))
def test_loop_reference_evaluates_size_operands(s0: int, s1: int) -> None:
    x = torch.randn(s0, s1, generator=torch.Generator().manual_seed(s0 * 7 + s1))
    got = Interpreter(parse(MEAN_LOOPS)).run([x]).outputs[0]
    torch.testing.assert_close(got, x.mean(1) + (s0 * s1 + 1), rtol=1e-6, atol=1e-6)
    got = Interpreter(parse(MEAN_FUSED)).run([x]).outputs[0]
    torch.testing.assert_close(got, x - x.mean(1, keepdim=True), rtol=1e-6, atol=1e-6)


def test_corpus_norm_rows_loops_and_fused_run_on_the_reference() -> None:
    x = load_file(str(LAYERS / "norm_rows.in.safetensors"))["x"]
    outs = [Interpreter(parse((LAYERS / f"norm_rows.{s}.ir").read_text())).run([x]).outputs[0]
            for s in ("loops", "fused")]
    mu = x.mean(1, keepdim=True)
    want = (x - mu) * torch.rsqrt(((x - mu) ** 2).mean(1, keepdim=True) + 1e-5)
    for got in outs:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- plan-buffers twice, and the inductor backend over a compiled module -----------------------

def _reused(m: Module) -> list[Value]:
    return [v for g in m.graphs.values() for n in g.nodes if n.op == "kernels.call"
            for v in n.kwargs.get("reuse") or []  # type: ignore[union-attr]
            if isinstance(v, Value)]


@settings(max_examples=15, deadline=None)
@given(keep=st.lists(st.booleans(), min_size=20, max_size=20))
def test_plan_buffers_completes_a_partial_plan_soundly(keep: list[bool]) -> None:
    """Any part of an earlier plan kept, planning again never hands one storage to two kernels
    and never reuses a buffer still read later."""
    m = parse((LAYERS / "attention_block.kernels.ir").read_text())
    calls = [n for n in m.graph("block").nodes if n.op == "kernels.call"]
    for n, k in zip(calls, keep, strict=False):
        if not k:
            n.kwargs = {a: v for a, v in n.kwargs.items() if a != "reuse"}
    planned = run_pipeline(m, "plan-buffers")
    g, reused = planned.graph("block"), _reused(planned)
    assert len(reused) == len(set(reused)), str(g)
    for i, n in enumerate(g.nodes):
        for b in n.kwargs.get("reuse") or []:  # type: ignore[union-attr]
            later = [u for u in g.nodes[i:] if b in u.args]
            assert not later and b not in g.outputs, (b, n)


def test_plan_buffers_keeps_an_earlier_plan_of_the_corpus() -> None:
    m = parse((LAYERS / "attention_block.kernels.ir").read_text())
    again = run_pipeline(m, "plan-buffers")
    assert str(again) == str(m)
    reused = _reused(again)
    assert len(reused) == len(set(reused))


def test_inductor_runs_a_compiled_module_as_it_is() -> None:
    m = parse((LAYERS / "attention_block.kernels.ir").read_text())
    assert is_compiled(m)
    assert compile_module(m) is m  # not compiled again: its own plan and sizes= ABI
    inputs = load_file(str(LAYERS / "attention_block.in.safetensors"))
    args = [inputs[p.name] for p in m.graph("block").params]
    want = Interpreter(m).run(args).outputs  # the reference launch of the same kernels
    got = compiled_runner(compile_module(m))("block", args).outputs
    assert len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
