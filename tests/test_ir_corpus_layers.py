"""The layer corpus (tests/ir_corpus/layers/): prims, loop, fused and kernels modules as ember
once printed them must keep parsing, printing the same, and running to eager's numbers.

Every RUN line of every file runs (the syntax: tests/ir_corpus/runlines.py, docs/ir.md "Golden
corpus and RUN lines"). A run's outputs are compared with eager computed here, on this machine,
within the file's TOLERANCE (bitwise where it says rtol=0 atol=0), and with the stored EXPECT
file, written on another machine, within the aten corpus's CROSS_MACHINE plus TOLERANCE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ember.ir import Kernel, parse, verify
from tests.ir_corpus import make_layers, runlines
from tests.test_ir_corpus import CROSS_MACHINE

LAYERS = make_layers.LAYERS
FILES = sorted(LAYERS.glob("*.ir"))
PROGRAMS = {p.name: p for p in make_layers.programs()}
# Bugs the corpus found, in code this corpus does not own; strict, so a fix says "remove me".
KNOWN_BUGS: dict[tuple[str, int], str] = {}


def _body(path: Path) -> str:
    """The module text after the leading comment block (what ember printed)."""
    lines = path.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    return "".join(lines[i:])


def _cases() -> list[Any]:  # pytest.param objects
    out = []
    for f in FILES:
        for i, r in enumerate(runlines.parse_directives(f).runs, 1):
            bug = KNOWN_BUGS.get((f.name, i))
            marks = [pytest.mark.xfail(reason=bug, strict=True)] if bug else []
            out.append(pytest.param(f, i, id=f"{f.stem}:{i}:{r.words[0]}", marks=marks))
    return out


def test_layer_corpus_covers_every_stage() -> None:
    names = {f.name.split(".")[0] for f in FILES}
    assert names == set(PROGRAMS)
    for name in names:
        for stage in make_layers.STAGES:
            assert (LAYERS / f"{name}.{stage}.ir").exists(), (name, stage)
    prims = parse((LAYERS / "dropout.prims.ir").read_text()).graph("dropout")
    assert [p.name for p in prims.params][-2:] == ["philox_seed", "philox_offset"]
    assert parse((LAYERS / "norm_rows.prims.ir").read_text()).symbols  # symbolic sizes
    for f in LAYERS.glob("*.kernels.ir"):
        assert any(isinstance(it, Kernel) for it in parse(f.read_text()).items.values())
    for f in LAYERS.glob("*.fused.ir"):  # fused text from before schedule-cpu: no sched_* attrs
        assert "sched_" not in f.read_text(), f.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_layer_parses_verifies_and_prints_the_same(path: Path) -> None:
    m = parse(path.read_text())
    verify(m)
    assert str(m) == _body(path)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_todays_dumps_parse_verify_and_print_the_same(name: str, tmp_path: Path) -> None:
    """The stored files are older text on purpose (what ember printed when they were made), so
    they do not check what today's passes print: each stage as make_layers.py would write it now
    must read back byte for byte too."""
    for stage, text in make_layers.dumps(PROGRAMS[name]).items():
        f = tmp_path / f"{name}.{stage}.ir"
        f.write_text(text)
        m = parse(text)
        verify(m)
        assert str(m) == _body(f), (name, stage)


def _close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float,
           atol: float, what: str) -> None:
    assert got.keys() == want.keys(), what
    for k in want:
        def msg(m: str, k: str = k) -> str:
            return f"{what}, {k}: {m}"
        torch.testing.assert_close(got[k], want[k].contiguous(), rtol=rtol, atol=atol,
                                   equal_nan=True, msg=msg)


@pytest.mark.parametrize(("path", "index"), _cases())
def test_layer_run_line(path: Path, index: int, tmp_path: Path) -> None:
    d = runlines.parse_directives(path)
    res = runlines.run_line(d, d.runs[index - 1], tmp_path / "out.safetensors")
    assert res.rc == 0, f"{path.name}:{res.line.lineno}: {res.stderr}"
    if res.out is None:
        return
    assert d.expect is not None
    got = load_file(str(res.out))
    inputs = load_file(str(LAYERS / f"{path.name.split('.')[0]}.in.safetensors"))
    p = PROGRAMS[path.name.split(".")[0]]
    eager_here = p.eager(**{k: v.clone() for k, v in inputs.items()})
    _close(got, eager_here, d.rtol, d.atol, "vs eager here")
    _close(got, load_file(str(d.expect)), CROSS_MACHINE["rtol"] + d.rtol,
           CROSS_MACHINE["atol"] + d.atol, f"vs {d.expect.name}")


def _write(tmp_path: Path, header: str) -> Path:
    f = tmp_path / "m.ir"
    f.write_text(header + "ember.ir 1.0\n")
    return f


def test_run_lines_syntax(tmp_path: Path) -> None:
    f = _write(tmp_path, "# free text: not a directive\n"
                         "# RUN: ember run %s --inputs '%S/a b.in' --out %t --seed 100%%\n"
                         "# EXPECT: a.out.safetensors\n# TOLERANCE: atol=1e-3\n")
    d = runlines.parse_directives(f)
    (r,) = d.runs
    assert r.writes_outputs and (d.rtol, d.atol) == (0.0, 1e-3)
    assert d.expect == tmp_path / "a.out.safetensors"
    assert r.argv(f, Path("/o")) == ["run", str(f), "--inputs", f"{tmp_path}/a b.in",
                                     "--out", "/o", "--seed", "100%"]


@pytest.mark.parametrize(("header", "message"), [
    ("# RUN: ember run %s\n# EXPCT: x\n", "unknown directive EXPCT"),
    ("# RUN: rm -rf /\n", "a RUN line is `ember <command> ...`"),
    ("# RUN: ember run 'unclosed\n", "No closing quotation"),
    ("# RUN: ember run %s --out %t\n", "there is no EXPECT"),
    ("# RUN: ember run %s\n# EXPECT: ../x\n", "one EXPECT: FILE"),
    ("# RUN: ember run %s\n# TOLERANCE: rtol=big\n", "is not a number"),
    ("# just a comment\n", "no RUN lines"),
])
def test_run_lines_are_refused_with_one_line(tmp_path: Path, header: str, message: str) -> None:
    with pytest.raises(runlines.RunLineError, match=message.replace("(", r"\(")):
        runlines.parse_directives(_write(tmp_path, header))
