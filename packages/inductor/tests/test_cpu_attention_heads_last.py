"""The CPU target's fused attention forward (targets/cpu/attention.py): for a q that is a head
split of a projection, torch's kernel writes its output [B, L, H, E] and its logsumexp [B, L, H];
the extern returns those buffers (loop.attention_heads_last_cpu) and the lowering reads them as
permuted views, so the head merge before the output projection is a reshape (no copy kernel)
and no result is copied into [B, H, L, E] order. Another q keeps the plain extern."""

from __future__ import annotations

import torch

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu.linear import LINEAR_OP
from ember.ir import parse

# q, k, v split from one projection, attention, heads merged, output projection; the logsumexp
# returned too (training saves it)
MERGE = """ember.ir 1.0

graph @f(%x: f32[2, 8, 24], %w: f32[8, 8]) -> (f32[16, 8], f32[2, 2, 8]) {
  %q4 = aten.view.default(%x, [2, 8, 6, 4]) : f32[2, 8, 6, 4]
  %q = aten.slice.Tensor(%q4, 2, 0, 2) : f32[2, 8, 2, 4]
  %k = aten.slice.Tensor(%q4, 2, 2, 4) : f32[2, 8, 2, 4]
  %v = aten.slice.Tensor(%q4, 2, 4, 6) : f32[2, 8, 2, 4]
  %qt = aten.transpose.int(%q, 1, 2) : f32[2, 2, 8, 4]
  %kt = aten.transpose.int(%k, 1, 2) : f32[2, 2, 8, 4]
  %vt = aten.transpose.int(%v, 1, 2) : f32[2, 2, 8, 4]
  %o, %l = aten._scaled_dot_product_flash_attention_for_cpu.default(%qt, %kt, %vt, 0.0, true, scale=0.5) : (f32[2, 2, 8, 4], f32[2, 2, 8])
  %ot = aten.transpose.int(%o, 1, 2) : f32[2, 8, 2, 4]
  %m = aten.reshape.default(%ot, [16, 8]) : f32[16, 8]
  %y = aten.mm.default(%m, %w) : f32[16, 8]
  return (%y, %l)
}
"""

CONTIGUOUS_Q = """ember.ir 1.0

graph @f(%q: f32[2, 2, 8, 4]) -> (f32[2, 2, 8, 4]) {
  %o, %l = aten._scaled_dot_product_flash_attention_for_cpu.default(%q, %q, %q) : (f32[2, 2, 8, 4], f32[2, 2, 8])
  return (%o)
}
"""


def _eager(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = (x.view(2, 8, 6, 4)[:, :, i:i + 2].transpose(1, 2) for i in (0, 2, 4))
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True,
                                                                          scale=0.5)
    return o.transpose(1, 2).reshape(16, 8) @ w, lse


def test_heads_last_output_and_logsumexp_are_read_where_the_kernel_writes_them() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, 24, generator=g), torch.randn(8, 8, generator=g)
    compiled = compile_module(parse(MERGE))
    nodes = compiled.graph().nodes
    externs = [n for n in nodes if n.op == "kernels.extern"]
    ops = [n.kwargs["op"] for n in externs]
    assert ops[0] == "loop.attention_heads_last_cpu", ops
    assert externs[0].kwargs["kernel"] == \
        "aten._scaled_dot_product_flash_attention_for_cpu.default"
    # between the attention and the output projection's GEMM (on the input weight: the
    # packed linear, linear.py): views only, no copy kernel
    at, mm = nodes.index(externs[0]), nodes.index(next(n for n in externs
                                                        if n.kwargs["op"] == LINEAR_OP))
    assert not any(n.op == "kernels.call" for n in nodes[at:mm]), \
        [n.op for n in nodes[at:mm]]
    y, lse = compiled_runner(compiled)(None, [x, w]).outputs
    want_y, want_lse = _eager(x, w)
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(lse, want_lse)


def test_a_q_with_heads_outside_its_rows_keeps_the_plain_extern() -> None:
    q = torch.randn(2, 2, 8, 4, generator=torch.Generator().manual_seed(1))
    compiled = compile_module(parse(CONTIGUOUS_Q))
    assert [n.kwargs["op"] for n in compiled.graph().nodes if n.op == "kernels.extern"] == \
        ["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    (o,) = compiled_runner(compiled)(None, [q]).outputs
    torch.testing.assert_close(o, torch.nn.functional.scaled_dot_product_attention(q, q, q))
