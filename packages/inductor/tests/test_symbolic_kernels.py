"""Symbolic sizes compile to C++ (issue 17 #3): a graph over `s0`, `s1` becomes kernels that take
the symbols as int64 arguments and a generated call that binds them from the inputs' shapes, so
one library serves every size in the symbols' ranges.

Checked against eager (the aten graph run by the interpreter, or the torch function) at sizes
that make the vectorised loops do zero iterations (0, 1), leave SIMD tails (17, 1023, 4097),
cross the block size of the float sums (4097 > 4096) and start the OpenMP threads (work above
PARALLEL_WORK); nothing falls back to the reference interpreter, and no size compiles again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.backend import compile_module, compiled_runner, summary
from ember.inductor.targets.cpu import cache
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, Module, parse

SYMS = "symbol s0 hint={h0} min=0\nsymbol s1 hint={h1} min=0\n\n"

# aten graphs over two symbolic dims; each exercises one loop form of cppkernel.py
GRAPHS: dict[str, str] = {
    # 1-d pointwise: `parallel for simd` with a per-call `if`
    "pointwise": """graph @pointwise(%x: f32[s0, s1], %b: f32[s1]) -> (f32[s0, s1]) {
  %e = aten.exp.default(%x) : f32[s0, s1]
  %y = aten.add.Tensor(%e, %b) : f32[s0, s1]
  %z = aten.mul.Scalar(%y, 2.0) : f32[s0, s1]
  return (%z)
}""",
    # softmax over a symbolic row (the rescale plan), and layernorm's mean/var (size operands)
    "softmax_norm": """graph @softmax_norm(%x: f32[s0, s1]) -> (f32[s0, s1], f32[s0, s1]) {
  %y = aten._softmax.default(%x, -1, false) : f32[s0, s1]
  %mu = aten.mean.dim(%x, [1], keepdim=true) : f32[s0, 1]
  %c = aten.sub.Tensor(%x, %mu) : f32[s0, s1]
  %v = aten.var.correction(%x, [1], correction=0, keepdim=true) : f32[s0, 1]
  %e = aten.add.Scalar(%v, 1e-05) : f32[s0, 1]
  %r = aten.rsqrt.default(%e) : f32[s0, 1]
  %n = aten.mul.Tensor(%c, %r) : f32[s0, s1]
  return (%y, %n)
}""",
    # full reductions (split over threads: one and two reduced loops), an outer reduction
    # (column blocks at run time), prod/argmax (scalar accumulators)
    "reductions": """graph @reductions(%x: f32[s0, s1], %f: f32[s1]) -> (f32[], f32[], f32[s1], f32[s1], f32[s0], i64[s0]) {
  %all = aten.sum.default(%x) : f32[]
  %flat = aten.amax.default(%f, [0]) : f32[]
  %cols = aten.sum.dim_IntList(%x, [0]) : f32[s1]
  %cmax = aten.amax.default(%x, [0]) : f32[s1]
  %p = aten.prod.dim_int(%x, 1) : f32[s0]
  %i = aten.argmax.default(%x, 1) : i64[s0]
  return (%all, %flat, %cols, %cmax, %p, %i)
}""",
    # a compound size (the flattened view), integer floor division and modulo of negatives
    "views_ints": """graph @views_ints(%x: f32[s0, s1], %k: i64[s0, s1]) -> (f32[s0 * s1], i64[s0, s1], f32[s1, s0]) {
  %v = aten.view.default(%x, [s0 * s1]) : f32[s0 * s1]
  %w = aten.mul.Scalar(%v, 3.0) : f32[s0 * s1]
  %q = aten.floor_divide.default(%k, -3) : i64[s0, s1]
  %m = aten.remainder.Scalar(%q, 5) : i64[s0, s1]
  %t = aten.t.default(%x) : f32[s1, s0]
  %tc = aten.clone.default(%t) : f32[s1, s0]
  return (%w, %m, %tc)
}""",
}

# (s0, s1): empty and one-element loops, SIMD tails, a float sum over more than one block,
# work large enough for the threads
SIZES = [(0, 3), (3, 0), (1, 1), (2, 17), (7, 1023), (1, 4097), (4097, 3), (300, 130)]


def _module(name: str, h0: int = 8, h1: int = 16) -> str:
    return "ember.ir 1.0\n\n" + SYMS.format(h0=h0, h1=h1) + GRAPHS[name] + "\n"


def _inputs(m: Module, name: str, s0: int, s1: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in m.graph(name).params:
        shape = p.type.concrete_shape({"s0": s0, "s1": s1})  # type: ignore[union-attr]
        if p.type.dtype.is_floating:  # type: ignore[union-attr]
            out.append(torch.randn(shape, generator=g))
        else:
            out.append(torch.randint(-50, 50, shape, generator=g))
    return out


def _builds() -> int:
    """Libraries built or looked up (g++ runs, cache reads): constant over a size sweep."""
    return cache.STATS.builds + cache.STATS.hits + len(cache._LOADED)


def _close(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4, equal_nan=True)


def _same_as_eager(run: Any, src: Module, name: str, ins: list[torch.Tensor]) -> None:
    """The compiled call gives eager's outputs, or raises eager's exception (amax over an
    empty dim: IndexError)."""
    try:
        want = Interpreter(src).run(ins, name).outputs
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            run(name, ins)
        return
    _close(run(name, ins).outputs, want)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_symbolic_graph_compiles_to_cpp_for_every_size(name: str) -> None:
    src = parse(_module(name))
    compiled = compile_module(src)
    text = summary(compiled)
    assert "reference interpreter" not in text and "C++ kernel" in text, text
    assert "cpp_fallback" not in str(compiled)
    w = generate(compiled, name)  # the generated call covers it (no interpreter)
    assert "s0 = " in w.source
    run = compiled_runner(compiled, src)
    run(name, _inputs(src, name, 2, 2))
    before = _builds()
    for s0, s1 in SIZES:
        _same_as_eager(run, src, name, _inputs(src, name, s0, s1))
    assert _builds() == before  # one library for every size


def test_kernel_source_does_not_depend_on_the_hints() -> None:
    """The hints guide schedule decisions only: kernels compiled at other hints are the same
    C++ (the same cache key, one library); every size reaches the kernel as an argument."""
    for name in GRAPHS:
        a = compile_module(parse(_module(name, 8, 16)))
        b = compile_module(parse(_module(name, 5, 3)))
        assert [k.source for k in a.kernels.values()] == [k.source for k in b.kernels.values()]
        for k in a.kernels.values():
            assert not re.search(r"\b(8|16)LL\b", k.source)


def test_static_graph_takes_no_size_arguments() -> None:
    text = _module("pointwise").replace("s0", "4").replace("s1", "6")
    text = "\n".join(x for x in text.splitlines() if not x.startswith("symbol"))
    compiled = compile_module(parse(text))
    assert "int64_t s" not in "".join(k.source for k in compiled.kernels.values())
    assert "sizes=" not in str(compiled)


def test_size_outside_the_declared_range_is_refused() -> None:
    src = parse(_module("pointwise").replace("s0 hint=8 min=0", "s0 hint=8 min=2 max=9"))
    run = compiled_runner(compile_module(src), src)
    run("pointwise", _inputs(src, "pointwise", 9, 4))
    for n in (1, 10):
        with pytest.raises(RuntimeError, match=f"s0 is {n} .*range \\[2, 9\\]"):
            run("pointwise", _inputs(src, "pointwise", n, 4))


def test_plan_buffers_reuses_only_equal_size_expressions() -> None:
    """A dead buffer of s0 * s1 elements is reused for one of s1 * s0 (the same expression),
    never for one of s0 * s0 elements (equal only for some sizes)."""
    text = """ember.ir 1.0

symbol s0 hint=4 min=1
symbol s1 hint=4 min=1

graph @f(%x: f32[s0, s1], %w: f32[s1, s1], %v: f32[s1, s0]) -> (f32[s0, s0], f32[s1, s0]) {
  %a = aten.exp.default(%x) : f32[s0, s1]
  %m = aten.mm.default(%a, %w) : f32[s0, s1]
  %b = aten.sin.default(%m) : f32[s0, s1]
  %n = aten.mm.default(%b, %v) : f32[s0, s0]
  %c = aten.cos.default(%n) : f32[s0, s0]
  %t = aten.t.default(%m) : f32[s1, s0]
  %d = aten.mul.Tensor(%t, %v) : f32[s1, s0]
  return (%c, %d)
}
"""
    src = parse(text)
    compiled = compile_module(src)
    calls = {n.results[0].name: n for n in compiled.graph("f").nodes if n.op == "kernels.call"}
    by_shape = {str(n.kwargs["out_shapes"]): n for n in calls.values()}
    assert "reuse" not in by_shape["[[s0, s0]]"].kwargs, str(compiled)
    assert "reuse" in by_shape["[[s1, s0]]"].kwargs, str(compiled)
    run = compiled_runner(compiled, src)
    for s0, s1 in ((1, 5), (6, 2), (3, 3), (33, 17)):
        g = torch.Generator().manual_seed(s0)
        _same_as_eager(run, src, "f", [torch.randn(s0, s1, generator=g),
                                       torch.randn(s1, s1, generator=g),
                                       torch.randn(s1, s0, generator=g)])


# ---- random graphs: elementwise chains and a reduction over one symbolic dim ------------------

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "aten.exp.default": torch.exp, "aten.tanh.default": torch.tanh,
    "aten.neg.default": torch.neg, "aten.abs.default": torch.abs,
    "aten.relu.default": torch.relu, "aten.sigmoid.default": torch.sigmoid,
}
BINARY = ("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.maximum.default")
REDUCE = ("aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default", "aten.mean.dim")


@st.composite
def random_graphs(draw: st.DrawFn) -> tuple[str, int]:
    """An aten graph over x: f32[s0, C] and b: f32[C]: a chain of elementwise ops, one
    reduction over dim 0 (the symbolic one) or 1, then maybe one more elementwise op."""
    c = draw(st.integers(1, 9))
    lines = []
    cur, n = "%x", 0
    for _ in range(draw(st.integers(1, 4))):
        n += 1
        if draw(st.booleans()):
            op = draw(st.sampled_from(sorted(UNARY)))
            lines.append(f"  %v{n} = {op}({cur}) : f32[s0, {c}]")
        else:
            op = draw(st.sampled_from(BINARY))
            other = draw(st.sampled_from(["%b", "%x"]))
            lines.append(f"  %v{n} = {op}({cur}, {other}) : f32[s0, {c}]")
        cur = f"%v{n}"
    red = draw(st.sampled_from(REDUCE))
    dim = draw(st.sampled_from([0, 1]))
    keep = dim == 1 and draw(st.booleans())
    shape = ("s0, 1" if keep else "s0") if dim == 1 else f"{c}"
    kw = ", keepdim=true" if keep else ""
    lines.append(f"  %r = {red}({cur}, [{dim}]{kw}) : f32[{shape}]")
    out, out_shape = "%r", shape
    if draw(st.booleans()):
        lines.append(f"  %o = aten.exp.default(%r) : f32[{shape}]")
        out = "%o"
    text = (f"ember.ir 1.0\n\nsymbol s0 hint=8 min=1\n\ngraph @g(%x: f32[s0, {c}], "
            f"%b: f32[{c}]) -> (f32[{out_shape}], f32[s0, {c}]) {{\n" + "\n".join(lines)
            + f"\n  return ({out}, {cur})\n}}\n")
    return text, c


@settings(max_examples=6, deadline=None)
@given(graph=random_graphs(), sizes=st.lists(st.sampled_from([1, 2, 3, 5, 16, 17, 64, 1025]),
                                              min_size=1, max_size=4))
def test_random_symbolic_graphs_match_eager(graph: tuple[str, int], sizes: list[int]) -> None:
    text, c = graph
    src = parse(text)
    compiled = compile_module(src)
    assert "reference interpreter" not in summary(compiled)
    run = compiled_runner(compiled, src)
    for s0 in sizes:
        g = torch.Generator().manual_seed(s0)
        _same_as_eager(run, src, "g", [torch.randn(s0, c, generator=g),
                                       torch.randn(c, generator=g)])
