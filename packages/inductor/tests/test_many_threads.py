"""Kernels whose work is split by the thread count (omp_get_num_threads) at the counts a 16-core
machine runs and odd ones (issue 18): full reductions' per-thread partials (the split plan:
runs of 4096-element blocks of a 1-d loop, or of the outer reduced loop, fewer than the threads
here so some threads get none) and the column plan's rows step (per-thread column partials),
against torch, with a NaN anywhere for amax/amin, and the same bits on a second call."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline

PIPELINE = "to-prims,conv-nhwc,lower-loops,fuse,schedule-cpu,codegen-cpp,plan-buffers"
THREADS = st.sampled_from([1, 3, 7, 13, 16])


def _compiled(op: str, shape: list[int], dims: list[int], out: list[int]) -> Module:
    x = f"f32[{', '.join(map(str, shape))}]"
    y = f"f32[{', '.join(map(str, out))}]"
    return run_pipeline(parse(f"ember.ir 1.0\n\ngraph @f(%x: {x}) -> ({y}) {{\n"
                              f"  %y = aten.{op}(%x, {dims}) : {y}\n  return (%y)\n}}\n"),
                        PIPELINE)


def _run(m: Module, x: torch.Tensor, threads: int) -> torch.Tensor:
    load_module(m)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return compiled_runner(m)("f", [x]).outputs[0]
    finally:
        torch.set_num_threads(before)


@settings(max_examples=16, deadline=None)
@given(shape=st.sampled_from([[40000], [70001], [3, 20000], [5, 7000], [2, 3, 9000]]),
       op=st.sampled_from(["sum", "amax", "amin"]), threads=THREADS, nan=st.booleans(),
       seed=st.integers(0, 2**16))
def test_split_reductions_at_many_threads(shape: list[int], op: str, threads: int, nan: bool,
                                          seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3 + 1
    if nan and op != "sum":
        x.view(-1)[int(torch.randint(x.numel(), (1,), generator=g))] = float("nan")
    dims = list(range(len(shape)))
    m = _compiled("sum.dim_IntList" if op == "sum" else f"{op}.default", shape, dims, [])
    src = "\n".join(k.source for k in m.kernels.values())
    assert "* t / nt" in src  # the split plan's runs
    got = _run(m, x, threads)
    want = {"sum": x.sum(), "amax": x.amax(), "amin": x.amin()}[op]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3, equal_nan=True)
    assert torch.equal(got, _run(m, x, threads)) or bool(got.isnan())


@settings(max_examples=10, deadline=None)
@given(rows=st.sampled_from([[5, 32, 32], [16, 16, 16], [3, 33, 35]]),
       c=st.sampled_from([16, 24, 40]), threads=THREADS, seed=st.integers(0, 2**16))
def test_rows_step_at_many_threads(rows: list[int], c: int, threads: int, seed: int) -> None:
    shape = [*rows, c]
    m = _compiled("sum.dim_IntList", shape, [0, 1, 2], [c])
    src = "\n".join(k.source for k in m.kernels.values())
    assert "r0 < " in src and "* t / nt" in src  # the rows step splits the outer rows
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3 + 1
    got = _run(m, x, threads)
    torch.testing.assert_close(got, x.sum((0, 1, 2)), rtol=1e-5, atol=1e-3)
    assert torch.equal(got, _run(m, x, threads))
