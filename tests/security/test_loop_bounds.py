"""Issue 19 #3: loop IR never addresses memory outside a buffer.

A `loop.load`'s index is text over loop variables; the generated C++ reads at exactly that
index without a check. The verifier now proves every index of every load reachable from a
kernel inside its buffer (interval arithmetic over the loop extents, `ember.inductor.bounds`),
and that every variable an index uses is bound by an enclosing loop. `ember run --backend
inductor` and `ember opt --verify-each` refuse a module that fails the proof with one line
(before, a large offset segfaulted and a small one returned memory past the buffer).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the loop dialect, the passes and the backend)
from ember.inductor.bounds import index_violation
from ember.ir import parse
from ember.ir.expr import FloorDiv, PyMod, evaluate, value_range
from ember.ir.passes import run_pipeline
from ember.ir.verifier import check
from ember.runtime import cli

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "decompose{keep_attention=true},cse,dce,lower-loops,fuse,codegen-cpp,plan-buffers"


def module(index: list[str], *, shape: str = "4", ranges: str = "4", reduce: str | None = None,
           symbols: str = "") -> str:
    """One kernel reading %x at `index` over `ranges` (and `reduce_ranges`)."""
    out = f"[{ranges}]"
    kernel = (f'loop.reduction(@k, %x, ranges=[{ranges}], reduce_ranges=[{reduce}], '
              f'reduction="sum")' if reduce is not None else
              f"loop.pointwise(@k, %x, ranges=[{ranges}])")
    idx = ", ".join(f'"{s}"' for s in index)
    return (f"ember.ir 1.0\n\n{symbols}"
            f"graph @main(%x: f32[{shape}]) -> (f32{out}) {{\n"
            f"  %y = {kernel} : f32{out}\n  return (%y)\n}}\n\n"
            f"graph @k(%x: f32[{shape}]) -> (f32[]) {{\n"
            f"  %v = loop.load(%x, index=[{idx}]) : f32[]\n  return (%v)\n}}\n")


def errors(text: str) -> list[str]:
    return [str(e) for e in check(parse(text))]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(argv)
    return rc, capsys.readouterr().err


# ---- the issue's reproducers ---------------------------------------------------------------

@pytest.mark.parametrize("offset", ["2", "100000000000"])
def test_out_of_range_load_is_refused_by_run_and_opt(offset: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "oob.ir"
    f.write_text(module([f"i0 + {offset}"]))
    runs = [["opt", str(f), "-p", PIPELINE, "--verify-each"]]
    if offset == "2":  # the large one crashed the process: run only in a child (below)
        runs.append(["run", str(f), "--random", "--backend", "inductor"])
    for argv in runs:
        rc, err = run_cli(argv, capsys)
        assert rc == 1
        assert len(err.strip().splitlines()) == 1, err
        # the op, the index, the dim, the proven range and the buffer's size
        assert "loop.load(%x)" in err and f"'i0 + {offset}'" in err and "dim 0" in err
        assert f"[{offset}, {int(offset) + 3}]" in err and "size 4" in err


def test_large_offset_does_not_crash_the_process(tmp_path: Path) -> None:
    """The original segfault (rc 139), in a real process."""
    f = tmp_path / "oob.ir"
    f.write_text(module(["i0 + 100000000000"]))
    p = subprocess.run([sys.executable, "-c", "import sys; from ember.runtime.cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "run", str(f), "--random", "--backend",
                        "inductor"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "may read outside its buffer" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_undefined_index_variable_is_named(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The fused-dump edit from the issue: `index=["i7", "i1 * 100"]` passed --verify-each."""
    f = tmp_path / "undef.ir"
    f.write_text(module(["i7", "i1 * 100"], shape="4, 8", ranges="4, 8"))
    rc, err = run_cli(["opt", str(f), "-p", "codegen-cpp", "--verify-each"], capsys)
    assert rc == 1 and "i7" in err and "no enclosing loop binds" in err
    f.write_text(module(["i0", "i1 * 100"], shape="4, 8", ranges="4, 8"))
    rc, err = run_cli(["opt", str(f), "-p", "codegen-cpp", "--verify-each"], capsys)
    assert rc == 1 and "'i1 * 100' of dim 1 ranges over [0, 700]" in err and "size 8" in err


def test_reduction_variables_are_bound_only_inside_reductions() -> None:
    assert errors(module(["r0"], shape="8", ranges="", reduce="8")) == []
    assert "r0, which no enclosing loop binds" in errors(module(["r0"], shape="8", ranges="8"))[0]
    assert "size 8" in errors(module(["r0 + 1"], shape="8", ranges="", reduce="8"))[0]
    assert "undeclared size symbol s3" in errors(module(["s3"], shape="8", ranges="8"))[0]


def test_loop_index_variables_must_be_bound() -> None:
    text = module(["i0"]).replace('%v = loop.load(%x, index=["i0"]) : f32[]',
                                  '%i = loop.index(index="i0 + r2") : i64[]\n'
                                  '  %v = loop.load(%x, index=["i0"]) : f32[]')
    assert "r2, which no enclosing loop binds" in errors(text)[0]


def test_out_of_range_store_is_refused() -> None:
    """Loop IR has no store at an index: a kernel writes its output at its own `ranges`, and the
    type rule ties those to the output's declared type (the buffer the wrapper allocates)."""
    text = module(["i0"], shape="8", ranges="8").replace("-> (f32[8])", "-> (f32[4])") \
        .replace("ranges=[8]) : f32[8]", "ranges=[8]) : f32[4]")
    errs = errors(text)
    assert errs and "type rule gives f32[8]" in errs[0]


def test_empty_loops_read_nothing() -> None:
    assert errors(module(["i0 + 100"], ranges="0")) == []
    assert "size 0" in errors(module(["i0"], shape="0", ranges="3"))[0]


def test_intermediate_overflow_is_refused() -> None:
    """In range mathematically, but the C++ computes `i0 * 2**62` in int64 (wraps)."""
    errs = errors(module([f"(i0 * {2**62}) // {2**62}"]))
    assert errs and "overflows int64" in errs[0]
    assert errors(module([f"(i0 * {2**40}) // {2**40}"])) == []


def test_hostile_index_text_gets_a_short_clear_error() -> None:
    """Integers beyond int64 (Python would read 5000 digits only to fail) and huge sums."""
    for text in ["i0 + " + "1" * 5000, " + ".join(["i0"] * 5000)]:
        errs = errors(module([text]))
        assert errs and len(errs[0]) < 300 and "\n" not in errs[0]
        assert "does not fit in 64 bits" in errs[0] or "longer than" in errs[0]


def test_fused_reductions_are_checked_with_their_extents() -> None:
    base = """ember.ir 1.0

graph @main(%x: f32[4, 8]) -> (f32[4]) {
  %y = loop.pointwise(@k, %x, ranges=[4]) : f32[4]
  return (%y)
}

graph @k(%x: f32[4, 8]) -> (f32[]) {
  %s = loop.reduce(@k_sum, %x, ranges=[4], reduce_ranges=[RED], reduction="sum") : f32[]
  return (%s)
}

graph @k_sum(%x: f32[4, 8]) -> (f32[]) {
  %v = loop.load(%x, index=["i0", "r0"]) : f32[]
  return (%v)
}
"""
    assert errors(base.replace("RED", "8")) == []
    err = errors(base.replace("RED", "9"))[0]
    assert "@k_sum" in err and "'r0' of dim 1 ranges over [0, 8]" in err
    cyclic = base.replace("RED", "8").replace("loop.reduce(@k_sum", "loop.reduce(@k") \
        .replace("graph @k(%x", "graph @k2(%y: f32[4, 8], %x")
    cyclic = cyclic.replace("loop.pointwise(@k, %x", "loop.pointwise(@k2, %x, %x")
    cyclic = cyclic.replace("loop.reduce(@k, %x", "loop.reduce(@k2, %x, %x")
    assert any("nested in itself" in e for e in errors(cyclic))


def test_symbolic_sizes_are_proved_against_the_symbols() -> None:
    sym = "symbol s0 hint=8 min=1\n\n"
    assert errors(module(["i0"], shape="s0", ranges="s0", symbols=sym)) == []
    assert errors(module(["s0 - 1 - i0"], shape="s0", ranges="s0", symbols=sym)) == []
    assert errors(module(["mod(i0, s0)"], shape="s0", ranges="s0 * 3", symbols=sym)) == []
    assert errors(module(["i0 // 3"], shape="s0", ranges="s0 * 3", symbols=sym)) == []
    assert "s0" in errors(module(["i0 + 1"], shape="s0", ranges="s0", symbols=sym))[0]
    # 3 < s0 only when s0 >= 4: with min=1 the load may leave the buffer
    assert errors(module(["3"], shape="s0", ranges="s0", symbols=sym))
    assert errors(module(["3"], shape="s0", ranges="s0",
                         symbols="symbol s0 hint=8 min=4\n\n")) == []


def test_views_with_symbolic_sizes_are_checked() -> None:
    text = """ember.ir 1.0

symbol s0 hint=4 min=1

graph @main(%x: f32[s0, 8]) -> (f32[8, s0]) {
  %v = loop.extern(%x, op="loop.view", index=[IDX], shape=[8, s0]) : f32[8, s0]
  return (%v)
}
"""
    assert errors(text.replace("IDX", '"i1", "i0"')) == []
    err = errors(text.replace("IDX", '"i1 + 1", "i0"'))[0]
    assert "loop.view" in err and "dim 0" in err


# ---- the proof against brute force ---------------------------------------------------------

VARS = st.sampled_from(["i0", "i1", "r0"])
affine = st.tuples(st.integers(-4, 6), st.lists(st.tuples(st.integers(-3, 3), VARS),
                                                max_size=3))


def _text(a: tuple[int, list[tuple[int, str]]]) -> str:
    return " + ".join([str(a[0])] + [f"{c} * {v}" for c, v in a[1]])


def _value(a: tuple[int, list[tuple[int, str]]], env: dict[str, int]) -> int:
    return a[0] + sum(c * env[v] for c, v in a[1])


def _points(ranges: list[int], red: list[int]) -> list[dict[str, int]]:
    names = [f"i{k}" for k in range(len(ranges))] + [f"r{k}" for k in range(len(red))]
    return [dict(zip(names, p, strict=True))
            for p in itertools.product(*[range(n) for n in ranges + red])]


@settings(max_examples=150, deadline=None)
@given(ranges=st.lists(st.integers(0, 3), min_size=2, max_size=2),
       red=st.lists(st.integers(0, 3), min_size=1, max_size=1),
       shape=st.lists(st.integers(0, 5), min_size=1, max_size=2), data=st.data())
def test_affine_indices_accepted_exactly_when_in_bounds(ranges: list[int], red: list[int],
                                                        shape: list[int],
                                                        data: st.DataObject) -> None:
    index = [data.draw(affine) for _ in shape]
    text = module([_text(a) for a in index], shape=", ".join(map(str, shape)),
                  ranges=", ".join(map(str, ranges)), reduce=", ".join(map(str, red)))
    inside = all(0 <= _value(a, p) < n for p in _points(ranges, red)
                 for a, n in zip(index, shape, strict=True))
    assert (errors(text) == []) == inside, text


# general index trees (// mod min max by positive constants): an accepted index never leaves
Tree = object
leaf = st.one_of(st.integers(-3, 6), st.sampled_from(["i0", "i1"]))


def _node(children: st.SearchStrategy[Tree]) -> st.SearchStrategy[Tree]:
    return st.one_of(st.tuples(st.sampled_from(["+", "-", "*"]), children, children),
                     st.tuples(st.sampled_from(["//", "mod"]), children, st.integers(1, 5)),
                     st.tuples(st.sampled_from(["min", "max"]), children, children))


trees = st.recursive(leaf, _node, max_leaves=6)


def _render(t: Tree) -> str:
    if isinstance(t, int):
        return f"({t})"
    if isinstance(t, str):
        return t
    assert isinstance(t, tuple)
    op, a, b = t
    if op in ("mod", "min", "max"):
        return f"{op}({_render(a)}, {_render(b)})"
    return f"({_render(a)} {op} {_render(b)})"


def _eval(t: Tree, env: dict[str, int]) -> int:
    if isinstance(t, int):
        return t
    if isinstance(t, str):
        return env[t]
    assert isinstance(t, tuple)
    op, a, b = t
    x, y = _eval(a, env), _eval(b, env)
    return {"+": x + y, "-": x - y, "*": x * y, "//": x // y if y else 0,
            "mod": x % y if y else 0, "min": min(x, y), "max": max(x, y)}[op]


@settings(max_examples=150, deadline=None)
@given(t=trees, ranges=st.lists(st.integers(1, 4), min_size=2, max_size=2),
       size=st.integers(1, 12))
def test_accepted_indices_stay_inside(t: Tree, ranges: list[int], size: int) -> None:
    text = _render(t)
    why = index_violation(text, size, {"i0": ranges[0], "i1": ranges[1]}, {})
    values = [_eval(t, p) for p in _points(ranges, [])]
    inside = all(0 <= v < size for v in values)
    if why is None:
        assert inside, text
    if not isinstance(t, tuple):  # a constant or one variable: the proof is exact
        assert (why is None) == inside, text


ops = st.sampled_from(["+", "-", "*", "//", "mod", "min", "max"])


@settings(max_examples=200, deadline=None)
@given(a=st.tuples(st.integers(-6, 6), st.integers(0, 5)),
       b=st.tuples(st.integers(-6, 6), st.integers(0, 5)), op=ops)
def test_value_range_contains_every_value(a: tuple[int, int], b: tuple[int, int],
                                          op: str) -> None:
    """ember.ir.expr.value_range over intervals of either sign (negative divisors too)."""
    x, y = sympy.Symbol("x", integer=True), sympy.Symbol("y", integer=True)
    e = {"+": x + y, "-": x - y, "*": x * y, "//": FloorDiv(x, y), "mod": PyMod(x, y),
         "min": sympy.Min(x, y), "max": sympy.Max(x, y)}[op]
    env = {"x": (a[0], a[0] + a[1]), "y": (b[0], b[0] + b[1])}
    r = value_range(e, env)
    pairs = itertools.product(range(env["x"][0], env["x"][1] + 1),
                              range(env["y"][0], env["y"][1] + 1))
    if op in ("//", "mod") and env["y"][0] <= 0 <= env["y"][1]:
        assert r is None  # the divisor may be 0
        return
    assert r is not None
    for vx, vy in pairs:
        v = evaluate(e, {"x": vx, "y": vy})
        assert r[0] <= v <= r[1], (op, env, vx, vy, v, r)


# ---- no false positives on the compiler's own output ---------------------------------------

REPRESENTATIVE = """ember.ir 1.0

graph @rep(%x: f32[3, 5], %y: f32[3, 2], %z: f32[0, 5]) -> (f32[3, 5], f32[3, 7], f32[5, 9], f32[3, 5], f32[5], f32[3, 5], f32[15], f32[3, 5]) {
  %sm = aten._softmax.default(%x, 1, false) : f32[3, 5]
  %c = aten.cat.default([%x, %y], 1) : f32[3, 7]
  %t = aten.permute.default(%x, [1, 0]) : f32[5, 3]
  %p = aten.constant_pad_nd.default(%t, [2, 4, 0, 0], 0.0) : f32[5, 9]
  %f = aten.flip.default(%x, [0, 1]) : f32[3, 5]
  %s = aten.sum.dim_IntList(%x, [0]) : f32[5]
  %e = aten.cat.default([%z, %x], 0) : f32[3, 5]
  %r = aten.reshape.default(%f, [15]) : f32[15]
  %ln, %m, %v = aten.native_layer_norm.default(%x, [5], none, none, 1e-5) : (f32[3, 5], f32[3, 1], f32[3, 1])
  return (%sm, %c, %p, %f, %s, %e, %r, %ln)
}
"""


@pytest.mark.parametrize("name,pipeline", [
    ("representative", PIPELINE),
    ("convnet.ir", PIPELINE),
    ("indexing.ir", PIPELINE),
    ("attention.ir", "decompose,cse,dce,lower-loops,fuse"),  # symbolic sizes
])
def test_compiler_output_verifies(name: str, pipeline: str) -> None:
    text = REPRESENTATIVE if name == "representative" else \
        (ROOT / "tests" / "ir_corpus" / name).read_text()
    out = run_pipeline(parse(text), pipeline, verify_each=True)
    loads = [n for g in out.graphs.values() for n in g.nodes if n.op == "loop.load"]
    assert loads or out.kernels, "the pipeline produced no loop kernel to check"
    assert check(out) == []

