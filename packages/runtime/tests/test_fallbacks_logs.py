"""Honest fallbacks and live logs (issue 13 #6): every graph or call that does not run through
the requested backend is counted per kind and graph in explain()'s summary and warns once per
function and kind (FallbackWarning, at the user's call); EMBER_LOGS / set_logs() log graph
breaks, recompiles, fallbacks, guards, pipeline passes and kernels through `logging`."""

from __future__ import annotations

import importlib
import inspect
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.prims.decomp.table import DECOMPOSITIONS
from ember.runtime import logs
from ember.runtime.history import FALLBACK_KINDS, Fallback, fallback_summary

# the module (ember.runtime.compile the attribute is the function)
compile_mod = importlib.import_module("ember.runtime.compile")
DTYPES = (torch.float32, torch.float64)  # a recompile per call (new shapes may go symbolic)


@pytest.fixture(autouse=True)
def logs_off() -> Iterator[None]:
    logs.set_logs()
    yield
    logs.set_logs()


def sin_cos(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.cos(x) * 2


def digamma_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.digamma(x) + torch.sin(x)  # prims.digamma has no VJP rule: no joint graph


def raises(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("no")


def broken_backend(module: Any, example_inputs: Any) -> Any:
    raise RuntimeError("boom")


def failing_runner(compiled: Any, source: Any = None) -> Any:
    def run(graph: Any, inputs: Any) -> Any:
        raise RuntimeError("kernel exploded")
    return run


def _profiled(x: torch.Tensor) -> torch.Tensor:
    # record_function writes into the process-wide profiler (not capturable), and a `with`
    # block is a try/finally, where a graph break cannot go: the whole function falls back
    with torch.autograd.profiler.record_function("ember-test"):
        return x.sin()


# kind -> (compile(...) of the target, the calls, extra setup)
def _case(kind: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Callable[[Any], Any]]]:
    no_grad = torch.no_grad
    if kind == "training":
        c = er.compile(digamma_sin)
        return c, [lambda c, d=d: c(torch.randn(3, dtype=d, requires_grad=True))
                   for d in DTYPES]
    if kind == "device":
        c = er.compile(sin_cos)  # the meta device stands for CUDA: no code generation for it
        return c, [lambda c, d=d: c(torch.randn(3, dtype=d, device="meta")) for d in DTYPES]
    if kind == "missing ops":
        table = DECOMPOSITIONS.copy().remove("aten.sin.default").remove("aten.cos.default")
        c = er.compile(sin_cos, options={"decompositions": table})
    elif kind == "interpreter":
        # a pipeline that stops at prims: the reference interpreter runs the prims (random
        # ops were this case's example until the generated call covered them)
        c = er.compile(sin_cos, options={"pipeline": "to-prims"})
    elif kind == "backend":
        c = er.compile(sin_cos, backend=broken_backend)
    elif kind == "runtime":
        monkeypatch.setattr(compile_mod, "compiled_runner", failing_runner)
        c = er.compile(sin_cos)
    elif kind == "cache limit":
        c = er.compile(sin_cos, options={"cache_limit": 1})
    elif kind == "capture":
        c = er.compile(_profiled)
        return c, [lambda c: c(torch.randn(2, 3)) for _ in range(2)]
    else:
        raise AssertionError(kind)

    def call(d: torch.dtype) -> Callable[[Any], Any]:
        def go(c: Any) -> Any:
            with no_grad():
                return c(torch.randn(3, dtype=d))
        return go
    return c, [call(d) for d in DTYPES]


EXPECT = {  # kind -> (fallbacks counted over the calls, a piece of the summary line)
    "training": (2, "2 fallback(s): 2 training prims.digamma (graph 0, graph 1)"),
    "device": (2, "2 fallback(s): 2 device (graph 0, graph 1)"),
    "missing ops": (2, "2 missing ops aten.cos.default, aten.sin.default (graph 0, graph 1)"),
    "interpreter": (2, "2 fallback(s): 2 interpreter (graph 0, graph 1)"),
    "backend": (2, "2 fallback(s): 2 backend (graph 0, graph 1)"),
    "runtime": (2, "2 fallback(s): 2 runtime (graph 0, graph 1)"),
    "cache limit": (1, "1 fallback(s): 1 cache limit"),
    "capture": (1, "1 fallback(s): 1 capture"),
}


def test_every_kind_is_tested() -> None:
    assert set(EXPECT) == set(FALLBACK_KINDS)


@pytest.mark.parametrize("kind", sorted(EXPECT))
def test_fallback_is_counted_with_reason_and_warns_once(kind: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    c, calls = _case(kind, monkeypatch)
    with pytest.warns(er.FallbackWarning) as got:
        for call in calls:
            call(c)
    ours = [w for w in got if issubclass(w.category, er.FallbackWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]  # once per function and kind
    w = ours[0]
    assert w.filename == __file__  # the user's call site, not ember's internals
    assert "falls back" in str(w.message) and f": {kind}: " in str(w.message)
    rep = er.explain(c)
    count, piece = EXPECT[kind]
    assert rep.fallback_kinds == {kind: count}, str(rep)
    assert piece in rep.fallback_summary and rep.fallback_summary in str(rep)
    assert f"{count} fallback(s)," in str(rep).splitlines()[0]
    assert all(f.reason for f in rep.fallbacks)


def test_missing_ops_names_every_op_and_the_source_line() -> None:
    table = DECOMPOSITIONS.copy().remove("aten.sin.default").remove("aten.cos.default")
    c = er.compile(sin_cos, options={"decompositions": table})
    with pytest.warns(er.FallbackWarning, match="aten.cos.default, aten.sin.default") as got:
        x = torch.randn(3)
        with torch.no_grad():
            torch.testing.assert_close(c(x), sin_cos(x))
    line = inspect.getsourcelines(sin_cos)[1]
    assert f"test_fallbacks_logs.py:{line}" in str(got[0].message)
    (fb,) = er.explain(c).fallbacks
    assert fb.ops == ("aten.cos.default", "aten.sin.default") and fb.line == line


def test_results_are_eager_s_under_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_mod, "compiled_runner", failing_runner)
    c = er.compile(sin_cos)
    x = torch.randn(4)
    with pytest.warns(er.FallbackWarning, match="kernel exploded"), torch.no_grad():
        torch.testing.assert_close(c(x), sin_cos(x))
        torch.testing.assert_close(c(x), sin_cos(x))
    assert er.explain(c).fallback_kinds == {"runtime": 1}


def test_graph_compiled_normally_has_no_warning_and_no_fallback(
        recwarn: pytest.WarningsRecorder) -> None:
    warnings.simplefilter("always")
    c = er.compile(sin_cos)
    with torch.no_grad():
        c(torch.randn(3))
        c(torch.randn(3))
    assert not [w for w in recwarn if issubclass(w.category, er.FallbackWarning)]
    rep = er.explain(c)
    assert not rep.fallbacks and "0 fallback(s)," in str(rep)


def test_two_kinds_in_one_function_each_warn_once() -> None:
    c = er.compile(digamma_sin)
    with pytest.warns(er.FallbackWarning) as got:
        c(torch.randn(3, requires_grad=True))
        c(torch.randn(3, device="meta"))
        c(torch.randn(4, requires_grad=True))
    kinds = [str(w.message).split("): ", 1)[1].split(":")[0] for w in got
             if issubclass(w.category, er.FallbackWarning)]
    assert kinds == ["training", "device"]
    assert er.explain(c).fallback_summary == \
        "3 fallback(s): 2 training prims.digamma (graph 0, graph 2), 1 device (graph 1)"


def test_explain_works_with_every_backend_and_compiled_methods() -> None:
    def custom(module: Any, example_inputs: Any) -> Any:
        from ember.runtime.backends import eager_backend
        return eager_backend(module, example_inputs)

    for backend in ("inductor", "eager", "prims", custom):
        c = er.compile(sin_cos, backend=backend)
        with torch.no_grad():
            rep = er.explain(c, torch.randn(3))
        assert rep.graph_count == 1 and rep.calls == 1 and not rep.fallbacks, (backend, rep)

    class K:
        def __init__(self) -> None:
            self.k = 3.0

        @er.compile(backend="eager")
        def run(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.k

    k = K()
    torch.testing.assert_close(k.run(torch.ones(2)), torch.full((2,), 3.0))
    rep = er.explain(k.run, torch.ones(2))
    assert rep.graph_count == 1 and rep.calls == 2


@given(st.lists(st.sampled_from(sorted(FALLBACK_KINDS)), max_size=8),
       st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=8, max_size=8))
def test_summary_counts_every_fallback(kinds: list[str], graphs: list[int | None]) -> None:
    items = [Fallback("why", "f.py", 1, (), k, g) for k, g in zip(kinds, graphs, strict=False)]
    text = fallback_summary(items)
    assert text.startswith(f"{len(items)} fallback(s)")
    for k in set(kinds):
        assert f"{kinds.count(k)} {k}" in text


# -- logs ----------------------------------------------------------------------------------------
def with_break(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    print("", end="")  # BREAK
    return y.cos()


def _records(caplog: pytest.LogCaptureFixture, channel: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == f"ember.{channel}"]


def _exercise() -> None:
    c = er.compile(with_break)
    with torch.no_grad():
        c(torch.randn(3))
        c(torch.randn(4))  # a recompile
    c = er.compile(digamma_sin)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c(torch.randn(3, requires_grad=True))  # a fallback


@pytest.mark.parametrize("channel,expect", [
    ("graph_breaks", "test_fallbacks_logs.py:{break_line}: print()"),
    ("recompiles", "recompiling with_break"),
    ("fallbacks", "training: the joint forward/backward graph cannot be built"),
    ("guards", "with_break: graph 0 @with_break:"),
    ("pipeline", "with_break: graph 0 @with_break: pipeline inductor: decompose"),
    ("kernels", "with_break: graph 0 @with_break: 1 kernel(s) @with_break_k0; C++ units"),
])
def test_ember_logs_channel(channel: str, expect: str, caplog: pytest.LogCaptureFixture,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_LOGS", channel)
    logs.init_from_env()
    caplog.set_level(logging.INFO)
    _exercise()
    got = _records(caplog, channel)
    break_line = inspect.getsourcelines(with_break)[1] + 2
    assert any(expect.format(break_line=break_line) in m for m in got), got
    others = {r.name for r in caplog.records if r.name.startswith("ember.")}
    assert others == {f"ember.{channel}"}  # the other channels stay quiet


def test_guards_and_recompile_name_the_failed_guard(caplog: pytest.LogCaptureFixture) -> None:
    er.set_logs(guards=True, recompiles=True)
    caplog.set_level(logging.INFO)
    c = er.compile(sin_cos, backend="eager")
    c(torch.randn(3))
    c(torch.randn(5))
    assert any("x: shape [5], expected [3]" in m for m in _records(caplog, "recompiles"))
    assert any("x: tensor float32[3]" in m for m in _records(caplog, "guards"))


def test_logs_off_costs_no_records(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _exercise()
    assert not [r for r in caplog.records if r.name.startswith("ember.")]
    assert not any(lg.isEnabledFor(logging.CRITICAL) for lg in logs.LOGGERS.values())


def test_logs_syntax_all_plus_minus() -> None:
    levels, bad = logs.parse("all,-guards,+pipeline")
    assert not bad and levels["guards"] == logging.NOTSET
    assert levels["pipeline"] == logging.DEBUG and levels["kernels"] == logging.INFO
    er.set_logs(["+graph_breaks"])
    assert logs.graph_breaks.isEnabledFor(logging.DEBUG) and not logs.guards.isEnabledFor(50)


def test_invalid_names_warn_once_listing_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_LOGS", "graph_breaks,bogus,+nope")
    with pytest.warns(UserWarning) as got:
        logs.init_from_env()
    assert len(got) == 1
    msg = str(got[0].message)
    assert "'bogus', '+nope'" in msg and all(c in msg for c in logs.CHANNELS)
    assert logs.graph_breaks.isEnabledFor(logging.INFO)  # the valid names still apply
    with pytest.warns(UserWarning, match="unknown log channel.*'kernel'"):
        er.set_logs(kernel=True)


def test_explain_of_a_torch_compile_wrapper_explains_the_original() -> None:
    m = nn.Linear(3, 3)
    for wrapped in (torch.compile(m), torch.compile(sin_cos)):
        rep = er.explain(wrapped, torch.randn(2, 3))
        assert rep.graph_count == 1 and rep.calls == 1 and not rep.fallbacks
        assert any("torch.compile wrapper" in n for n in rep.notes)
