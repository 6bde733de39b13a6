"""Size-generic kernels as good as specialized ones (issue 17 #6): a concatenation whose pieces'
extents along the cat dim are known fuses into its consumer's kernel, and an embedding lookup is
`loop.index_select` of the ids, also where the other dims are size symbols. Before, both fell
back to externs under symbolic sizes (16 `prims.concatenate` and a materialised [N, D] index
for `prims.gather` in GPT-NeoX's size-generic forward: ~1.2x the specialized time)."""

from __future__ import annotations

import pytest
import torch

import ember.inductor  # noqa: F401
from ember.inductor.backend import compile_module, compiled_runner
from ember.ir import Interpreter, Module, parse

HEAD = "ember.ir 1.0\n\nsymbol s0 hint=4 min=2\nsymbol s1 hint=8 min=2\n\n"

# rotary embedding's halves swapped (cat of two slices along the static last dim), then used
ROTARY = HEAD + """graph @rotary(%x: f32[s0, s1, 8], %c: f32[s1, 8]) -> (f32[s0, s1, 8]) {
  %a = aten.slice.Tensor(%x, 2, 0, 4) : f32[s0, s1, 4]
  %b = aten.slice.Tensor(%x, 2, 4, 8) : f32[s0, s1, 4]
  %nb = aten.neg.default(%b) : f32[s0, s1, 4]
  %r = aten.cat.default([%nb, %a], 2) : f32[s0, s1, 8]
  %m = aten.mul.Tensor(%r, %c) : f32[s0, s1, 8]
  %y = aten.add.Tensor(%x, %m) : f32[s0, s1, 8]
  return (%y)
}
"""

# an embedding lookup of [s0, s1] ids into a [16, 8] table
EMBED = HEAD + """graph @embed(%w: f32[16, 8], %ids: i64[s0, s1]) -> (f32[s0, s1, 8]) {
  %e = aten.embedding.default(%w, %ids) : f32[s0, s1, 8]
  %y = aten.mul.Scalar(%e, 2.0) : f32[s0, s1, 8]
  return (%y)
}
"""


def _externs(compiled: Module) -> list[str]:
    return [str(n.kwargs["op"]) for g in compiled.graphs.values() for n in g.nodes
            if n.op == "kernels.extern"]


@pytest.mark.parametrize("text,name,banned", [
    (ROTARY, "rotary", "prims.concatenate"),
    (EMBED, "embed", "prims.gather"),
])
def test_symbolic_cat_and_embedding_compile_to_kernels(text: str, name: str,
                                                       banned: str) -> None:
    src = parse(text)
    compiled = compile_module(src)
    ops = _externs(compiled)
    assert banned not in ops, ops
    if name == "embed":
        assert ops == ["loop.index_select"], ops
    run = compiled_runner(compiled, src)
    g = torch.Generator().manual_seed(0)
    for s0, s1 in ((2, 2), (3, 5), (4, 17)):
        if name == "rotary":
            ins = [torch.randn(s0, s1, 8, generator=g), torch.randn(s1, 8, generator=g)]
        else:
            ins = [torch.randn(16, 8, generator=g), torch.randint(0, 16, (s0, s1), generator=g)]
        want = Interpreter(src).run(ins, name).outputs
        got = run(name, ins).outputs
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)


def test_reshape_of_a_symbolic_dim_reads_with_an_affine_index() -> None:
    """[s0, s1, 256] read as [s0*s1, 256]: `(256*i0 + i1) // (256*s1)` is `i0 // s1` (i1 <
    256), and the flat offset `256*s1*(i0 // s1) + 256*mod(i0, s1) + i1` is `256*i0 + i1`:
    no division or modulo per element in the vectorised loop (as with static sizes)."""
    from ember.inductor.indexing import flat_offset, ivar, simplify_index
    from ember.ir.expr import FloorDiv, PyMod, symbol

    i0, i1, s0, s1 = ivar(0), ivar(1), symbol("s0"), symbol("s1")
    assert simplify_index(FloorDiv(256 * i0 + i1, 256 * s1), {i1: 256}) == FloorDiv(i0, s1)
    assert simplify_index(FloorDiv(FloorDiv(i0, s1), s0)) == FloorDiv(i0, s0 * s1)
    split = i1 + 256 * PyMod(i0, s1) + 256 * s1 * FloorDiv(256 * i0 + i1, 256 * s1)
    assert simplify_index(split, {i1: 256}) == 256 * i0 + i1
    assert flat_offset([FloorDiv(i0, s1), PyMod(i0, s1), i1], [s0, s1, 256]) == 256 * i0 + i1
    # not exact where the small part may reach the divisor's factor: left as it is
    assert simplify_index(FloorDiv(256 * i0 + i1, 256 * s1), {i1: 512}) != FloorDiv(i0, s1)
