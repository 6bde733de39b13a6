"""The worked plugin package examples/ember-plugin-example, as installed in the dev environment
(tools/bootstrap.py installs it editable, as a user would with pip): its pass, pipeline,
decomposition table and backends reach `ember opt`, `ember passes`, `ember backends` and
compile() through entry points alone, with no edit to ember (issue 13).
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember.runtime as er
from ember.prims.decomp import DECOMPOSITIONS
from ember.runtime.cli import main

try:
    distribution("ember-plugin-example")
except PackageNotFoundError:  # pragma: no cover (the dev environment always has it)
    pytest.skip("examples/ember-plugin-example is not installed: run python3 dev.py dev",
                allow_module_level=True)


class GeluSoftmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(F.gelu(self.lin(x)), -1)


def _compiled(dump: Path, **kw: object) -> tuple[torch.Tensor, torch.Tensor, object]:
    torch.manual_seed(0)
    m, x = GeluSoftmax(), torch.randn(4, 8)
    opts = dict(kw.pop("options", None) or {})  # type: ignore[call-overload]
    with torch.no_grad():
        want = m(x)
        c = er.compile(m, options={**opts, "dump_dir": str(dump)}, **kw)  # type: ignore[arg-type]
        got = c(x)
    return want, got, c


def _calls(path: Path) -> int:
    return path.read_text().count("kernels.call(")


def test_listed_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    assert "example-fuse" in out and "example-erfc" in out and "example " in out
    assert main(["backends"]) == 0
    names = {ln.split()[0] for ln in capsys.readouterr().out.splitlines()}
    assert {"example", "example-interp", "inductor", "eager", "aot_eager", "prims",
            "reference"} <= names


def test_pipeline_and_table_change_compile(tmp_path: Path) -> None:
    """The plugin's pipeline changes a fusion decision, its table a decomposition."""
    want, got, _ = _compiled(tmp_path / "default")
    torch.testing.assert_close(got, want)
    base = tmp_path / "default"
    _, got, _ = _compiled(tmp_path / "ex", options={"pipeline": "example", "dump_each": True})
    torch.testing.assert_close(got, want)  # a different decomposition, the same numbers
    ex = tmp_path / "ex"
    decomposed = (ex / "forward_0.stage00.decompose.ir").read_text()
    assert "prims.erfc" in decomposed and "prims.erf(" not in decomposed
    # softmax's reductions are no longer fused with their readers
    assert _calls(ex / "forward_0.kernels.ir") > _calls(base / "forward_0.kernels.ir")
    assert "example-fuse" in (ex / "forward_0.stage04.example-fuse.ir").read_text()
    # the table alone, with the default pipeline: same fusion, gelu through erfc
    _, got, _ = _compiled(tmp_path / "tb", options={"decompositions": "example-erfc",
                                                    "dump_each": True})
    torch.testing.assert_close(got, want)
    tb = tmp_path / "tb"
    assert "prims.erfc" in (tb / "forward_0.stage00.decompose.ir").read_text()
    assert _calls(tb / "forward_0.kernels.ir") == _calls(base / "forward_0.kernels.ir")
    assert DECOMPOSITIONS.get("aten.gelu.default").__module__.startswith("ember.prims")


def test_plugin_backend_through_compile(tmp_path: Path) -> None:
    """compile(backend="example"): the plugin's pipeline backend, under the inductor's policy:
    its kernels dumped (with the producing pipeline named), options and explain notes."""
    want, got, c = _compiled(tmp_path, backend="example", options={"dump_each": True})
    torch.testing.assert_close(got, want)
    kernels = (tmp_path / "forward_0.kernels.ir").read_text()
    assert "kernels.call(" in kernels and "example-fuse" in kernels.splitlines()[1]
    assert "prims.erfc" in (tmp_path / "forward_0.stage00.decompose.ir").read_text()
    h = er.explain(c)
    assert any("backend 'example' compiled it to" in n for n in h.notes), h.notes
    assert not h.fallbacks


def test_plugin_protocol_backend_through_compile(tmp_path: Path) -> None:
    want, got, c = _compiled(tmp_path, backend="example-interp")
    torch.testing.assert_close(got, want)
    h = er.explain(c)
    assert any("backend 'example-interp' ran it" in n for n in h.notes)
    with pytest.raises(ValueError, match="apply to the inductor backend only"):
        er.compile(lambda x: x, backend="example-interp", options={"pipeline": "inductor"})


def test_ember_opt_and_run_with_the_plugin(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _compiled(tmp_path)
    ir = str(tmp_path / "forward_0.ir")  # the captured aten graph, as EMBER_DUMP writes it
    inputs = str(tmp_path / "forward_0.inputs.safetensors")

    def opt(pipeline: str) -> str:
        assert main(["opt", ir, "-p", pipeline]) == 0
        return capsys.readouterr().out

    assert "prims.erfc" in opt("decompose{table=example-erfc}")
    assert "prims.erfc" not in opt("to-prims")
    fused = opt("decompose,cse,dce,lower-loops,example-fuse")  # the plugin's pass by name
    assert "loop." in fused
    assert opt("example").count("kernels.call(") > opt("inductor").count("kernels.call(")
    assert main(["check", ir, "-p", "example", "--backend", "inductor"]) == 0
    assert capsys.readouterr().out.startswith("ok:")
    for backend in ("example", "example-interp"):
        out = tmp_path / f"{backend}.safetensors"
        assert main(["run", ir, "--inputs", inputs, "--backend", backend, "--out",
                     str(out)]) == 0, backend
        assert out.exists()
    capsys.readouterr()


def test_plugin_seen_by_a_fresh_process(tmp_path: Path) -> None:
    """No in-process help: the CLI of a new interpreter finds the plugin's entry points."""
    f = tmp_path / "g.ir"
    f.write_text("ember.ir 1.0\n\ngraph @g(%x: f32[4]) -> (f32[4]) {\n"
                 "  %y = aten.gelu.default(%x) : f32[4]\n  return (%y)\n}\n")
    proc = subprocess.run([sys.executable, "-m", "ember.runtime.cli", "opt", str(f), "-p",
                           "decompose{table=example-erfc}"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "prims.erfc" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "ember.runtime.cli", "backends"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "example-interp" in proc.stdout, proc.stderr


@pytest.mark.parametrize("first", ["ember_plugin_example", "ember.runtime"])
def test_every_entry_point_loads_whatever_is_imported_first(first: str) -> None:
    """The plugin imports ember, whose registries read the entry points while the plugin's own
    module is still importing: the registries must look again later, not give up on it."""
    code = (f"import warnings; warnings.simplefilter('error')\n"
            f"import {first}\n"
            "from ember.ir.passes import default_pass_registry\n"
            "from ember.ir.backends import default_backends\n"
            "from ember.prims.decomp.table import decomposition_tables\n"
            "r = default_pass_registry()\n"
            "names = set(r.all()) | set(r.pipelines())\n"
            "print(sorted(n for n in ('example', 'example-fuse') if n in names),\n"
            "      sorted(n for n in default_backends().all() if n.startswith('example')),\n"
            "      'example-erfc' in decomposition_tables().all())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['example',", "'example-fuse']", "['example',",
                                   "'example-interp']", "True"], proc.stdout


def test_plugin_lowering_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The entry point group `ember.lowerings`: the plugin's table (exp left to an extern call)
    is listed by `ember passes` and picked by `lower-loops{table=...}` from compile() and from
    `ember opt`, with no registration in the test."""
    from ember.inductor.lowering_plugins import lowering_tables

    assert "example-no-exp" in lowering_tables()
    assert main(["passes"]) == 0
    assert "example-no-exp" in capsys.readouterr().out.split("lowering tables", 1)[1]
    pipeline = "to-prims,lower-loops{table=example-no-exp},fuse,codegen-cpp,plan-buffers"
    x = torch.randn(3, 4)
    fn = lambda x: torch.exp(x) * 2 + 1  # noqa: E731
    c = er.compile(fn, options={"pipeline": pipeline, "dump_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(c(x), fn(x))
    compiled = next(tmp_path.glob("*.kernels.ir")).read_text()
    assert 'kernels.extern(' in compiled and 'op="prims.exp"' in compiled
    ir = next(p for p in tmp_path.glob("*.ir") if ".kernels" not in p.name)
    out = tmp_path / "loops.ir"
    assert main(["opt", str(ir), "-p", "to-prims,lower-loops{table=example-no-exp}",
                 "-o", str(out)]) == 0
    assert 'op="prims.exp"' in out.read_text()
