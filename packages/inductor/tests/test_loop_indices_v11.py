"""Loop indices in ir-v1.1: expressions over a body's declared domain, proved by the verifier
at the index's own line and column; ir-v1.0 loop text (STRING indices) still reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

import ember.inductor  # noqa: F401  (the loop dialect and passes)
from ember.ir import Kernel, Module, TensorType, VerificationError, parse, verify
from ember.ir.backends import default_backends
from ember.ir.passes import run_pipeline

LAYERS = Path(__file__).resolve().parents[3] / "tests" / "ir_corpus" / "layers"
PROGRAMS = sorted(p.name.split(".")[0] for p in LAYERS.glob("*.prims.ir"))


def _text(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.startswith("#"))


def _error_at(text: str) -> VerificationError:
    with pytest.raises(VerificationError) as e:
        verify(parse(text))
    return e.value


def _pos(text: str, needle: str) -> tuple[int, int]:
    i = text.index(needle)
    return text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_the_exploit_from_the_issue_is_a_verifier_error_at_the_index(version: str) -> None:
    """Issue 15: editing a fused dump to index=["i7", "i1 * 100"] passed --verify-each."""
    fused = _text(LAYERS / "bn_stats.fused.ir")  # ember's 1.0 fused text
    if version == "1.1":
        fused = str(run_pipeline(parse(_text(LAYERS / "bn_stats.prims.ir")),
                                 "lower-loops,fuse"))
        assert fused.startswith("ember.ir 1.1\n") and "domain(i0 < 16, i1 < 4)" in fused
        old, i7, i100 = "index=[i0, i1]", "index=[i7, i1]", "index=[i0, i1 * 100]"
    else:
        old, i7, i100 = 'index=["i0", "i1"]', 'index=["i7", "i1"]', 'index=["i0", "i1 * 100"]'
    verify(parse(fused))
    both = fused.replace(old, 'index=["i7", "i1 * 100"]' if version == "1.0"
                         else "index=[i7, i1 * 100]")
    e = _error_at(both)
    assert (e.line, e.col) == _pos(both, '"i7"' if version == "1.0" else "i7")
    assert "uses i7" in str(e)
    bad = fused.replace(old, i100)
    e = _error_at(bad)
    assert (e.line, e.col) == _pos(bad, '"i1 * 100"' if version == "1.0" else "i1 * 100")
    assert "ranges over [0, 300], but the buffer has size 4" in str(e)
    assert "uses i7" in str(_error_at(fused.replace(old, i7)))


BODY = """ember.ir 1.1

graph @main(%x: f32[6, 5]) -> (f32[4, 3]) {
  %y = loop.pointwise(@k, %x, ranges=[4, 3]) : f32[4, 3]
  return (%y)
}

graph @k(%x: f32[6, 5]) -> (f32[]) domain(i0 < 4, i1 < 3) {
  %v = loop.load(%x, index=[INDEX]) : f32[]
  return (%v)
}
"""
EXTENT = {"i0": 4, "i1": 3}
SIZE = (6, 5)


@st.composite
def _index(draw: st.DrawFn) -> tuple[str, bool]:
    """An affine index per dim (each variable once: interval arithmetic is exact) and whether
    it stays inside x: f32[6, 5] over i0 < 4, i1 < 3 with every variable bound."""
    texts, ok = [], True
    for d in range(2):
        var = draw(st.sampled_from(["i0", "i1", "r0", "i5"]))
        c, k = draw(st.integers(0, 3)), draw(st.integers(-3, 4))
        texts.append(f"{var} * {c} + {k}" if c else str(k))
        if c and var not in EXTENT:
            ok = False  # unbound (whatever its range)
            continue
        lo, hi = k, k + c * (EXTENT.get(var, 1) - 1)
        ok = ok and 0 <= lo and hi < SIZE[d]
    return ", ".join(texts), ok


@given(_index())
def test_random_index_edits_verify_exactly_when_in_bounds(case: tuple[str, bool]) -> None:
    index, ok = case
    text = BODY.replace("INDEX", index)
    if ok:
        verify(parse(text))
        return
    e = _error_at(text)
    line, col = _pos(text, index)
    assert e.line == line and col <= e.col < col + len(index)  # at the offending index
    assert "uses" in str(e) or "may read outside" in str(e)


@pytest.mark.parametrize("name", PROGRAMS)
def test_loop_modules_of_ir_v11_round_trip_and_verify(name: str) -> None:
    prims = parse(_text(LAYERS / f"{name}.prims.ir"))
    for stage in ("lower-loops", "lower-loops,fuse", "lower-loops,fuse,schedule-cpu"):
        text = str(run_pipeline(prims, stage, verify_each=True))
        assert text.startswith("ember.ir 1.1\n") and "domain(" in text
        assert not re.search(r'index=\["', text)  # indices are expressions, not strings
        m = parse(text)
        verify(m)
        assert str(m) == text


@pytest.mark.parametrize("name", PROGRAMS)
def test_v10_and_v11_fused_text_compile_to_the_same_results(name: str) -> None:
    """The stored 1.0 fused text still reads, verifies and compiles; its 1.1 form (today's
    lowering and fusion, printed as ember prints it now) compiles to C++ that computes the same
    results on the corpus inputs. (The C++ text itself is not compared: fusion decisions and
    view handling improve over time, while the stored 1.0 text is frozen by the corpus's
    compatibility promise.)"""
    old = parse(_text(LAYERS / f"{name}.fused.ir"))
    assert old.version == (1, 0)
    verify(old)
    new = parse(str(run_pipeline(parse(_text(LAYERS / f"{name}.prims.ir")), "lower-loops,fuse")))
    assert new.version == (1, 1)
    tail = "schedule-cpu,codegen-cpp,plan-buffers"
    feeds = load_file(str(LAYERS / f"{name}.in.safetensors"))

    def run(m: Module) -> list[torch.Tensor]:
        out = run_pipeline(m, tail)
        assert any(isinstance(v, Kernel) for v in out.items.values())
        main = next(iter(out.graphs.values()))
        args = [feeds[p.name].clone() if isinstance(p.type, TensorType)
                else feeds[p.name].item() for p in main.params]  # philox seed/offset
        return list(default_backends().get("reference").prepare(out)(main.name, args).outputs)
    got_old, got_new = run(old), run(new)
    assert len(got_old) == len(got_new)
    for a, b in zip(got_old, got_new, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_domain_that_disagrees_with_its_kernel_is_refused() -> None:
    text = BODY.replace("INDEX", "i0, i1").replace("domain(i0 < 4, i1 < 3)",
                                                   "domain(i0 < 4, i1 < 2)")
    e = _error_at(text)
    assert "declares domain(i0 < 4, i1 < 2), but runs over i0 < 4, i1 < 3" in str(e)
    assert (e.line, e.col) == (4, 3)  # at the kernel that runs it
    loose = BODY.replace("INDEX", "i0, i1").replace(" domain(i0 < 4, i1 < 3)", "")
    verify(parse(loose))  # no domain: checked from the kernel, as in 1.0


def test_loop_variables_only_in_loop_ops() -> None:
    text = BODY.replace("INDEX", "i0, i1").replace(
        "  return (%v)", "  %w = prims.add(%v, i0) : f32[]\n  return (%w)")
    e = _error_at(text)
    assert "loop variable(s) i0 outside a loop op's index" in str(e) and e.line == 10
