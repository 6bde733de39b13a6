"""The column plan's task count (issue 18, 16 threads): an outer reduction over wide columns is
cut into COL_WIDE_TASKS tasks (outer iterations x column blocks) where each block keeps at least
COL_WIDE_MIN columns, so global average pooling of a batch of 2 (NHWC [2, 7, 7, C], C 1024-2048)
keeps 16 threads busy (it had 2 x 4 blocks). Checked against torch at 1, odd and 16 threads."""

from __future__ import annotations

import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline

SCHEDULED = "to-prims,conv-nhwc,lower-loops,fuse,schedule-cpu"
BACK = "codegen-cpp,plan-buffers"


def _mean_hw(shape: list[int]) -> Module:
    n, h, w, c = shape
    return parse(f"ember.ir 1.0\n\ngraph @f(%x: f32[{n}, {h}, {w}, {c}]) -> (f32[{n}, {c}]) {{\n"
                 f"  %m = aten.mean.dim(%x, [1, 2]) : f32[{n}, {c}]\n  return (%m)\n}}\n")


def _tasks(m: Module) -> int:
    """Outer iterations x column blocks of the module's one column-plan kernel."""
    (node,) = [n for n in m.graph("f").nodes if n.op in ("loop.pointwise", "loop.reduction")]
    assert node.kwargs["sched_plan"] == "column"
    block, count = node.kwargs["sched_blocks"]  # type: ignore[misc]
    outer = 1
    for d in node.kwargs["ranges"][:-1]:  # type: ignore[index]
        outer *= int(d)
    return outer * int(count)


def test_global_pool_of_two_images_has_tasks_for_16_threads() -> None:
    for c in (1024, 1280, 2048):
        assert _tasks(run_pipeline(_mean_hw([2, 7, 7, c]), SCHEDULED)) >= 16, c
    # narrow columns keep the old rule: blocks of 16+ columns, >= 8 tasks
    assert _tasks(run_pipeline(_mean_hw([2, 14, 14, 512]), SCHEDULED)) == 8


def _run(m: Module, x: torch.Tensor, threads: int) -> torch.Tensor:
    compiled = run_pipeline(m, BACK)
    src = "\n".join(k.source for k in compiled.kernels.values())
    assert re.search(r"for \(int64_t b = 0; b < \d+; \+\+b\)", src)
    load_module(compiled)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return compiled_runner(compiled)("f", [x]).outputs[0]
    finally:
        torch.set_num_threads(before)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 3), hw=st.integers(1, 5), c=st.sampled_from([130, 300, 1024, 1040]),
       threads=st.sampled_from([1, 3, 7, 16]), seed=st.integers(0, 2**16))
def test_column_blocks_match_torch_at_any_thread_count(n: int, hw: int, c: int, threads: int,
                                                       seed: int) -> None:
    m = run_pipeline(_mean_hw([n, hw, hw, c]), SCHEDULED)
    x = torch.randn(n, hw, hw, c, generator=torch.Generator().manual_seed(seed)) * 3 + 1
    torch.testing.assert_close(_run(m, x, threads), x.mean((1, 2)), atol=1e-5, rtol=1e-5)
