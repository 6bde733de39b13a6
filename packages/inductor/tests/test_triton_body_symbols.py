"""A Triton kernel whose body reads a size that none of its buffers carries (issue 20, batch 8).

On the H200 the batch-8 prefill of a static-cache generate() recompiled with the batch dim
symbolic, and one of its kernels added a size to the cache position (`cumulative_length + s1`):
its buffers are 0-d, so the renderer, which took its size arguments from the buffers' shapes
only, refused it ("index symbol 's1' is not a loop variable"). The kernel ran on the
reference interpreter, so that graph was not recorded as a CUDA graph, and explain said
"(None)" for the reason. A size in a body (an operand, or in a load's or loop.index's
index) is now a kernel argument like the others: int64 and unspecialized on the GPU; an index
over one is int64 math (as for symbolic shapes), a size used only as a value is not.

Kernels run in Triton's interpreter on CPU tensors, checked against eager and the reference.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.inductor.backend import compiled_runner, summary
from ember.inductor.targets import Target
from ember.inductor.targets.cuda.sizes import body_symbols
from ember.ir import Interpreter, Module, parse
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.inductor.tests.size_kernels import SIZE_KERNELS, compiled

pytestmark = INTERPRETER_ONLY

FEW = settings(max_examples=10, deadline=None)

# s0 is the first dim of %x, which no kernel reads: @k, @j and @v read it (size_kernels.py)
TEXT = """ember.ir 1.1

symbol s0 hint=8 min=0 max=60

graph @main(%x: f32[s0, 4], %t: f32[64], %c: i64[]) -> (f32[4], i64[4], i64[]) {
  %y = loop.pointwise(@k, %t, ranges=[4]) : f32[4]
  %j = loop.pointwise(@j, ranges=[4]) : i64[4]
  %d = loop.pointwise(@v, %c, ranges=[]) : i64[]
  return (%y, %j, %d)
}

""" + SIZE_KERNELS


def _compiled() -> tuple[Module, Module]:
    return compiled(TEXT, "inductor-cuda-interpret")


def test_no_kernel_is_left_to_the_reference() -> None:
    _, m = _compiled()
    assert not [g.attrs["triton_fallback"] for g in m.graphs.values()
                if "triton_fallback" in g.attrs]
    calls = [n for g in m.graphs.values() for n in g.nodes if n.op == "kernels.call"]
    assert calls and all([str(s) for s in n.kwargs["sizes"]] == ["s0"]  # type: ignore[union-attr]
                         for n in calls)
    assert "reference interpreter" not in summary(m)


@FEW
@given(n=st.integers(0, 60), c=st.integers(-2**40, 2**40))
def test_sizes_in_bodies_match_eager(n: int, c: int) -> None:
    """One compiled module for every s0 in range: the offset load, the index value and the
    size added to a position, against eager and the reference interpreter."""
    src, m = _compiled()
    t = torch.randn(64)
    ins: list[Any] = [torch.randn(n, 4), t, torch.tensor(c)]
    got = compiled_runner(m, src)("main", ins).outputs
    want = Interpreter(src).run(ins, "main").outputs
    eager = [t[n:n + 4] * n, torch.arange(4) * n + 3, torch.tensor(c) + n]
    for a, b, e in zip(got, want, eager, strict=True):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(a, b)


def test_an_index_over_a_size_is_int64_a_value_is_not() -> None:
    """The 32/64-bit choice: an index expression over a run-time size is int64 math (the size
    is not known to keep it below 2**31); a kernel that only adds a size to a value keeps
    int32 indices. On the GPU the size is an unspecialized int64 argument."""
    _, m = _compiled()
    src = {k.name: k.source for k in m.kernels.values()}
    offset = next(s for s in src.values() if "i0 + s0" in s or "(s0 + i0)" in s)
    value = next(s for s in src.values() if "prims.add" in s)
    assert "tl.program_id(0).to(tl.int64)" in offset
    assert "tl.program_id(0) * XBLOCK" in value and ".to(tl.int64) * XBLOCK" not in value
    gpu = run_pipeline(parse(re.sub(r"((?:f32|i64)\[[^\]]*\])(?!@)", r"\1@cuda:0", TEXT)),
                       "decompose,cse,dce,inductor-cuda")
    for k in gpu.kernels.values():
        assert "s0: tl.int64" in k.source and "do_not_specialize=('s0',)" in k.source


def test_body_symbols_lists_operands_and_indices() -> None:
    src = parse(TEXT)
    items: dict[str, Any] = dict(src.graphs)
    got = body_symbols(src.graph("k"), items)
    assert {str(s) for s in got["index"]} == {"s0"} and {str(s) for s in got["value"]} == {"s0"}
    got = body_symbols(src.graph("v"), items)
    assert not got["index"] and {str(s) for s in got["value"]} == {"s0"}


def test_compile_with_a_size_as_a_value(triton_on_cpu: Target) -> None:
    """Through compile(dynamic=True): `c + x.shape[0]` reads a size of another input; no
    fallback (it was "index symbol 's0' is not a loop variable"), one graph for every size."""
    import ember.runtime as er

    def f(x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # (the softmax: a rows kernel whose fused reductions read c's size)
        return c + x.shape[0], x.sum(1) * x.shape[0], torch.softmax(x * c.shape[0], -1)
    cf = er.compile(f, dynamic=True)
    for n, k in ((3, 2), (5, 3), (9, 7)):
        x, c = torch.randn(n, 4), torch.arange(k) + 3
        torch.testing.assert_close(cf(x, c), f(x, c))
    rep = er.explain(cf)
    assert len(rep.graphs) == 1 and not rep.fallbacks, [f.reason for f in rep.fallbacks]


def test_a_kernel_left_to_the_reference_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """summary() (explain's "run by the reference interpreter: ...") gives the Triton
    renderer's reason for a kernel it left, as the C++ one's (it said "(None)")."""
    from ember.inductor.targets.cuda import render
    monkeypatch.setitem(render.OPS, "prims.add", {})
    m = run_pipeline(parse(TEXT), "inductor-cuda-interpret")
    text = summary(m)
    assert "loop.pointwise @v (prims.add has no Triton template for i64)" in text, text
    assert "(None)" not in text
