"""Compile time on large graphs (issue 18 #5): the index arithmetic never goes through sympy's
costly Max/Min evaluation, horizontal fusion finds its pair without a path search per pair, and
the C++ of a module is split into translation units of balanced size, built by concurrent g++
processes, the longest first. Each result is checked against what the slow way computes."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor import fusion
from ember.inductor.body import body_size
from ember.inductor.indexing import substitute
from ember.inductor.targets.cpu import cache, codegen
from ember.ir import Graph, Interpreter, Kernel, Module, parse, print_module
from ember.ir.expr import evaluate, max_dim, min_dim, substitute_dims, symbol

I0, I1, I2 = symbol("i0"), symbol("i1"), symbol("i2")


@pytest.fixture
def no_sympy_minmax_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any evaluated sympy Max/Min construction (the slow path: `evaluate=False` skips
    it)."""
    def refuse(cls: Any, args: Any, **kw: Any) -> Any:
        raise AssertionError(f"sympy evaluated {cls.__name__}{tuple(args)}")
    for cls in (sympy.Max, sympy.Min):
        monkeypatch.setattr(cls, "_collapse_arguments", classmethod(refuse))


# ---- cheap max/min and substitution ------------------------------------------------------------

terms = st.builds(lambda c, v, k: c * v + k, st.integers(-3, 3), st.sampled_from([I0, I1, I2]),
                  st.integers(-40, 40))
values = st.fixed_dictionaries({"i0": st.integers(0, 50), "i1": st.integers(0, 50),
                                "i2": st.integers(0, 50)})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(terms, st.integers(-40, 40)), min_size=1, max_size=4), values)
def test_max_min_dim_are_max_and_min(args: list[Any], env: dict[str, int]) -> None:
    want = [evaluate(a, env) for a in args]
    assert evaluate(max_dim(*args), env) == max(want)
    assert evaluate(min_dim(*args), env) == min(want)
    # nested: flattened, still the same value
    assert evaluate(max_dim(min_dim(*args), *args), env) == max(want)


def test_max_min_dim_fold_what_intervals_prove(no_sympy_minmax_eval: None) -> None:
    assert max_dim(I0, 0) == I0  # loop variables are never negative
    assert max_dim(I0 + 1, I0) == I0 + 1
    assert min_dim(3, 5, 9) == 3
    assert max_dim(max_dim(I0, I1), 2) == sympy.Max(I0, I1, 2, evaluate=False)
    kept = min_dim(max_dim(I1 - 64, 0), 31)
    assert isinstance(kept, sympy.Min)
    assert kept == sympy.Min(sympy.Max(I1 - 64, 0, evaluate=False), 31, evaluate=False)


def test_substitute_rebuilds_max_without_sympy_evaluation(no_sympy_minmax_eval: None) -> None:
    e = min_dim(max_dim(I1 - 64, 0), 31) + 32 * I0
    assert substitute(e, {I1: I2 + 64}) == sympy.Min(I2, 31, evaluate=False) + 32 * I0
    assert substitute(e, {I1: 10, I0: 1}) == 32
    assert substitute_dims(e, {}) is e


def test_lowering_and_fusing_a_wide_concat_never_evaluates_sympy_max(
        no_sympy_minmax_eval: None) -> None:
    """A DenseNet-like concatenation of many pieces, each read through a clamped index, fused
    into its reader: every clamp is built and substituted by ember's own max/min."""
    n = 12
    params = ", ".join(f"%x{k}: f32[2, 4, 3]" for k in range(n))
    src = (f"ember.ir 1.0\n\ngraph @f({params}) -> (f32[2, {4 * n}, 3]) {{\n"
           + "".join(f"  %e{k} = prims.exp(%x{k}) : f32[2, 4, 3]\n" for k in range(n))
           + f"  %c = prims.concatenate([{', '.join(f'%e{k}' for k in range(n))}], dim=1)"
           f" : f32[2, {4 * n}, 3]\n"
           f"  %r = prims.neg(%c) : f32[2, {4 * n}, 3]\n  return (%r)\n}}\n")
    from ember.ir.passes import run_pipeline
    fused = run_pipeline(run_pipeline(parse(src), "lower-loops"), "fuse{max_nodes=1000}")
    assert sum(1 for nd in fused.graphs["f"].nodes if nd.op.startswith("loop.")) == 1
    xs = [torch.randn(2, 4, 3) for _ in range(n)]
    got = Interpreter(fused).run(xs, "f").outputs[0]
    torch.testing.assert_close(got, -torch.cat([x.exp() for x in xs], dim=1))


# ---- horizontal fusion ----------------------------------------------------------------------

def _reference_horizontal(m: Module, g: Graph, max_nodes: int, taken: set[str]) -> int | None:
    """The old pairwise scan: a path search per pair of kernels (then resume from the top)."""
    dg = fusion.dependency_graph(g)
    kernels = [i for i, nd in enumerate(g.nodes) if nd.op in fusion.KERNEL_OPS]
    for a in kernels:
        for b in kernels:
            if b <= a:
                continue
            na, nb = g.nodes[a], g.nodes[b]
            if na.kwargs["ranges"] != nb.kwargs["ranges"]:
                continue
            if not set(na.operands()) & set(nb.operands()):
                continue
            if fusion.nx.has_path(dg, a, b) or fusion.nx.has_path(dg, b, a):
                continue
            if body_size(fusion._body(m, na)) + body_size(fusion._body(m, nb)) > max_nodes:
                continue
            if fusion.target_veto(m, g, na, nb) is not None:
                continue
            fusion._merge(m, g, a, b, dg, taken)
            return 0
    return None


S = "f32[4, 6]"


@st.composite
def sibling_graphs(draw: st.DrawFn) -> str:
    """Pointwise ops and row reductions over x, y, many reading the same values (horizontal
    fusion candidates), some of them outputs."""
    vals = ["%x", "%y"]
    lines: list[str] = []
    for k in range(draw(st.integers(2, 12))):
        a = draw(st.sampled_from(vals))
        v = f"%v{k}"
        kind = draw(st.sampled_from(["unary", "binary", "reduce"]))
        if kind == "unary":
            lines.append(f"  {v} = prims.{draw(st.sampled_from(['exp', 'neg']))}({a}) : {S}")
        elif kind == "binary":
            b = draw(st.sampled_from(vals))
            lines.append(f"  {v} = prims.{draw(st.sampled_from(['add', 'mul']))}({a}, {b})"
                         f" : {S}")
        else:
            lines += [f"  {v}r = prims.sum({a}, dims=[1]) : f32[4]",
                      f"  {v}u = prims.unsqueeze({v}r, dims=[1]) : f32[4, 1]",
                      f"  {v} = prims.broadcast_in_dim({v}u, shape=[4, 6], "
                      f"broadcast_dims=[0, 1]) : {S}"]
        vals.append(v)
    outs = [v for v in vals[2:] if draw(st.booleans())] or [vals[-1]]
    return ("ember.ir 1.0\n\ngraph @f(%x: f32[4, 6], %y: f32[4, 6]) -> ("
            + ", ".join([S] * len(outs)) + ") {\n" + "\n".join(lines)
            + f"\n  return ({', '.join(outs)})\n}}\n")


def _fuse(src: str, max_nodes: int) -> str:
    from ember.ir.passes import run_pipeline
    m = run_pipeline(parse(src), "lower-loops")
    return print_module(run_pipeline(m, f"fuse{{max_nodes={max_nodes}}}"))


@settings(max_examples=40, deadline=None)
@given(sibling_graphs(), st.sampled_from([8, 64]))
def test_horizontal_merges_what_the_pairwise_scan_merges(src: str, max_nodes: int) -> None:
    got = _fuse(src, max_nodes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fusion, "_horizontal", _reference_horizontal)
        want = _fuse(src, max_nodes)
    assert got == want
    xs = [torch.randn(4, 6), torch.randn(4, 6)]
    ref = Interpreter(parse(src)).run(xs, "f").outputs
    torch.testing.assert_close(Interpreter(parse(got)).run(xs, "f").outputs, ref)


def test_horizontal_searches_no_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 siblings reading x: merged in pairs without one path search."""
    lines = [f"  %v{k} = prims.{'exp' if k % 2 else 'neg'}(%x) : {S}" for k in range(40)]
    outs = ", ".join(f"%v{k}" for k in range(40))
    src = ("ember.ir 1.0\n\ngraph @f(%x: f32[4, 6]) -> (" + ", ".join([S] * 40) + ") {\n"
           + "\n".join(lines) + f"\n  return ({outs})\n}}\n")

    def search(*a: object) -> bool:
        raise AssertionError("horizontal fusion searched for a path")
    monkeypatch.setattr(fusion.nx, "has_path", search)
    kernels = re.findall(r"= loop\.pointwise\(@f_k\d+", _fuse(src, 8))
    assert 1 < len(kernels) < 40  # merged up to the node cap


# ---- translation units and the parallel build ---------------------------------------------------

def _module(sizes: list[int]) -> tuple[Module, list[Kernel]]:
    blocks = [Kernel(codegen.PRELUDE_NAME, "cpp", "// prelude\n")]
    blocks += [Kernel(f"k{j}", "cpp", f"// k{j}\n" + "x" * n + "\n") for j, n in enumerate(sizes)]
    return Module({}, {}, "1.0"), blocks


def test_units_balance_source_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_COMPILE_JOBS", "4")
    sizes = [5000, 4000] + [100] * 60 + [3000, 2500, 2000] + [50] * 40
    m, blocks = _module(sizes)
    units = codegen.module_units(m, blocks)
    assert len(units) == 4
    assert all(u[0].name == codegen.PRELUDE_NAME for u in units)
    names = [k.name for u in units for k in u[1:]]
    assert sorted(names) == sorted(k.name for k in blocks[1:])  # each kernel exactly once
    for u in units:  # kept in module order within a unit
        assert [k.name for k in u[1:]] == [k.name for k in blocks if k in u[1:]]
    loads = [sum(len(k.source) for k in u[1:]) for u in units]
    assert max(loads) <= sum(loads) / 4 + max(sizes)  # LPT: within one kernel of the ideal
    assert max(loads) < 7000  # contiguous runs of equal count would put 11.5k in the first
    assert codegen.module_units(m, blocks) == units  # deterministic (the cache finds them)


def test_units_keep_a_floor_of_kernels_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_COMPILE_JOBS", "16")
    m, blocks = _module([10] * 13)
    assert len(codegen.module_units(m, blocks)) == 3  # ceil(13 / KERNELS_PER_UNIT=6)
    assert codegen.module_units(*_module([])) == []


def test_build_runs_jobs_compilers_at_once_longest_first(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_COMPILE_JOBS", "2")
    cache.compiler_id(), cache.has_libmvec(), cache.cpu_id()  # their own g++ calls, first
    lock = threading.Lock()
    live, peak, started = [0], [0], []

    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        src = Path(cmd[-3]).read_text()
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            started.append(len(src))
        time.sleep(0.05)
        Path(cmd[-1]).write_bytes(b"lib" + src.encode())
        with lock:
            live[0] -= 1
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(cache.subprocess, "run", fake_run)
    srcs = [f"// unit {k}\n" + "y" * n for k, n in enumerate([10, 300, 20, 200, 30])]
    paths = cache.build_all(srcs)
    assert peak[0] == 2
    assert set(started[:2]) == set(sorted(started)[-2:])  # the two longest go first
    assert [p.read_bytes() for p in paths] == [b"lib" + s.encode() for s in srcs]


def test_fuse_looks_the_target_up_once_per_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of 30 pointwise ops fuses into one kernel asking for the graph's devices (a
    scan of every value) once per scan, not once per candidate pair."""
    lines, prev = [], "%x"
    for k in range(30):
        lines.append(f"  %v{k} = prims.{'exp' if k % 2 else 'neg'}({prev}) : {S}")
        prev = f"%v{k}"
    src = ("ember.ir 1.0\n\ngraph @f(%x: f32[4, 6]) -> (f32[4, 6]) {\n" + "\n".join(lines)
           + f"\n  return ({prev})\n}}\n")
    calls = [0]
    real = fusion.graph_devices

    def counted(g: Graph) -> set[str]:
        calls[0] += 1
        return real(g)
    monkeypatch.setattr(fusion, "graph_devices", counted)
    text = _fuse(src, 1000)
    assert len(re.findall(r"= loop\.pointwise\(", text)) == 1
    # fuse's own lookup (its recompute setting) plus one per scan (vertical, rule 5's, the
    # horizontal merge): a count that does not grow with the chain, where per pair it would be ~30
    assert calls[0] <= 5
