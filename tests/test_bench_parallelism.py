"""benchmarks/parallelism.py: the census reads each C++ kernel's OpenMP split from its source and
times the generated wrapper line by line. What is tested, on kernels ember generates: a column
reduction's `parallel for collapse(2)` gives outer x blocks chunks, a split full reduction's
region the run count of its outer loop, a small kernel none (serial); the estimate at T threads
is ceil(c/T)/c of the 1-thread time; the timed wrapper returns what the wrapper returns and
gives every line a time; --measure times on packed weights made at its thread count."""

from __future__ import annotations

import math

import torch

import ember.inductor  # noqa: F401
from ember.inductor.targets.cpu import packed
from ember.inductor.wrapper import generate
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline
from ember.runtime.compile import compile as ember_compile
from tests.bench_scripts import load_script

par = load_script("parallelism")
PIPELINE = "to-prims,conv-nhwc,lower-loops,fuse,schedule-cpu,codegen-cpp,plan-buffers"


def _module(body: str, x: str, out: str) -> Module:
    return run_pipeline(parse(f"ember.ir 1.0\n\ngraph @f(%x: {x}) -> ({out}) {{\n{body}\n"
                              f"  return (%y)\n}}\n"), PIPELINE)


def _kernel_sources(m: Module) -> list[str]:
    return [k.source for k in m.kernels.values() if "extern \"C\" void ember_k_" in k.source]


def test_column_reduction_chunks_are_outer_times_blocks() -> None:
    m = _module("  %y = aten.mean.dim(%x, [1, 2]) : f32[2, 2048]", "f32[2, 7, 7, 2048]",
                "f32[2, 2048]")
    (src,) = _kernel_sources(m)
    (nest,) = par.kernel_nests(src)
    assert nest.kind == "for" and nest.trips == [2, 16] and nest.chunks == 32
    frac, eff = par.scale([nest], par.kernel_work(src), 16)
    assert math.isclose(frac, 2 / 32) and eff == 16


def test_split_reduction_region_and_serial_kernel() -> None:
    big = _module("  %y = aten.sum.default(%x) : f32[]", "f32[64, 4096]", "f32[]")
    (src,) = _kernel_sources(big)
    nests = par.kernel_nests(src)
    assert [n.kind for n in nests] == ["region"] and nests[0].chunks == 64
    small = _module("  %y = aten.relu.default(%x) : f32[8, 16]", "f32[8, 16]", "f32[8, 16]")
    (src,) = _kernel_sources(small)
    assert par.kernel_nests(src) == [] and par.kernel_work(src) == 128
    assert par.scale([], 128, 16) == (1.0, 1)


def test_a_nest_inside_serial_loops_counts_each_iteration() -> None:
    """The row split (compiled for 16 threads): two rows on one thread, each row's sum split
    over the threads in a region inside the row loop. The region's work is counted once per
    row: the kernel estimated to scale (it was booked half serial)."""
    before = torch.get_num_threads()
    torch.set_num_threads(16)
    try:
        m = _module("  %y = aten.sum.dim_IntList(%x, [1, 2]) : f32[2]", "f32[2, 200, 300]",
                    "f32[2]")
    finally:
        torch.set_num_threads(before)
    (src,) = _kernel_sources(m)
    nests = par.kernel_nests(src)
    assert [n.kind for n in nests] == ["region"] and nests[0].chunks == 200  # runs of r0
    work = par.kernel_work(src)  # (a loop over a thread's run counts 1: bounds unstated)
    assert sum(n.work for n in nests) == work == 2
    frac, _ = par.scale(nests, work, 16)
    assert math.isclose(frac, math.ceil(200 / 16) / 200)


def test_timed_wrapper_matches_and_times_every_line() -> None:
    m = _module("  %r = aten.relu.default(%x) : f32[64, 256]\n"
                "  %y = aten.mul.Tensor(%r, %x) : f32[64, 256]", "f32[64, 256]", "f32[64, 256]")
    w = generate(m, "f")
    g, stmts = par.instrument(w.source, w.call.__globals__)
    x = torch.randn(64, 256)
    got = g["call"]([x]).outputs[0]
    torch.testing.assert_close(got, torch.relu(x) * x)
    assert len(g["_acc"]) == len(stmts) and all(v >= 0 for v in g["_acc"])
    kinds = {par.classify(s, w.call.__globals__, {k.name: k.source for k in
                                                  m.kernels.values()})[0] for s in stmts}
    assert "kernel" in kinds and "wrapper" in kinds


def test_measure_times_on_packs_made_at_the_target_thread_count() -> None:
    """oneDNN's weight layout depends on the thread count: `repack_at` drops the 1-thread packs
    and makes each at the target count before --measure's timing, and the report says so."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 16, 1)).eval()
    x = torch.randn(2, 8, 12, 12)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        f = ember_compile(net)
        with torch.no_grad():
            torch.testing.assert_close(f(x), net(x))
        weights = [net[0].weight, net[2].weight]
        assert all(packed.is_cached(w) for w in weights)
        one = {id(w): dict(packed._PACKS[id(w)].entries) for w in weights}
        assert all(k[-1] == 1 for e in one.values() for k in e)
        packs = par.repack_at(f, (x,), 2)
        assert torch.get_num_threads() == 2
        assert packs == {2: 2}  # each weight's pack made again at 2 threads, none at 1
        for w in weights:
            assert [k[-1] for k in packed._PACKS[id(w)].entries] == [2]
        with torch.no_grad():
            torch.testing.assert_close(f(x), net(x))
    finally:
        torch.set_num_threads(before)
    assert "all made at 2 threads" in par._packs_note({"measured_packs": {"2": 2}}, 2)
    assert "WARNING" in par._packs_note({"measured_packs": {"1": 2, "2": 2}}, 2)
    assert par._packs_note({"measured_packs": None}, 2) == ""


def test_a_compound_statement_is_timed_as_one_line() -> None:
    src = ("def call(inputs):\n    a = inputs[0]\n    if a > 0:\n        b = a * 2\n"
           "        b += 1\n    else:\n        b = -a\n    c = (b +\n         1)\n"
           "    return c\n")
    g, stmts = par.instrument(src, {})
    assert len(stmts) == 3 and stmts[1].startswith("    if a > 0:") and "else:" in stmts[1]
    assert g["call"]([3]) == 8 and g["call"]([-2]) == 3
    assert par.classify(stmts[1], {}, {}) == ("wrapper", "check")
