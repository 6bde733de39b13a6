"""One backend protocol (ember.ir.backends) for `ember run --backend` and compile(backend=), read
from the `ember.backends` entry point group; a custom backend runs under the built-ins' policy
(fallbacks in explain, notes, EMBER_DUMP); every dump names its producer and replays (issue 13).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import ember.ir.backends as backends_mod
import ember.runtime as er
from ember.ir import Interpreter, Module, RunResult, parse
from ember.ir.backends import (
    Backend,
    BackendPluginWarning,
    BackendProtocol,
    BackendRegistry,
    Runner,
    default_backends,
)
from ember.runtime.backends import CompiledRunner, pipeline_backend
from ember.runtime.cli import main


def f(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.relu(x) * 2 + 1, -1)


def _interp(module: Module, example_inputs: Sequence[Any] | None,
            options: Mapping[str, Any]) -> Runner:
    it = Interpreter(module, check_types=False)
    return lambda graph, inputs: it.run(inputs, graph)


class Recording:
    """A backend written as a class against the protocol, with neither base nor registration."""

    name = "recording"
    summary = "interprets the graph, recording what prepare() was given"

    def __init__(self) -> None:
        self.seen: list[tuple[int, dict[str, Any]]] = []

    def prepare(self, module: Module, example_inputs: Sequence[Any] | None = None,
                options: Mapping[str, Any] | None = None) -> Runner:
        self.seen.append((len(example_inputs or ()), dict(options or {})))
        return _interp(module, example_inputs, options or {})


def test_protocol_object_and_older_forms() -> None:
    x = torch.randn(3, 5)
    rec = Recording()
    assert isinstance(rec, BackendProtocol)
    c = er.compile(f, backend=rec, options={"cache_limit": 3})
    torch.testing.assert_close(c(x), f(x))
    assert rec.seen == [(1, {"cache_limit": 3})]  # example inputs and compile()'s options
    assert any("backend 'recording' ran it" in n for n in er.explain(c).notes)
    # the one-argument prepare of the first IR protocol, and compile()'s old callable form
    old = Backend("old", "prepare(module) only", lambda m: _interp(m, None, {}))
    torch.testing.assert_close(er.compile(f, backend=old)(x), f(x))
    assert default_backends().get("prims").prepare(parse(
        "ember.ir 1.0\n\ngraph @g(%x: f32[2]) -> (f32[2]) {\n"
        "  %y = aten.relu.default(%x) : f32[2]\n  return (%y)\n}\n"))(None, [-x[0, :2]]) \
        .outputs[0].min() >= 0

    def legacy(module: Module, examples: Sequence[Any]) -> Any:
        it = Interpreter(module)
        return lambda inputs: it.run(inputs).outputs

    torch.testing.assert_close(er.compile(f, backend=legacy)(x), f(x))
    for name in ("reference", "prims", "inductor", "eager", "aot_eager"):
        torch.testing.assert_close(er.compile(f, backend=name)(x), f(x))
    with pytest.raises(ValueError, match="unknown backend 'nope'.*example-interp|unknown"):
        er.compile(f, backend="nope")
    with pytest.raises(TypeError, match="not an ember backend"):
        BackendRegistry().add(object())


def test_custom_backend_fallbacks_are_counted() -> None:
    x = torch.randn(3, 5)

    def failing_prepare(module: Module, ex: Any, opts: Any) -> Runner:
        raise RuntimeError("cannot lower")

    c = er.compile(f, backend=Backend("fails-prepare", "", failing_prepare))
    with pytest.warns(er.FallbackWarning, match="backend 'fails-prepare' failed"):
        torch.testing.assert_close(c(x), f(x))
    (fb,) = er.explain(c).fallbacks
    assert fb.kind == "backend" and "cannot lower" in fb.reason

    def wrong_at_run(module: Module, ex: Any, opts: Any) -> Runner:
        def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
            raise ValueError("bad kernel")
        return run

    c = er.compile(f, backend=Backend("fails-run", "", wrong_at_run))
    with pytest.warns(er.FallbackWarning):
        torch.testing.assert_close(c(x), f(x))  # eager judged: the backend was at fault
    torch.testing.assert_close(c(x), f(x))
    rep = er.explain(c)
    assert [fb.kind for fb in rep.fallbacks] == ["runtime"]
    assert any("backend 'fails-run' failed: ValueError: bad kernel" in n for n in rep.notes)


def test_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    class EP:
        def __init__(self, name: str, obj: object) -> None:
            self.name, self.value, self._obj = name, f"pkg:{name}", obj

        def load(self) -> object:
            if isinstance(self._obj, Exception):
                raise self._obj
            return self._obj

    groups: list[str] = []

    def fake(*, group: str) -> list[EP]:
        groups.append(group)
        if group != "ember.backends":
            return []
        return [EP("good", Backend("ep-good", "from an entry point", _interp)),
                EP("registers", lambda reg: reg.add(Backend("ep-fn", "by a callable",
                                                            _interp))),
                EP("broken", ImportError("no module"))]

    monkeypatch.setattr(backends_mod, "entry_points", fake)
    reg = BackendRegistry()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        names = set(reg.all())
    assert {"ep-good", "ep-fn"} <= names
    assert groups == ["ember.backends", "ember.ir_backends"]
    assert [x.category for x in w] == [BackendPluginWarning] and "broken" in str(w[0].message)


def test_pipeline_backend_gets_the_inductor_policy(tmp_path: Path) -> None:
    x = torch.randn(3, 5)
    b = pipeline_backend("cse-free", "the inductor pipeline without cse",
                         "decompose,dce,inductor-cpu")
    c = er.compile(f, backend=b, options={"dump_dir": str(tmp_path), "verify_each": True})
    torch.testing.assert_close(c(x), f(x))
    rep = er.explain(c)
    assert any("backend 'cse-free' compiled it to" in n for n in rep.notes), rep.notes
    text = (tmp_path / "f_0.kernels.ir").read_text().splitlines()
    assert text[0] == "ember.ir 1.0"
    assert text[1].startswith("# produced by: pipeline decompose,dce,") and "codegen-cpp" in text[1]
    runner = b.prepare(parse((tmp_path / "f_0.ir").read_text()))
    assert isinstance(runner, CompiledRunner) and runner.compiled.kernels


def test_every_dump_names_its_producer_and_replays(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(3, 5)
    c = er.compile(f, options={"dump_dir": str(tmp_path), "dump_each": True})
    want = c(x)
    files = sorted(tmp_path.glob("f_0*.ir"))
    stages = [p.name.split(".")[2] for p in files if ".stage" in p.name]
    assert {"decompose", "lower-loops", "fuse", "codegen-cpp"} <= set(stages), stages
    inputs = str(tmp_path / "f_0.inputs.safetensors")
    for p in files:
        lines = p.read_text().splitlines()
        assert lines[0].startswith("ember.ir 1."), p.name  # 1.1: loop IR with domains
        head = [ln for ln in lines[1:6] if ln.startswith("#")]
        assert head[0].startswith("# produced by: "), p.name
        if p.name != "f_0.ir":  # the compiled module and stages name the pipeline, expanded
            assert "decompose{keep_attention=true}" in head[0] and "codegen-cpp" in head[0]
            assert "inductor-cpu" not in head[0]  # the named pipeline, expanded
        else:
            assert "ember.capture" in head[0]
        assert any(h.startswith("# ember ") and f"torch {torch.__version__}" in h
                   for h in head), head
        assert any(h.startswith("# date: ") for h in head)
        out = tmp_path / f"{p.name}.out.safetensors"
        rc = main(["run", str(p), "--inputs", inputs, "--out", str(out), "--allow-kernels"])
        assert rc == 0, (p.name, capsys.readouterr().err)
        torch.testing.assert_close(load_file(str(out))["out0"], want)
        # a comment is not part of the module: printing the parsed dump drops it
        assert "# produced by" not in str(parse(p.read_text()))


def test_stage_dumps_of_a_graph_that_writes_its_inputs_replay_with_its_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """BatchNorm in training mode updates its running statistics: every stage dump states the
    captured graph's input updates again, so `ember run` of a stage writes the same named
    results (the updated buffers) as the captured graph's dump."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4),
                            torch.nn.ReLU()).train()
    with torch.no_grad():
        er.compile(m, options={"dump_dir": str(tmp_path), "dump_each": True})(
            torch.randn(2, 3, 8, 8))
    want = load_file(tmp_path / "forward_0.outputs.safetensors")
    assert {"out0", "l_self_1_running_mean", "l_self_1_running_var"} <= set(want)
    stages = sorted(tmp_path.glob("forward_0.stage*.ir")) + [tmp_path / "forward_0.kernels.ir"]
    assert len(stages) >= 5
    for p in stages:
        assert "input_updates" in p.read_text(), p.name
        out = tmp_path / "replay.safetensors"
        assert main(["run", str(p), "--inputs", str(tmp_path / "forward_0.inputs.safetensors"),
                     "--out", str(out), "--allow-kernels"]) == 0, capsys.readouterr().err
        got = load_file(out)
        assert got.keys() == want.keys(), p.name
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_supports_training_is_honest() -> None:
    """A backend declares `supports_training` exactly when compile() runs a graph that records
    gradients through it as forward and backward graphs: ember's inductor and aot_eager do,
    and their gradients are eager's with no fallback; `ember backends` says so."""
    declared = {n for n, b in default_backends().all().items()
                if getattr(b, "supports_training", False)}
    assert {"inductor", "aot_eager"} <= declared
    for name in sorted(declared & {"inductor", "aot_eager"}):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
        ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
        ref.load_state_dict(m.state_dict())
        x = torch.randn(3, 5)
        c = er.compile(m, backend=name)
        c(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for p, q in zip(m.parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad)
        rep = er.explain(c)
        assert not rep.fallbacks, (name, rep.fallback_summary)
    lines = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["backends"]) == 0
    for ln in out.getvalue().splitlines():
        lines[ln.split()[0]] = ln
    assert "[training" in lines["inductor"] and "[training" in lines["aot_eager"]
