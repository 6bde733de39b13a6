"""The four capture x backend combinations on the models of the benchmark suites (issue 13 #5):

    eager                                   the reference
    ember capture  x ember's inductor       ember.runtime.compile(m)
    ember capture  x torch's inductor       ember.runtime.compile(m, backend="torch-inductor")
    torch's Dynamo x ember                  torch.compile(m, backend="ember")

Each compiled result must match eager within the suite case's own tolerances, and each must
have run what was asked: no fallback in explain(), no graph break, torch's inductor compiled
the graph, ember compiled every Dynamo graph. Models are benchmarks/suites.py's `models` suite
(its HF models GPT-NeoX and BERT, its vision model the conv net, the MLP), built exactly as the
benchmark builds them; only the batch is smaller (CPU CI has 2 cores).

Cost: torch's inductor cold-compiles a graph in 10-60 s here and Dynamo traces HF modeling code
in 10-30 s, so CI runs every combination on the MLP, all but torch's inductor on the conv net,
and ember's own capture x ember's inductor on all four; the rest is marked `fuzz` (the
repository's long tests: `python3 dev.py fuzz`, HYPOTHESIS_PROFILE=fuzz) and skipped otherwise.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.interop_torch import inductor as ti
from ember.runtime.interop_torch.dynamo import compiled_graphs
from ember.runtime.testing import clone_tree

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
from suites import SUITES  # noqa: E402  (benchmarks/ is on the path now)

CASES = {c.name: c for c in SUITES["models"]()}
SMALL = ("MLP", "conv net")  # every combination in CI but the one below
# the second cold compile of torch's inductor in one file (30 s here); test_interop_torch.py
# runs a small conv+BatchNorm net through it in CI
LONG_TOO = {("conv net", "ember x torch-inductor")}
LONG = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
COMBOS = ("ember x inductor", "ember x torch-inductor", "dynamo x ember")


def _shrink(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The suite's inputs with a smaller batch: 2 rows, 16 tokens, 16x16 images."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = a[:2]
            if a.dim() == 2 and not a.is_floating_point():  # token ids: batch x seq
                a = a[:, :16]
            elif a.dim() == 4:  # images: the conv net is fully convolutional
                a = a[..., :16, :16]
            a = a.contiguous()
        out.append(a)
    return tuple(out)


def _tensors(x: Any, where: str = "out") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a result (HF ModelOutputs are dicts), with its path."""
    if isinstance(x, torch.Tensor):
        yield where, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _tensors(v, f"{where}.{k}")
    elif isinstance(x, tuple | list):
        for i, v in enumerate(x):
            yield from _tensors(v, f"{where}[{i}]")


def _same(want: Any, got: Any, rtol: float, atol: float) -> int:
    assert type(got) is type(want), (type(got), type(want))
    w, g = list(_tensors(want)), list(_tensors(got))
    assert [p for p, _ in g] == [p for p, _ in w]
    for (path, a), (_, b) in zip(w, g, strict=True):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, msg=lambda m, p=path: f"{p}: {m}")
    return len(w)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def inductor_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The graphs torch's inductor compiled (none would mean something else ran them)."""
    seen: list[str] = []
    real = ti.compile_graph

    def counting(module: Any, graph: str | None, inputs: Any) -> Any:
        seen.append(module.graph(graph).name)
        return real(module, graph, inputs)

    monkeypatch.setattr(ti, "compile_graph", counting)
    return seen


def _run(combo: str, fn: Callable[..., Any], args: tuple[Any, ...],
         inductor_compiles: list[str]) -> Any:
    """`fn(*args)` through one combination, with the checks that it ran what was asked."""
    if combo == "dynamo x ember":
        got = torch.compile(fn, backend="ember")(*args)
        graphs = compiled_graphs()
        assert graphs, "Dynamo handed ember no graph"
        for g in graphs:
            assert g.ran_compiled, g.eager_reasons
            assert any("the inductor backend compiled it" in n for n in g.compiled.history.notes)
        return got
    backend = "inductor" if combo == "ember x inductor" else "torch-inductor"
    c = er.compile(fn, backend=backend)
    got = c(*args)
    rep = er.explain(c)
    assert rep.graph_count == 1 and not rep.breaks, str(rep)
    assert not rep.fallbacks, rep.fallback_summary
    if backend == "torch-inductor":
        assert inductor_compiles == [rep.graphs[0].name]
    else:
        assert any("the inductor backend compiled it" in n for n in rep.notes), rep.notes
    return got


def _params() -> list[Any]:
    out = []
    for name in CASES:
        for combo in COMBOS:
            cheap = (name in SMALL or combo == "ember x inductor") and \
                (name, combo) not in LONG_TOO
            marks = [] if cheap else [
                pytest.mark.fuzz,
                pytest.mark.skipif(not LONG, reason="long (torch's inductor or Dynamo on HF "
                                   "code); runs with HYPOTHESIS_PROFILE=fuzz")]
            out.append(pytest.param(name, combo, marks=marks, id=f"{name}-{combo}"))
    return out


@pytest.mark.parametrize("name,combo", _params())
def test_matches_eager(name: str, combo: str, inductor_compiles: list[str]) -> None:
    case = CASES[name]
    fn, args = case.build()
    args = _shrink(args)
    with torch.no_grad():
        want = fn(*clone_tree(args))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = _run(combo, fn, clone_tree(args), inductor_compiles)
    ours = [str(x.message) for x in w if str(x.message).startswith("ember")
            or issubclass(x.category, er.FallbackWarning)]
    assert ours == [], ours
    assert _same(want, got, case.rtol, case.atol) >= 1


def test_every_suite_model_is_covered() -> None:
    """The suite's models are all here, HF and vision ones among them: a model added to the
    suite is tested without an edit to this file."""
    assert {"GPT-NeoX", "tiny BERT", "conv net"} <= set(CASES)
    assert set(SMALL) <= set(CASES)
    ids = {(n, c) for n, c in ((p.values[0], p.values[1]) for p in _params())}
    assert ids == {(n, c) for n in CASES for c in COMBOS}


# -- torch-inductor's failures are fallbacks, never silent ----------------------------------------

def test_torch_inductor_compile_failure_is_a_counted_fallback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's inductor failing on a graph: eager runs it, a FallbackWarning says why, explain
    counts it (before, the reference interpreter ran it with no fallback counted)."""
    def refuses(module: Any, graph: str | None, inputs: Any) -> Any:
        raise RuntimeError("inductor says no")

    monkeypatch.setattr(ti, "compile_graph", refuses)
    mlp, (x,) = CASES["MLP"].build()
    x = x[:2]
    c = er.compile(mlp, backend="torch-inductor")
    with torch.no_grad(), pytest.warns(er.FallbackWarning, match="inductor says no"):
        torch.testing.assert_close(c(x), mlp(x))
        torch.testing.assert_close(c(x), mlp(x))
    rep = er.explain(c)
    assert rep.fallback_kinds == {"runtime": 1}, str(rep)
    assert "TorchInductorError" in rep.fallbacks[0].reason


def test_torch_inductor_refuses_what_it_cannot_export(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`ember run/check --backend torch-inductor` on a lowered (prims) module: a one-line error
    naming the reason, not a silent run of the reference interpreter."""
    from ember.runtime.cli import main

    ir = tmp_path / "g.ir"
    ir.write_text("ember.ir 1.0\n\ngraph @g(%x: f32[4]) -> (f32[4]) {\n"
                  "  %y = prims.neg(%x) : f32[4]\n  return (%y)\n}\n")
    assert main(["run", str(ir), "--random", "--backend", "torch-inductor"]) == 1
    assert "ExportError: prims.neg is not a torch operator" in capsys.readouterr().err
    assert main(["check", str(ir), "--backend", "torch-inductor"]) == 1
    assert "prims.neg is not a torch operator" in capsys.readouterr().err
