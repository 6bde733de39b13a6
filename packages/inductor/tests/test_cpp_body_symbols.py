"""A C++ kernel whose body reads a size that none of its buffers carries (issue 20, CPU side).

The Triton target refused such a kernel until 3c942c0 (test_triton_body_symbols.py: the batch-8
prefill's `cumulative_length + s1`, "index symbol 's1' is not a loop variable"). The C++ target
takes every size symbol its code reads as an `int64_t` argument after its buffers: `cexpr`
records each one it prints (cpp.size_symbols), so a size as an operand, in a load's offset, in
`loop.index`, in `prims.full`'s value or in a fused reduction's body is an argument like the
sizes of the buffers' shapes, and the call binds it from the graph's inputs (`sizes=[s0]`).
These tests pin that down: no kernel of the module is left to the reference interpreter, and
one library computes eager's values for every size.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (the loop ops, the CPU target)
from ember.inductor.backend import compiled_runner, summary
from ember.ir import Interpreter, Module
from packages.inductor.tests.size_kernels import SIZE_KERNELS, compiled

FEW = settings(max_examples=10, deadline=None)

# s0 is the first dim of %x, which no kernel reads: @k, @j and @v read it (size_kernels.py),
# @f's fused reduction scales by it, @z fills with it
TEXT = """ember.ir 1.1

symbol s0 hint=8 min=0 max=48

graph @main(%x: f32[s0, 4], %t: f32[64], %c: i64[]) -> (f32[4], i64[4], i64[], f32[4], f32[2]) {
  %y = loop.pointwise(@k, %t, ranges=[4]) : f32[4]
  %j = loop.pointwise(@j, ranges=[4]) : i64[4]
  %d = loop.pointwise(@v, %c, ranges=[]) : i64[]
  %f = loop.pointwise(@f, %t, ranges=[4]) : f32[4]
  %z = loop.pointwise(@z, ranges=[2]) : f32[2]
  return (%y, %j, %d, %f, %z)
}

""" + SIZE_KERNELS + """
graph @f(%t: f32[64]) -> (f32[]) domain(i0 < 4) {
  %v = loop.load(%t, index=[i0]) : f32[]
  %m = loop.reduce(@fr, %t, ranges=[4], reduce_ranges=[16], reduction="sum") : f32[]
  %w = prims.sub(%v, %m) : f32[]
  return (%w)
}

graph @fr(%t: f32[64]) -> (f32[]) domain(i0 < 4, r0 < 16) {
  %v = loop.load(%t, index=[i0 * 16 + r0]) : f32[]
  %w = prims.mul(%v, s0 + 1) : f32[]
  return (%w)
}

graph @z() -> (f32[]) {
  %v = prims.full(shape=[], value=s0 * 2, dtype=f32, device="cpu") : f32[]
  return (%v)
}
"""


def _compiled() -> tuple[Module, Module]:
    return compiled(TEXT, "inductor")


def _eager(x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> list[torch.Tensor]:
    n = x.shape[0]
    return [t[n:n + 4] * n, torch.arange(4) * n + 3, c + n,
            t[:4] - (t.reshape(4, 16) * (n + 1)).sum(1), torch.full((2,), 2.0 * n)]


def test_no_kernel_is_left_to_the_reference() -> None:
    _, m = _compiled()
    assert not [g.attrs["cpp_fallback"] for g in m.graphs.values() if "cpp_fallback" in g.attrs]
    calls = [n for g in m.graphs.values() for n in g.nodes if n.op == "kernels.call"]
    assert calls and not [n for g in m.graphs.values() for n in g.nodes
                          if n.op in ("loop.pointwise", "loop.reduction")]
    assert all([str(s) for s in n.kwargs["sizes"]] == ["s0"]  # type: ignore[union-attr]
               for n in calls)
    assert "reference interpreter" not in summary(m)
    for k in m.kernels.values():  # each function takes the size after its buffers
        if k.name != "cpp_prelude":
            assert re.search(r", int64_t s0\) \{", k.source), k.source


@FEW
@given(n=st.integers(0, 48), c=st.integers(-2**40, 2**40))
def test_sizes_in_bodies_match_eager(n: int, c: int) -> None:
    """One library for every s0 in range: the offset load, the index value, the size added to
    a position, the fused reduction and the fill, against eager and the reference."""
    src, m = _compiled()
    torch.manual_seed(n)
    ins: list[Any] = [torch.randn(n, 4), torch.randn(64), torch.tensor(c)]
    got = compiled_runner(m, src)("main", ins).outputs
    want = Interpreter(src).run(ins, "main").outputs
    for a, b, e in zip(got, want, _eager(*ins), strict=True):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(a, b)


def test_compile_with_a_size_as_a_value() -> None:
    """Through compile(dynamic=True) on the CPU target: a position plus another input's length
    (the static cache's pattern), an arange scaled by it and a reduction scaled by it; one
    graph for every size, every kernel C++."""
    import ember.runtime as er

    def f(x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = x.shape[0]
        return pos + n, torch.arange(4) * n, x.sum(1) * n
    cf = er.compile(f, dynamic=True)
    for n in (3, 5, 9):
        x, pos = torch.randn(n, 4), torch.tensor(7)
        torch.testing.assert_close(cf(x, pos), f(x, pos))
    rep = er.explain(cf)
    assert len(rep.graphs) == 1 and not rep.fallbacks, [f.reason for f in rep.fallbacks]
    assert "reference interpreter" not in str(rep), str(rep)
