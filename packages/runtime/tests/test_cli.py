"""The `ember` CLI: opt, run, check, passes, and its error contract."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ember.ir import Module
from ember.ir.passes import default_pass_registry, register_pass
from ember.runtime import cli

MLP = """ember.ir 1.0

symbol s0 hint=3 min=1

graph @f(%x: f32[s0, 4], %w: f32[4, 4]) -> (f32[s0, 4], f32[s0, 4]) {
  %a = aten.mm.default(%x, %w) : f32[s0, 4]
  %b = aten.mm.default(%x, %w) : f32[s0, 4]
  %dead = aten.exp.default(%a) : f32[s0, 4]
  %r = aten.relu.default(%b) : f32[s0, 4]
  return (%a, %r)
}

graph @upd(%p: f32[2], %g: f32[2], %n: i64) -> (f32[2], i64) attrs(input_updates=[[0, 0]]) {
  %q = aten.add.Tensor(%p, %g) : f32[2]
  %m = aten.sym_size.int(%p, 0) : i64
  return (%q, %m)
}
"""


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    p = tmp_path / "mlp.ir"
    p.write_text(MLP)
    return p


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_opt_runs_pipeline_and_writes_output(mlp: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.ir"
    rc, _, _ = run_cli(["opt", str(mlp), "-p", "dce,cse", "--verify-each", "-o", str(out)],
                       capsys)
    assert rc == 0
    text = out.read_text()
    assert "aten.exp" not in text and text.count("aten.mm.default") == 1
    assert "aten.relu.default(%a)" in text


def test_opt_without_pipeline_reprints_canonically(mlp: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["opt", str(mlp)], capsys)
    assert rc == 0 and out == MLP


def test_opt_print_after_all(mlp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["opt", str(mlp), "-p", "dce,cse", "--print-after-all"], capsys)
    assert rc == 0
    assert "# ----- IR after dce" in err and "# ----- IR after cse" in err


def test_run_random_and_outputs(mlp: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out, ins = tmp_path / "o.safetensors", tmp_path / "i.safetensors"
    rc, _, _ = run_cli(["run", str(mlp), "--random", "--seed", "3", "--out", str(out),
                        "--save-inputs", str(ins)], capsys)
    assert rc == 0
    o, i = load_file(str(out)), load_file(str(ins))
    assert set(o) == {"out0", "out1"} and o["out0"].shape == (3, 4)  # s0 at its hint
    torch.testing.assert_close(o["out0"], i["x"] @ i["w"], rtol=0, atol=0)
    torch.testing.assert_close(o["out1"], torch.relu(i["x"] @ i["w"]), rtol=0, atol=0)


def test_run_writes_updated_parameters_by_name(mlp: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    ins, out = tmp_path / "i.safetensors", tmp_path / "o.safetensors"
    p, g = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])
    save_file({"p": p, "g": g, "n": torch.tensor(7)}, str(ins))
    rc, _, _ = run_cli(["run", str(mlp), "--graph", "upd", "--inputs", str(ins), "--out",
                        str(out)], capsys)
    assert rc == 0
    o = load_file(str(out))
    assert set(o) == {"out0", "p"}  # the update is not an output, it is written as `p`
    assert torch.equal(o["p"], p + g) and int(o["out0"]) == 2


def test_run_random_integer_inputs_are_valid_indices(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "g.ir"
    f.write_text("ember.ir 1.0\n\ngraph @g(%x: f32[2, 3], %i: i64[2, 5]) -> (f32[2, 5]) {\n"
                 "  %y = aten.gather.default(%x, 1, %i) : f32[2, 5]\n  return (%y)\n}\n")
    for seed in range(5):
        rc, _, err = run_cli(["run", str(f), "--random", "--seed", str(seed)], capsys)
        assert rc == 0, err


def test_missing_inputs_named(mlp: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    ins = tmp_path / "i.safetensors"
    save_file({"x": torch.zeros(2, 4)}, str(ins))
    rc, _, err = run_cli(["run", str(mlp), "--inputs", str(ins)], capsys)
    assert rc == 1 and "w" in err and err.count("\n") == 1


def test_parse_error_is_one_line_with_position(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ir"
    bad.write_text("ember.ir 1.0\n\ngraph @f(%x: f32[2]) -> (f32[2]) {\n"
                   "  %y = aten.relu.default(%x) : f32[2\n  return (%y)\n}\n")
    rc, out, err = run_cli(["opt", str(bad)], capsys)
    assert rc == 1 and out == ""
    assert err.startswith(f"{bad}:5:3: error: expected ']'") and err.count("\n") == 1
    assert "Traceback" not in err


def test_verify_error_has_node_position(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ir"
    bad.write_text("ember.ir 1.0\n\ngraph @f(%x: f32[2]) -> (f32[2]) {\n"
                   "  %y = aten.relu.default(%x) : f64[2]\n  return (%y)\n}\n")
    rc, _, err = run_cli(["opt", str(bad)], capsys)
    assert rc == 1 and err.startswith(f"{bad}:4:3: error:") and "aten.relu.default" in err


def test_missing_file_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["opt", "/no/such.ir"], capsys)
    assert rc == 1 and err == "/no/such.ir: error: no such file\n"
    with pytest.raises(SystemExit) as e:
        cli.main(["run"])
    assert e.value.code == 2


def test_debug_shows_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ir"
    bad.write_text("ember.ir 9.0\n")
    with pytest.raises(cli.CLIError):
        cli.main(["opt", str(bad), "--debug"])


def test_unknown_pass_is_an_error(mlp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["opt", str(mlp), "-p", "dce,nosuchpass"], capsys)
    assert rc == 1 and "nosuchpass" in err


def test_kernels_need_explicit_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "k.ir"
    f.write_text('ember.ir 1.0\n\nkernel @k0 cpp """int main() { return 0; }"""\n\n'
                 "graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = aten.neg.default(%x) : f32[2]\n"
                 "  return (%y)\n}\n")
    rc, _, err = run_cli(["run", str(f), "--random"], capsys)
    assert rc == 1 and "--allow-kernels" in err and "@k0" in err
    rc, _, _ = run_cli(["run", str(f), "--random", "--allow-kernels"], capsys)
    assert rc == 0


def test_passes_lists_builtin_passes(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["passes"], capsys)
    assert rc == 0
    names = {line.split()[0] for line in out.splitlines()}
    assert {"dce", "cse"} <= names


@pytest.fixture
def breaking_pass() -> Iterator[str]:
    """A pass that changes numerics (relu -> neg) without breaking the IR's types."""

    def relu_to_neg(module: Module) -> Module:
        out = module.clone()
        for g in out.graphs.values():
            for n in g.nodes:
                if n.op == "aten.relu.default":
                    n.op = "aten.neg.default"
        return out

    reg = default_pass_registry()
    register_pass("test-relu-to-neg", "test only: wrong numerics")(relu_to_neg)
    yield "test-relu-to-neg"
    reg._passes.pop("test-relu-to-neg")


def test_check_passes_and_fails(mlp: Path, breaking_pass: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["check", str(mlp), "-p", "dce,cse"], capsys)
    assert rc == 0 and out.startswith("ok:")
    rc, _, err = run_cli(["check", str(mlp), "-p", breaking_pass], capsys)
    assert rc == 1 and "mismatch" in err and "@f out1" in err and "worst abs error" in err


def test_console_script_entry_point(mlp: Path) -> None:
    script = Path(sys.executable).parent / "ember"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "ember.runtime.cli"]
    proc = subprocess.run(cmd + ["passes"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "dce" in proc.stdout


PRIMS_OK = """ember.ir 1.0

graph @g(%x: f32[3, 4], %y: f32[4]) -> (f32[3, 4]) {
  %e = aten.exp.default(%x) : f32[3, 4]
  %z = aten.add.Tensor(%e, %y, alpha=2) : f32[3, 4]
  return (%z)
}
"""


def test_backends_listed_and_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["backends"], capsys)
    assert rc == 0 and {"reference", "prims"} <= {ln.split()[0] for ln in out.splitlines()}
    f = tmp_path / "p.ir"
    f.write_text(PRIMS_OK)
    ref, pr = tmp_path / "ref.safetensors", tmp_path / "prims.safetensors"
    assert run_cli(["run", str(f), "--random", "--out", str(ref)], capsys)[0] == 0
    assert run_cli(["run", str(f), "--random", "--backend", "prims", "--out", str(pr)],
                   capsys)[0] == 0
    torch.testing.assert_close(load_file(str(pr))["out0"], load_file(str(ref))["out0"])
    rc, out, _ = run_cli(["check", str(f), "--backend", "prims"], capsys)
    assert rc == 0 and "backend prims" in out


def test_unknown_backend_and_empty_check(mlp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["run", str(mlp), "--random", "--backend", "nope"], capsys)
    assert rc == 1 and "unknown backend 'nope'" in err
    rc, _, err = run_cli(["check", str(mlp)], capsys)
    assert rc == 1 and "nothing to check" in err
