"""The generated wrapper's cheap forms (wrapper.py): externs call their op's own callable (a
prim's torch function, an aten op's C++ entry, torch.index_select) with constants converted at
generation time, a dead buffer reused at a static size is a view written into the source,
and an input's strided view is one `as_strided` over its real strides. Each keeps the
interpreter's results, on strided inputs too; a multi-result aten op whose result comes back
undefined is settled as the op's reference settles it."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, Module
from packages.inductor.tests.wrapper_checks import compiled_once, same

TEXT = """ember.ir 1.0

graph @mlp(%x: f32[8, 16], %w1: f32[32, 16], %b1: f32[32], %w2: f32[4, 32]) -> (f32[8, 4], f32[32]) {
  %w1t = aten.t.default(%w1) : f32[16, 32]
  %h = aten.addmm.default(%b1, %x, %w1t) : f32[8, 32]
  %a = aten.relu.default(%h) : f32[8, 32]
  %w2t = aten.t.default(%w2) : f32[32, 4]
  %y = aten.mm.default(%a, %w2t) : f32[8, 4]
  %z = aten.mul.Tensor(%y, 2.0) : f32[8, 4]
  %flat = aten.view.default(%y, [32]) : f32[32]
  %f2 = aten.add.Tensor(%flat, 1.0) : f32[32]
  return (%z, %f2)
}

graph @emb(%w: f32[16, 4], %ids: i64[2, 8]) -> (f32[6, 4]) {
  %s = aten.select.int(%ids, 0, 1) : i64[8]
  %t = aten.slice.Tensor(%s, 0, 1, 7) : i64[6]
  %e = aten.embedding.default(%w, %t) : f32[6, 4]
  return (%e)
}

graph @att(%q: f32[1, 2, 8, 4], %k: f32[1, 2, 8, 4], %v: f32[1, 2, 8, 4]) -> (f32[1, 2, 8, 4], f32[1, 2, 8]) {
  %o, %l = aten._scaled_dot_product_flash_attention_for_cpu.default(%q, %k, %v) : (f32[1, 2, 8, 4], f32[1, 2, 8])
  %y = aten.mul.Tensor(%o, 2.0) : f32[1, 2, 8, 4]
  return (%y, %l)
}
"""

def compiled() -> Module:
    return compiled_once(TEXT)


def test_externs_call_their_ops_directly() -> None:
    m = compiled()
    for g in ("mlp", "emb", "att"):
        src = generate(m, g).source
        assert "_interp" not in src, src  # no op reference, no per-call argument conversion
    assert "_out(" not in generate(m, "mlp").source  # the reuse is a view in the source


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), transposed=st.booleans())
def test_direct_forms_match_the_interpreter(seed: int, transposed: bool) -> None:
    m = compiled()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 8, generator=g).t() if transposed else torch.randn(8, 16, generator=g)
    ins: list[Any] = [x, torch.randn(32, 16, generator=g), torch.randn(32, generator=g),
                      torch.randn(4, 32, generator=g)]
    same(generate(m, "mlp").call(list(ins)).outputs, Interpreter(m).run(ins, "mlp").outputs)
    # ids as a strided view (a column of a bigger tensor, at an offset): the inline
    # as_strided reads its real strides and offset
    big = torch.randint(0, 16, (3, 8, 2), generator=g)
    ids = big[1:, :, 1] if transposed else torch.randint(0, 16, (2, 8), generator=g)
    w = torch.randn(16, 4, generator=g)
    got = generate(m, "emb").call([w, ids]).outputs
    same(got, Interpreter(m).run([w, ids], "emb").outputs)
    same(got, [torch.nn.functional.embedding(ids[1, 1:7], w)])
    qkv = [torch.randn(1, 2, 8, 4, generator=g) for _ in range(3)]
    same(generate(m, "att").call(list(qkv)).outputs, Interpreter(m).run(qkv, "att").outputs)


def test_strided_input_view_is_inline() -> None:
    src = generate(compiled(), "emb").source
    assert " _strided(" not in src and ".stride()" in src and ".as_strided(" in src


def test_undefined_result_of_a_multi_result_op_is_settled_by_the_reference() -> None:
    """A kernel that leaves a declared result undefined (None; torch 2.11's cuDNN attention
    does for its logsumexp) gets zeros of the declared type, as the op's reference gives."""
    m = compiled()
    w = generate(m, "att")
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    ns = w.call.__globals__
    names = [k for k, v in ns.items() if v is op._op]
    assert len(names) == 1

    def no_lse(*a: Any, **k: Any) -> tuple[torch.Tensor, None]:
        return op._op(*a, **k)[0], None
    ns[names[0]] = no_lse
    try:
        qkv = [torch.randn(1, 2, 8, 4) for _ in range(3)]
        y, lse = w.call(list(qkv)).outputs
        same([y], [Interpreter(m).run(qkv, "att").outputs[0]])
        assert lse.shape == (1, 2, 8) and not lse.any()
    finally:
        ns[names[0]] = op._op
