"""A transposing pointwise kernel loops innermost over the dim its loads read contiguously
(schedule.py's `_transpose_order`): the output's innermost dim read 48 floats 4 KB apart per
row in EdgeNeXt's attention output copy. The order is checked in the generated C++, the
numbers against eager for any permutation."""

from __future__ import annotations

import itertools
import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner, module_source
from ember.ir import DType, GraphBuilder, Module, TensorType


def _run(x: torch.Tensor, perm: tuple[int, ...], shape: list[int] | None = None
         ) -> tuple[torch.Tensor, str]:
    """x.permute(perm) (copied and viewed as `shape`) * 2 + 1 through the CPU target: its
    output and C++ source."""
    m = Module()
    gb = GraphBuilder(m, "f")
    p = gb.param("x", TensorType(DType.f32, tuple(x.shape)))
    t = gb.op("aten.permute.default", [p, list(perm)])
    if shape is not None:
        t = gb.op("aten.view.default", [gb.op("aten.clone.default", [t]), shape])
    y = gb.op("aten.add.Tensor", [gb.op("aten.mul.Tensor", [t, 2.0]), 1.0])
    gb.ret([y])
    compiled = compile_module(m)
    (out,) = compiled_runner(compiled)(None, [x]).outputs
    return out, module_source(compiled)


def _innermost(src: str) -> str:
    """The loop variable of the kernel's `omp simd` loop."""
    m = re.search(r"#pragma omp (?:parallel for )?simd[^\n]*\n\s*for \(int64_t (\w+)", src)
    assert m, src
    return m.group(1)


def test_attention_output_copy_reads_contiguously() -> None:
    x = torch.randn(2, 4, 12, 1024)  # [batch, heads, channels, tokens] as [tokens, channels]
    got, src = _run(x, (0, 3, 1, 2), [2048, 48])
    torch.testing.assert_close(got, x.permute(0, 3, 1, 2).reshape(2048, 48) * 2 + 1)
    assert _innermost(src) == "i0"  # the tokens, contiguous in x


def test_short_innermost_dim_keeps_the_output_order() -> None:
    # an image copied channels-last: 3 read streams are no transpose's cost (measured slower
    # with the width innermost and the stores 3 floats apart)
    x = torch.randn(2, 3, 40, 40)
    got, src = _run(x, (0, 2, 3, 1))
    torch.testing.assert_close(got, x.permute(0, 2, 3, 1) * 2 + 1)
    assert _innermost(src) == "i3"
    # the same copy with 24 channels reads them 6.4 KB apart: the width goes innermost
    x = torch.randn(2, 24, 40, 40)
    got, src = _run(x, (0, 2, 3, 1))
    torch.testing.assert_close(got, x.permute(0, 2, 3, 1) * 2 + 1)
    assert _innermost(src) == "i2"


def test_square_transpose_and_plain_copies_keep_the_output_order() -> None:
    x = torch.randn(64, 64)
    got, src = _run(x, (1, 0))  # the store would stride as much as the loads do now
    torch.testing.assert_close(got, x.t() * 2 + 1)
    assert _innermost(src) == "i1"
    got, src = _run(x, (0, 1))
    torch.testing.assert_close(got, x * 2 + 1)
    assert _innermost(src) == "i1"


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 3, 16, 17, 40]), min_size=2, max_size=4),
       data=st.data())
def test_any_permutation_matches_eager(shape: list[int], data: st.DataObject) -> None:
    perm = data.draw(st.sampled_from(list(itertools.permutations(range(len(shape))))))
    x = torch.randn(shape)
    got, _ = _run(x, perm)
    torch.testing.assert_close(got, x.permute(perm) * 2 + 1)
