"""Dumps of symbolic graphs replay with `ember run` for any binding of the symbols (issue 17):
the dumped aten graph, run at sizes other than the captured call's, gives eager's results on the
reference, eager and inductor backends; a Python int argument's size carrier binds its symbol."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import ember.runtime as er
from ember.runtime import cli


def norm_rows(x: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],)).softmax(-1)
    return y.view(x.shape[0], -1).sum(-1) + x.amax(0).sum()


def with_int(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.sum(-1, keepdim=True) * n + torch.arange(n) / n


def _dump(fn: object, args: tuple[object, ...], d: Path) -> Path:
    cf = er.compile(fn, dynamic=True, backend="eager", options={"dump_dir": str(d)})
    with torch.no_grad():
        cf(*args)
    (ir,) = [p for p in d.glob("*.ir") if not p.name.endswith(".kernels.ir")]
    assert "symbol s0" in ir.read_text()
    return ir


@pytest.mark.parametrize("backend", ["reference", "eager", "inductor"])
def test_symbolic_dump_replays_at_other_sizes(tmp_path: Path, backend: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ir = _dump(norm_rows, (torch.randn(5, 8),), tmp_path / "d")
    for rows, cols in ((3, 8), (13, 21)):
        x = torch.randn(rows, cols)
        ins, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
        save_file({"l_x": x}, str(ins))
        rc = cli.main(["run", str(ir), "--inputs", str(ins), "--backend", backend,
                       "--out", str(out)])
        capsys.readouterr()
        assert rc == 0
        torch.testing.assert_close(load_file(str(out))["out0"], norm_rows(x), rtol=1e-5,
                                   atol=1e-5)


def test_int_argument_dump_replays_with_a_carrier_of_any_length(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ir = _dump(with_int, (torch.randn(3, 8), 5), tmp_path / "d")
    assert "%l_n_size: u8[" in ir.read_text()
    x = torch.randn(4, 6)
    ins, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"l_x": x, "l_n_size": torch.zeros(11, dtype=torch.uint8)}, str(ins))
    rc = cli.main(["run", str(ir), "--inputs", str(ins), "--backend", "inductor", "--out",
                   str(out)])
    capsys.readouterr()
    assert rc == 0
    torch.testing.assert_close(load_file(str(out))["out0"], with_int(x, 11))
