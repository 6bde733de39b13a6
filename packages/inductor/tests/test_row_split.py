"""Schedule decisions by the thread count a kernel is compiled for (torch.get_num_threads() when
it is compiled: the choice shows in the C++ source, the kernel cache's key), and reductions in
memory order; each against eager at thread counts a 16-core machine runs and odd ones.

- the row split: a kernel of few rows (at most half the threads) whose reductions are large
  splits each row's reductions over the threads and runs the row's pointwise loops as a
  parallel for (GroupNorm(1, C) at batch 2 ran its 2 rows on 2 of 16 threads);
- reduced loops in memory order, the dims read contiguously as one vectorised run (GroupNorm
  over a channels-last conv output summed with stride C, 64 elements a run at best);
- the static work threshold: 8192 element-steps where compiled for 8+ threads, 32768 below.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
import ember.inductor.backend as backend
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.inductor.targets.cpu.schedule import PARALLEL_WORK, PARALLEL_WORK_MANY
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline
from ember.runtime.compile import compile as ember_compile

PIPELINE = "to-prims,conv-nhwc,lower-loops,fuse,schedule-cpu,codegen-cpp,plan-buffers"
THREADS = st.sampled_from([1, 2, 3, 7, 16])
SPLIT = "* t / nt"  # a split reduction's per-thread run


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run(fn: Callable[..., torch.Tensor], args: list[torch.Tensor], threads: int,
         monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """fn compiled and called twice at `threads` threads; the kernels' C++ sources."""
    seen: list[Module] = []
    orig = backend.generate

    def gen(module: Module, graph: object = None, interp: object = None) -> object:
        seen.append(module)
        return orig(module, graph, interp)
    with monkeypatch.context() as mp, _threads(threads), torch.no_grad():
        mp.setattr(backend, "generate", gen)
        c = ember_compile(fn)
        got, again = c(*args), c(*args)
    return got, again, [k.source for mod in seen for k in mod.kernels.values()]


def _group_norm(c: int, groups: int, conv: bool, seed: int) -> torch.nn.Module:
    """GroupNorm with random affine parameters, after a 1x1 convolution where `conv` (ember's
    convolutions write channels-last: the norm then reads an NHWC buffer)."""
    g = torch.Generator().manual_seed(seed)
    norm = torch.nn.GroupNorm(groups, c)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=g)
        norm.bias.uniform_(-1, 1, generator=g)
    if not conv:
        return norm.eval()
    lin = torch.nn.Conv2d(c, c, 1)
    with torch.no_grad():
        lin.weight.normal_(0, 0.3, generator=g)
    return torch.nn.Sequential(lin, norm).eval()


def _reduction_sources(sources: list[str]) -> list[str]:
    return [s for s in sources if "reduction fused" in s]


# ---- the row split ------------------------------------------------------------------------

@settings(max_examples=12, deadline=None)
@example(shape=[2, 64, 24, 24], conv=True, channels_last=False, threads=16, seed=0)
@example(shape=[2, 64, 24, 24], conv=True, channels_last=False, threads=3, seed=0)
@given(shape=st.sampled_from([[2, 64, 24, 24], [1, 40, 31, 29], [3, 16, 48, 47],
                              [2, 96, 20, 20], [5, 24, 40, 39]]),
       conv=st.booleans(), channels_last=st.booleans(), threads=THREADS,
       seed=st.integers(0, 2**16))
def test_group_norm_rows_split_by_threads(shape: list[int], conv: bool, channels_last: bool,
                                          threads: int, seed: int) -> None:
    """GroupNorm(1, C): N rows of >= 32768 elements; split where 2 * N <= threads (compiled
    for), else the rows' parallel for as before."""
    with pytest.MonkeyPatch.context() as mp:
        m = _group_norm(shape[1], 1, conv, seed)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3 + 1
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        got, again, sources = _run(m, [x], threads, mp)
    with torch.no_grad():
        want = m(x)
    norms = _reduction_sources(sources)
    assert norms
    split = 2 * shape[0] <= threads
    assert all((SPLIT in s) == split for s in norms), (threads, shape)
    if split:  # the rows serial, each row's passes in parallel regions and a parallel for
        assert all("#pragma omp parallel for" in s and "#pragma omp parallel num_threads" in s
                   for s in norms)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got, again)


@settings(max_examples=8, deadline=None)
@example(shape=[2, 200, 300], threads=16, seed=0)
@example(shape=[1, 9, 1000], threads=2, seed=0)
@given(shape=st.sampled_from([[2, 200, 300], [3, 70, 500], [1, 40000, 1], [1, 9, 1000]]),
       threads=THREADS, seed=st.integers(0, 2**16))
def test_row_sums_split_by_threads(shape: list[int], threads: int, seed: int) -> None:
    """A loop.reduction of few rows (no pointwise loop below them: the split regions only),
    compiled for `threads` and run at 1, `threads` and 16 threads (the split adapts to the
    threads it gets; same bits at one count)."""
    x_t = f"f32[{', '.join(map(str, shape))}]"
    ir = parse(f"ember.ir 1.0\n\ngraph @f(%x: {x_t}) -> (f32[{shape[0]}]) {{\n"
               f"  %y = aten.sum.dim_IntList(%x, [1, 2]) : f32[{shape[0]}]\n"
               f"  return (%y)\n}}\n")
    with _threads(threads):
        m = run_pipeline(ir, PIPELINE)
    src = "\n".join(k.source for k in m.kernels.values())
    least = PARALLEL_WORK_MANY if threads >= 8 else PARALLEL_WORK
    assert (SPLIT in src) == (2 * shape[0] <= threads and shape[1] * shape[2] >= least)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3 + 1
    load_module(m)
    for run_at in (1, threads, 16):
        with _threads(run_at):
            got = compiled_runner(m)("f", [x]).outputs[0]
            again = compiled_runner(m)("f", [x]).outputs[0]
        torch.testing.assert_close(got, x.sum((1, 2)), rtol=1e-5, atol=1e-2)
        assert torch.equal(got, again)


# ---- reductions in memory order -----------------------------------------------------------

def _vector_loads(src: str) -> list[tuple[str, str]]:
    """(loop variable, load line) of each load in a reduction pass's vectorised loop."""
    out = []
    for m in re.finditer(r"#pragma omp simd reduction[^\n]*\n\s*for \(int64_t (r\d+) = rb;"
                         r"(.*?)\n\s*a\d+ [+=]", src, re.S):
        out += [(m.group(1), ln) for ln in m.group(2).splitlines() if "= in" in ln]
    return out


@pytest.mark.parametrize("c", [64, 20])
def test_channels_last_group_norm_sums_one_contiguous_run(c: int,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """GroupNorm(1, C) of a conv's channels-last output: its sums read the row as one
    contiguous run (the C*H*W elements in memory order, one vectorised loop in blocks), not
    with stride C; as eager computes it."""
    m = _group_norm(c, 1, True, 0)
    x = torch.randn(1, c, 17, 19)
    got, _, sources = _run(m, [x], 1, monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
    norms = _reduction_sources(sources)
    loads = [ld for s in norms for ld in _vector_loads(s)]
    assert norms and loads
    for var, line in loads:  # unit stride along the vectorised loop
        assert re.search(rf"[\[(]{var} \+", line) and f"* {var}" not in line, line
    assert all(f"re = {c * 17 * 19};" in s or f"{c * 17 * 19});" in s for s in norms)


@settings(max_examples=16, deadline=None)
@example(op="group_norm", shape=[1, 48, 16, 16], conv=True, channels_last=True, threads=3,
         seed=0)
@given(op=st.sampled_from(["group_norm", "layer_norm", "var_mean", "softmax", "sum_hw", "amax"]),
       shape=st.sampled_from([[2, 32, 9, 11], [1, 48, 16, 16], [3, 8, 5, 7], [2, 3, 30, 31]]),
       conv=st.booleans(), channels_last=st.booleans(), threads=st.sampled_from([1, 3, 16]),
       seed=st.integers(0, 2**16))
def test_reductions_over_layouts_match_eager(op: str, shape: list[int], conv: bool,
                                             channels_last: bool, threads: int,
                                             seed: int) -> None:
    """Norms and reductions over NCHW and channels-last inputs (a conv's output or the
    caller's), over several dims, against eager."""
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    lin = torch.nn.Conv2d(c, c, 1).eval()
    with torch.no_grad():
        lin.weight.normal_(0, 0.3, generator=g)
    groups = 2 if c % 2 == 0 and c > 3 else 1

    def body(x: torch.Tensor) -> torch.Tensor:
        if conv:
            x = lin(x)
        if op == "group_norm":
            return F.group_norm(x, groups)
        if op == "layer_norm":
            return F.layer_norm(x, x.shape[1:])
        if op == "var_mean":
            v, mu = torch.var_mean(x, dim=(1, 2, 3), keepdim=True)
            return (x - mu) * v
        if op == "softmax":
            return torch.softmax(x, dim=1) + torch.softmax(x, dim=3)
        if op == "sum_hw":
            return x.sum((2, 3)) + x.mean((1, 3)).sum(-1, keepdim=True)
        return x.amax((1, 2, 3)) - x.amin((2, 3)).sum(1)
    x = torch.randn(shape, generator=g) * 3 + 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with pytest.MonkeyPatch.context() as mp:
        got, again, _ = _run(body, [x], threads, mp)
    with torch.no_grad():
        want = body(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    assert torch.equal(got, again)


# ---- the static work threshold ------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@example(rows=49, c=128, threads=16, seed=0)  # 12544: threads at 16, not at 7
@example(rows=49, c=128, threads=7, seed=0)
@given(rows=st.sampled_from([16, 49, 98, 196]), c=st.sampled_from([32, 64, 128]),
       threads=THREADS, seed=st.integers(0, 2**16))
def test_batchnorm_after_linear_parallel_by_threads(rows: int, c: int, threads: int,
                                                    seed: int) -> None:
    """levit's BatchNorm (eval) after a linear, with hardswish: a pointwise kernel of 2 * rows
    * c element-steps gets OpenMP's threads from 8192 where compiled for 8+ threads, from
    32768 below."""
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(c, c, bias=False)
    bn = torch.nn.BatchNorm1d(c)
    with torch.no_grad():
        bn.running_mean.normal_(0, 1, generator=g)
        bn.running_var.uniform_(0.5, 2, generator=g)
        bn.weight.uniform_(0.5, 1.5, generator=g)
        bn.bias.uniform_(-1, 1, generator=g)
    lin.eval()
    bn.eval()

    def body(x: torch.Tensor) -> torch.Tensor:
        y = lin(x)
        return F.hardswish(bn(y.flatten(0, 1)).reshape_as(y)) + x
    x = torch.randn(2, rows, c, generator=g)
    with pytest.MonkeyPatch.context() as mp:
        got, again, sources = _run(body, [x], threads, mp)
    with torch.no_grad():
        want = body(x)
    work = 2 * rows * c
    least = PARALLEL_WORK_MANY if threads >= 8 else PARALLEL_WORK
    bns = [s for s in sources if re.search(rf"// computes %\S+: f32\[2, {rows}, {c}\]", s)]
    assert bns
    assert all(("#pragma omp parallel" in s) == (work >= least) for s in bns), (work, threads)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got, again)
