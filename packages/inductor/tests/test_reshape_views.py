"""A reshape feeding an extern (matmul) is a view where torch's would be one: `F.linear` on a
contiguous [B, T, K] input, or a [B, L, N] intermediate read as [B*L, N], reaches the matmul
with no copy kernel (issues 14 and 18); a reshape that merges dims a permute reordered is still
copied, and both give eager's values."""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Interpreter, Module, parse, verify
from ember.ir.passes import run_pipeline
from ember.runtime import compile

LINEAR = """ember.ir 1.0

graph @f(%x: f32[2, 3, 4], %w: f32[5, 4]) -> (f32[6, 5]) {
  %wt = prims.permute(%w, dims=[1, 0]) : f32[4, 5]
  %x2 = prims.reshape(%x, shape=[6, 4]) : f32[6, 4]
  %y = prims.matmul(%x2, %wt) : f32[6, 5]
  return (%y)
}
"""


def _ops(m: Module) -> list[tuple[str, Any]]:
    return [(n.op, n.kwargs.get("op")) for n in m.items["f"].nodes]  # type: ignore[union-attr]


def test_linear_on_a_contiguous_3d_input_copies_nothing() -> None:
    compiled = compile_module(parse(LINEAR))
    ops = _ops(compiled)
    assert ("kernels.view", "prims.reshape") in ops
    assert not any(op == "kernels.call" for op, _ in ops), ops  # no copy kernel of x
    x, w = torch.randn(2, 3, 4), torch.randn(5, 4)
    want = torch.nn.functional.linear(x, w).reshape(6, 5)
    torch.testing.assert_close(compiled_runner(compiled)(None, [x, w]).outputs[0], want)
    # strided inputs: torch's reshape views them where it can, else copies; same values
    for xs in (torch.randn(2, 4, 3).transpose(1, 2), torch.randn(2, 3, 8)[:, :, ::2],
               torch.randn(4, 3, 4)[::2], torch.randn(3, 2, 4).transpose(0, 1)):
        torch.testing.assert_close(compiled_runner(compiled)(None, [xs, w]).outputs[0],
                                   torch.nn.functional.linear(xs, w).reshape(6, 5))


SLICE_MERGE = """ember.ir 1.0

graph @f(%x: f32[4, 3, 4], %w: f32[4, 5]) -> (f32[6, 5]) {
  %s = prims.slice(%x, start=[1, 0, 0], limit=[3, 3, 4]) : f32[2, 3, 4]
  %r = prims.reshape(%s, shape=[6, 4]) : f32[6, 4]
  %y = prims.matmul(%r, %w) : f32[6, 5]
  return (%y)
}
"""


def test_a_slice_then_merge_is_a_flat_view_not_a_copy() -> None:
    compiled = compile_module(parse(SLICE_MERGE))
    ops = _ops(compiled)
    assert ("kernels.view", "prims.reshape") in ops and ("kernels.view", "loop.view") in ops
    assert not any(op == "kernels.call" for op, _ in ops), ops
    w = torch.randn(4, 5)
    for x in (torch.randn(4, 3, 4), torch.randn(4, 4, 3).transpose(1, 2)):
        torch.testing.assert_close(compiled_runner(compiled)(None, [x, w]).outputs[0],
                                   x[1:3].reshape(6, 4) @ w)


def test_compiled_linear_end_to_end_matches_eager_with_no_copy(tmp_path: Any) -> None:
    f = compile(lambda x, w: torch.nn.functional.linear(x, w),
                options={"dump_dir": str(tmp_path)})
    x, w = torch.randn(2, 3, 4), torch.randn(5, 4)
    torch.testing.assert_close(f(x, w), torch.nn.functional.linear(x, w))
    kernels = next(tmp_path.glob("*.kernels.ir")).read_text()
    assert "kernels.call" not in kernels and 'op="prims.reshape"' in kernels


@st.composite
def merges(draw: Any) -> tuple[str, list[torch.Tensor], torch.Tensor, bool]:
    """(IR, inputs, eager output, whether torch views it): a buffer (input or intermediate),
    optionally sliced along dim 0, permuted, its leading dims merged, into a matmul."""
    rank = draw(st.integers(2, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    perm = draw(st.permutations(range(rank)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g)
    lines, name, cur = [], "x", x
    if draw(st.booleans()):  # an intermediate: a kernel's output buffer
        cur = -x
        lines.append(f"  %n = prims.neg(%x) : f32{shape}")
        name = "n"
    if shape[0] > 1 and draw(st.booleans()):
        lo = draw(st.integers(0, shape[0] - 1))
        hi = draw(st.integers(lo + 1, shape[0]))
        cur = cur[lo:hi]
        s = list(cur.shape)
        lines.append(f"  %s = prims.slice(%{name}, start={[lo] + [0] * (rank - 1)}, "
                     f"limit={[hi] + shape[1:]}) : f32{s}")
        name = "s"
    cur = cur.permute(*perm)
    lines.append(f"  %p = prims.permute(%{name}, dims={list(perm)}) : f32{list(cur.shape)}")
    merged = [math.prod(cur.shape[:-1]), cur.shape[-1]]
    lines.append(f"  %r = prims.reshape(%p, shape={merged}) : f32{merged}")
    w = torch.randn(merged[1], 3, generator=g)
    out = cur.reshape(merged) @ w
    lines.append(f"  %y = prims.matmul(%r, %w) : f32[{merged[0]}, 3]")
    try:
        cur.view(merged)
        viewable = True
    except RuntimeError:
        viewable = False
    text = (f"ember.ir 1.0\n\ngraph @f(%x: f32{shape}, %w: f32{list(w.shape)}) -> "
            f"(f32[{merged[0]}, 3]) {{\n" + "\n".join(lines) + "\n  return (%y)\n}\n")
    return text, [x, w], out, viewable


@settings(max_examples=40, deadline=None)
@given(merges())
def test_a_merge_is_copied_exactly_where_torch_cannot_view_it(
        prog: tuple[str, list[torch.Tensor], torch.Tensor, bool]) -> None:
    text, inputs, want, viewable = prog
    m = parse(text)
    verify(m)
    low = run_pipeline(m, "lower-loops", verify_each=True)
    copies = [n for n in low.items["f"].nodes  # type: ignore[union-attr]
              if n.op == "loop.pointwise" and n.results[0].name.endswith(".copy")]
    assert bool(copies) == (not viewable), str(low)
    torch.testing.assert_close(Interpreter(low).run(inputs).outputs[0], want)


@settings(max_examples=6, deadline=None)
@given(merges())
def test_a_merge_into_matmul_compiles_like_eager(
        prog: tuple[str, list[torch.Tensor], torch.Tensor, bool]) -> None:
    text, inputs, want, _ = prog
    compiled = compile_module(parse(text))
    torch.testing.assert_close(compiled_runner(compiled)(None, inputs).outputs[0], want)
