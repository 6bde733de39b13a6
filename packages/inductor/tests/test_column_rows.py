"""The column plan's rows step (`sched_plan="column+rows"`, issue 14): an outer reduction whose
column blocks are too few to keep the threads busy (BatchNorm's statistics over 16..64 channels
of N*H*W rows, channels-last) splits each block's rows over the threads, each keeping per-column
partials that are combined in thread order. Checked against torch over small and odd shapes, at
1..3 threads, with the plan forced where the default would keep so little work on one thread."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.inductor.schedule import ScheduleError
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline

SCHEDULED = "to-prims,conv-nhwc,lower-loops,fuse,schedule-cpu"
BACK = "codegen-cpp,plan-buffers"


def _graph(kind: str, shape: list[int]) -> Module:
    """Reductions over every dim but the last (NHWC's channel), as one kernel."""
    c = shape[-1]
    dims = list(range(len(shape) - 1))
    t = "i64" if kind == "isum" else "f32"
    x = f"{t}[{', '.join(map(str, shape))}]"
    if kind == "stats":  # sum, amax and amin of one input: one pass, three partials
        body = [f"  %s = aten.sum.dim_IntList(%x, {dims}) : f32[{c}]",
                f"  %m = aten.amax.default(%x, {dims}) : f32[{c}]",
                f"  %n = aten.amin.default(%x, {dims}) : f32[{c}]"]
        outs = ["%s", "%m", "%n"]
    elif kind == "var":  # BatchNorm's two passes: the mean, then the squares around it
        body = [f"  %v, %mu = aten.var_mean.correction(%x, {dims}, correction=0) "
                f": (f32[{c}], f32[{c}])"]
        outs = ["%v", "%mu"]
    else:
        body = [f"  %s = aten.sum.dim_IntList(%x, {dims}) : i64[{c}]"]
        outs = ["%s"]
    types = ", ".join(f"{'i64' if kind == 'isum' else 'f32'}[{c}]" for _ in outs)
    return parse(f"ember.ir 1.0\n\ngraph @f(%x: {x}) -> ({types}) {{\n" + "\n".join(body)
                 + f"\n  return ({', '.join(outs)})\n}}\n")


def _kernels(m: Module) -> list[Any]:
    return [n for n in m.graph("f").nodes if n.op in ("loop.pointwise", "loop.reduction")]


def _rows(m: Module) -> Module:
    """`m` with every column-plan kernel on the rows step, through the text (as an edited
    dump would be)."""
    out = parse(str(m))
    for n in _kernels(out):
        if not str(n.kwargs.get("sched_plan", "")).startswith("column"):  # (one column)
            n.kwargs["sched_blocks"] = "auto"
        n.kwargs["sched_plan"] = "column+rows"
        n.kwargs["sched_parallel"] = []
    return parse(str(out))


def _run(m: Module, x: torch.Tensor, threads: int) -> list[torch.Tensor]:
    compiled = run_pipeline(m, BACK)
    if any(n.kwargs.get("sched_plan") == "column+rows" for n in _kernels(m)):
        assert "nt_used" in "\n".join(k.source for k in compiled.kernels.values())
    load_module(compiled)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return list(compiled_runner(compiled)("f", [x]).outputs)
    finally:
        torch.set_num_threads(before)


def _want(kind: str, x: torch.Tensor) -> list[torch.Tensor]:
    dims = list(range(x.dim() - 1))
    if kind == "stats":
        return [x.sum(dims), x.amax(dims), x.amin(dims)]
    if kind == "var":
        return list(torch.var_mean(x, dims, correction=0))
    return [x.sum(dims)]


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(["stats", "var", "isum"]),
       shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).flatmap(
           lambda s: st.integers(1, 40).map(lambda c: [*s, c])),
       threads=st.integers(1, 3), nan=st.booleans(), seed=st.integers(0, 2**16))
def test_rows_step_matches_torch(kind: str, shape: list[int], threads: int, nan: bool,
                                 seed: int) -> None:
    src = _graph(kind, shape)
    scheduled = _rows(run_pipeline(src, SCHEDULED))
    g = torch.Generator().manual_seed(seed)
    if kind == "isum":
        x = torch.randint(-1000, 1000, shape, generator=g)
    else:
        x = torch.randn(shape, generator=g) * 3 + 1
        if nan and kind == "stats" and x.numel() > 1:  # amax/amin propagate a NaN
            x.view(-1)[x.numel() // 2] = float("nan")
    got = _run(scheduled, x, threads)
    for a, b in zip(got, _want(kind, x), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_batchnorm_sized_statistics_take_the_rows_step() -> None:
    """16 channels over 16x32x32 rows: the default column plan had one block (one thread);
    256 channels keep their column blocks (8 tasks); a small one stays on one thread."""
    plans = {tuple(shape): {str(n.kwargs["sched_plan"]) for n in _kernels(
        run_pipeline(_graph("var", shape), SCHEDULED))}
        for shape in ([16, 32, 32, 16], [64, 256], [4, 8, 16])}
    assert plans == {(16, 32, 32, 16): {"column+rows"}, (64, 256): {"column"},
                     (4, 8, 16): {"column"}}
    big = run_pipeline(_graph("var", [16, 32, 32, 16]), SCHEDULED)
    assert all(n.kwargs["sched_parallel"] == [] and n.kwargs["sched_blocks"] == [16, 1]
               for n in _kernels(big))
    x = torch.randn(16, 32, 32, 16) + 5
    for threads in (1, 2):
        got = _run(big, x, threads)
        for a, b in zip(got, _want("var", x), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_rows_step_is_deterministic_for_a_thread_count() -> None:
    m = run_pipeline(_graph("var", [16, 32, 32, 16]), SCHEDULED)
    x = torch.randn(16, 32, 32, 16) * 100 + 1000
    a, b = _run(m, x, 2), _run(m, x, 2)
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)


@pytest.mark.parametrize(("edit", "why"), [
    ({"sched_parallel": [0]}, "outer loops stay on one thread"),
    ({"sched_plan": "column+rows", "sched_blocks": [16, 1]}, None),
])
def test_rows_step_refusals(edit: dict[str, Any], why: str | None) -> None:
    m = _rows(run_pipeline(_graph("stats", [4, 6, 16]), SCHEDULED))
    for n in _kernels(m):
        n.kwargs.update(edit)
    m = parse(str(m))
    if why is None:
        run_pipeline(m, BACK)
        return
    with pytest.raises(ScheduleError, match=why):
        run_pipeline(m, BACK)


def test_rows_step_refuses_argmax() -> None:
    src = parse("ember.ir 1.0\n\ngraph @f(%x: f32[12, 16]) -> (i64[16]) {\n"
                "  %a = aten.argmax.default(%x, 0) : i64[16]\n  return (%a)\n}\n")
    m = run_pipeline(src, SCHEDULED)
    assert [n.kwargs["sched_plan"] for n in _kernels(m)] == ["column"]
    with pytest.raises(ScheduleError, match="must be a sum, amax, amin"):
        run_pipeline(_rows(m), BACK)
