"""The wrapper's view and allocation calls in their cheapest forms (wrapper.py): a transposed
2-D operand is `.t()` (x.T @ w here: the right operand of a 2-D product, a graph input as
it is or transposed, is the CPU target's packed linear, linear.py), other permutations take their dims as separate ints, a view at
offset 0 from its base calls `as_strided` without an offset (torch then keeps the base's own, so an
input that is itself a view at an offset is still read where it lies), and a kernel's output
is allocated with its sizes as separate arguments."""

from __future__ import annotations

import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, Module
from packages.inductor.tests.wrapper_checks import compiled_once, same

TEXT = """ember.ir 1.0

graph @lin(%x: f32[16, 8], %w: f32[16, 4]) -> (f32[8, 4]) {
  %xt = aten.t.default(%x) : f32[8, 16]
  %y = aten.mm.default(%xt, %w) : f32[8, 4]
  return (%y)
}

graph @heads(%x: f32[3, 4, 5], %w: f32[4, 5, 6]) -> (f32[4, 3, 6]) {
  %p = aten.permute.default(%x, [1, 0, 2]) : f32[4, 3, 5]
  %y = aten.bmm.default(%p, %w) : f32[4, 3, 6]
  return (%y)
}

graph @alloc(%x: f32[8, 16], %v: f32[16]) -> (f32[8, 16], f32[], f32[16]) {
  %y = aten.add.Tensor(%x, 1.0) : f32[8, 16]
  %s = aten.sum.default(%x) : f32[]
  %w = aten.mul.Tensor(%v, 2.0) : f32[16]
  return (%y, %s, %w)
}

graph @rows(%ids: i64[2, 8], %w: f32[16, 4]) -> (f32[8, 4], f32[8, 4]) {
  %a = aten.select.int(%ids, 0, 0) : i64[8]
  %b = aten.select.int(%ids, 0, 1) : i64[8]
  %ea = aten.embedding.default(%w, %a) : f32[8, 4]
  %eb = aten.embedding.default(%w, %b) : f32[8, 4]
  return (%ea, %eb)
}
"""

def compiled() -> Module:
    return compiled_once(TEXT)


def test_view_forms_in_the_source() -> None:
    m = compiled()
    lin, heads, rows, alloc = (generate(m, g).source
                               for g in ("lin", "heads", "rows", "alloc"))
    # kernel outputs allocated with their sizes as separate arguments (a 0-dim one: "()")
    assert "_empty(8, 16, dtype=" in alloc and "_empty((), dtype=" in alloc, alloc
    assert "_empty(16, dtype=" in alloc, alloc
    assert ".t()" in lin and ".permute(" not in lin, lin
    assert ".permute(1, 0, 2)" in heads, heads
    # select of row 0 is at the input's own offset: no storage_offset() read for it;
    # row 1 adds its offset to the input's
    calls = re.findall(r"\.as_strided\(.*\)", rows)
    assert len(calls) == 2, rows
    assert sum("storage_offset()" in c for c in calls) == 1, rows


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), strided=st.booleans())
def test_view_forms_match_eager(seed: int, strided: bool) -> None:
    m = compiled()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, generator=g)
    xl = x.t() if strided else torch.randn(16, 8, generator=g)
    w = torch.randn(16, 4, generator=g)
    got = generate(m, "lin").call([xl, w]).outputs
    same(got, Interpreter(m).run([xl, w], "lin").outputs)
    torch.testing.assert_close(got[0], xl.t() @ w)
    xs = torch.randn(2, 3, 4, 5, generator=g)[1] if strided else \
        torch.randn(3, 4, 5, generator=g)
    w3 = torch.randn(4, 5, 6, generator=g)
    got = generate(m, "heads").call([xs, w3]).outputs
    same(got, Interpreter(m).run([xs, w3], "heads").outputs)
    torch.testing.assert_close(got[0], torch.bmm(xs.permute(1, 0, 2), w3))
    # ids as a view at a nonzero storage offset (rows 1-2 of a bigger tensor, a column of it)
    big = torch.randint(0, 16, (4, 8, 2), generator=g)
    ids = big[1:3, :, 1] if strided else torch.randint(0, 16, (2, 8), generator=g)
    emb = torch.randn(16, 4, generator=g)
    got = generate(m, "rows").call([ids, emb]).outputs
    same(got, Interpreter(m).run([ids, emb], "rows").outputs)
    same(got, [emb[ids[0]], emb[ids[1]]])
    v = torch.randn(16, generator=g)
    got = generate(m, "alloc").call([x, v]).outputs
    same(got, Interpreter(m).run([x, v], "alloc").outputs)
    torch.testing.assert_close(got[0], x + 1)
    torch.testing.assert_close(got[1], x.sum())
    torch.testing.assert_close(got[2], v * 2)
