"""explain() reports, EMBER_DUMP dumps that replay through the `ember` CLI, and the compile()
contract (modules share parameters, decorator form, backends and modes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import ember.runtime as er
from ember.ir import parse, verify
from ember.runtime import cli


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).softmax(-1)


def with_print(x):
    y = x + 1
    print("hello")
    return y


def test_explain_reports_graph_ops_guards_inputs() -> None:
    rep = er.explain(Net(), torch.randn(3, 4))
    assert rep.graph_count == 1 and not rep.fallbacks and rep.calls == 1
    g = rep.graphs[0]
    assert g.ir.startswith("ember.ir 1.0")
    assert rep.op_counts["aten.addmm.default"] == 2
    assert rep.op_counts["aten.relu.default"] == 1
    assert g.inputs == ["x", "self.fc1.weight", "self.fc1.bias", "self.fc2.weight",
                        "self.fc2.bias"]
    assert "%l_self_fc1_weight: f32[8, 4]" in g.ir
    assert any(t.startswith("x: tensor float32[3, 4]") for t in g.guards)
    text = str(rep)
    assert "1 graph(s), 0 recompilation(s), 0 fallback(s)" in text
    assert "aten.addmm.default x2" in text and "guards (" in text


def test_explain_reports_graph_break_with_line(capsys: pytest.CaptureFixture[str]) -> None:
    rep = er.explain(with_print, torch.randn(2))
    assert capsys.readouterr().out == "hello\n"
    # x + 1 is a graph; the resume function after the print captures no operation
    assert rep.graph_count == 1 and rep.break_count == 1 and not rep.fallbacks
    b = rep.breaks[0]
    assert "print()" in b.reason and b.line == with_print.__code__.co_firstlineno + 2
    assert f"at {b.file}:{b.line}" in str(rep) and "graph breaks:" in str(rep)


def test_explain_of_compiled_function_reports_history_and_backend_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))  # the default backend builds C++
    c = er.compile(Net())
    with torch.no_grad():
        c(torch.randn(3, 4))
        c(torch.randn(5, 4))
    rep = er.explain(c)
    assert rep.graph_count == 2 and len(rep.recompilations) == 1
    assert "x: shape [5, 4], expected [3, 4]" in rep.recompilations[0]
    assert any("the inductor backend compiled it to" in n for n in rep.notes)
    assert "recompilations:" in str(rep) and "C++ kernel(s)" in str(rep)
    c2 = er.compile(Net(), backend="aot_eager")  # prims on the reference interpreter
    c2(torch.randn(3, 4))
    assert "backend 'aot_eager' runs its forward as prims on the reference interpreter" \
        in str(er.explain(c2))  # (the parameters require grad: a training graph)


def test_compiled_module_shares_parameters_and_state() -> None:
    m = Net()
    c = er.compile(m, backend="eager")
    assert isinstance(c, nn.Module)
    assert set(dict(c.named_parameters())) == {f"_orig_mod.{k}" for k, _ in
                                               m.named_parameters()}
    assert all(a is b for a, b in zip(c.parameters(), m.parameters()))
    assert c.fc1 is m.fc1  # attribute access reaches the original
    x = torch.randn(3, 4)
    c(x)[:, 0].sum().backward()  # (the softmax rows sum to 1)
    assert m.fc1.weight.grad is not None
    opt = torch.optim.SGD(c.parameters(), lr=0.1)
    before = m(x).detach()
    opt.step()
    torch.testing.assert_close(c(x), m(x))
    assert not torch.allclose(before, m(x))


def test_decorator_form_and_methods() -> None:
    @er.compile(backend="eager")
    def f(x, y=2):
        return x * y

    torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 2.0))
    assert f.__name__ == "f"

    class K:
        def __init__(self):
            self.k = 3.0

        def run(self, x):
            return x * self.k

    k = K()
    g = er.compile(k.run, backend="eager")
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 3.0))
    k.k = 4.0
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 4.0))
    assert len(g.history.graphs) == 2


def test_backend_and_mode_validation() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        er.compile(lambda x: x, backend="nope")
    with pytest.raises(ValueError, match="unknown mode"):
        er.compile(lambda x: x, mode="fast")

    seen = []

    def my_backend(module, example_inputs):
        seen.append(str(module))

        def run(inputs):
            return [inputs[0] * 0 + 7.0]
        return run

    c = er.compile(lambda x: x + 1, backend=my_backend)
    assert c(torch.ones(2)).tolist() == [7.0, 7.0]
    assert "aten.add.Tensor" in seen[0]


def test_ember_dump_replays_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    m = Net()
    c = er.compile(m, backend="eager")
    x = torch.randn(3, 4)
    y = c(x)
    c(torch.randn(6, 4))  # a second graph
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "forward_0.ir" in files and "forward_1.ir" in files
    assert "forward_0.inputs.safetensors" in files and "forward_0.guards.txt" in files
    text = (tmp_path / "forward_0.ir").read_text()
    verify(parse(text))
    inputs = load_file(str(tmp_path / "forward_0.inputs.safetensors"))
    assert set(inputs) == {"l_x", "l_self_fc1_weight", "l_self_fc1_bias", "l_self_fc2_weight",
                           "l_self_fc2_bias"}
    torch.testing.assert_close(inputs["l_self_fc1_weight"], m.fc1.weight.detach())
    out = tmp_path / "replay.safetensors"
    rc = cli.main(["run", str(tmp_path / "forward_0.ir"), "--inputs",
                   str(tmp_path / "forward_0.inputs.safetensors"), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    replay = load_file(str(out))["out0"]
    assert torch.equal(replay, y.detach())  # bitwise: same backend, same machine
    dumped = load_file(str(tmp_path / "forward_0.outputs.safetensors"))["out0"]
    assert torch.equal(dumped, y.detach())
    assert "self.fc1.weight: tensor" in (tmp_path / "forward_0.guards.txt").read_text()


def test_dump_of_lifted_constant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))

    def f(x):
        return x * torch.tensor([1.0, 2.0, 3.0])

    y = er.compile(f, backend="eager")(torch.ones(3))
    inputs = load_file(str(tmp_path / "f_0.inputs.safetensors"))
    assert set(inputs) == {"l_x", "c_tensor"}
    assert inputs["c_tensor"].tolist() == [1.0, 2.0, 3.0]
    assert y.tolist() == [1.0, 2.0, 3.0]


def test_prims_backend_from_the_ir_registry() -> None:
    from ember.runtime.testing import check_against_eager

    m = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    h = check_against_eager(m, torch.randn(2, 3), backend="prims", grad=True)
    assert not any("not built yet" in n for n in h.notes)  # a real backend
    assert any("backend 'prims' ran it" in n for n in h.notes)  # explain says what ran it


SCRIPT = '''
import torch

def model(x, scale=1.0):
    return torch.relu(x) * scale

def example_inputs():
    return (torch.randn(2, 3),), {"scale": 2.0}
'''


def test_cli_explain_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    assert cli.main(["explain", f"{script}:model"]) == 0
    out = capsys.readouterr().out
    assert "1 graph(s)" in out and "aten.relu.default" in out and "scale == 2.0" in out
    assert cli.main(["explain", f"{script}:missing"]) == 1
    assert "defines no 'missing'" in capsys.readouterr().err
    assert cli.main(["explain", f"{tmp_path / 'nope.py'}:model"]) == 1
