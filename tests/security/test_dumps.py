"""Issue 19 #8, #12, #17: EMBER_DUMP shared by several processes keeps every dump whole and
distinct; an unusable dump directory never breaks the user's call; every compiled graph, resume
functions included, writes its kernels dump."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ember.runtime as er
from ember.runtime import dump


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    dump._WARNED.clear()


def _f(x):
    return x * 3 + 1


# -- #8: one directory, several processes -----------------------------------------------------
WORKER = r"""
import os, time
from pathlib import Path
import torch
import ember.runtime as er

def f(x):
    return x * 3 + 1

os.environ["EMBER_DUMP"] = DUMP
# static shapes: each new shape is a new capture, so a new dump (automatic dynamic shapes
# would capture one symbolic graph for sizes 2-4)
c = er.compile(f, backend="eager", dynamic=False)
while not Path(GO).exists():  # start together: the race is the point
    time.sleep(0.005)
for k in range(4):
    c(torch.full((k + 1,), float(ME)))
"""


def test_processes_sharing_a_dump_dir_keep_every_dump_whole(tmp_path: Path) -> None:
    """The issue's reproducer: several processes dump into one directory at once. Every dump
    survives under its own stem, and each dump's outputs are f(its inputs). The processes are
    forked from a forkserver that imported ember once (a fresh interpreter each would spend
    most of the test importing torch)."""
    out, go = tmp_path / "dumps", tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "ember.runtime"])
    n = 4
    procs = [ctx.Process(target=runpy.run_path, args=(str(script),),
                         kwargs={"init_globals": {"ME": i, "GO": str(go), "DUMP": str(out)}})
             for i in range(n)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    go.touch()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    stems = sorted(p.name.removesuffix(".ir") for p in out.glob("f_*.ir"))
    assert len(stems) == 4 * n, stems
    seen = set()
    for s in stems:
        x = load_file(str(out / f"{s}.inputs.safetensors"))["l_x"]
        y = load_file(str(out / f"{s}.outputs.safetensors"))["out0"]
        assert torch.equal(y, _f(x)), s  # inputs and outputs of the same call
        assert (out / f"{s}.guards.txt").read_text() and (out / f"{s}.ir").read_text()
        seen.add((int(x[0]), x.numel()))
    assert seen == {(i, k + 1) for i in range(n) for k in range(4)}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_stems_are_claimed_once_across_threads(tmp_path: Path) -> None:
    got: list[str] = []
    lock = threading.Lock()

    def claim() -> None:
        for _ in range(20):
            s = dump._claim_stem(tmp_path, "g")
            with lock:
                got.append(s)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 80


# -- #12: an unusable directory ---------------------------------------------------------------
def _unusable(tmp_path: Path, kind: str) -> Path:
    if kind == "file":
        p = tmp_path / "dump.txt"
        p.write_text("a file")
        return p
    if kind == "under a file":
        p = tmp_path / "f"
        p.write_text("a file")
        return p / "dumps"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["file", "under a file"])
def test_unusable_dump_dir_never_breaks_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 kind: str) -> None:
    """The issue's reproducer: EMBER_DUMP at a file (or a path under one). The call's result is
    eager's; one DumpWarning says why; later captures behave the same (no exception, no second
    warning for the same problem)."""
    target = _unusable(tmp_path, kind)
    monkeypatch.setenv("EMBER_DUMP", str(target))
    c = er.compile(_f, backend="eager")
    x = torch.randn(3)
    with pytest.warns(dump.DumpWarning, match="is unusable .*not a directory|Not a directory") \
            as got:
        torch.testing.assert_close(c(x), _f(x))
    assert len(got) == 1 and "\n" not in str(got[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dump.DumpWarning)
        torch.testing.assert_close(c(x), _f(x))  # a cache hit
        y = torch.randn(5)
        torch.testing.assert_close(c(y), _f(y))  # a new capture: the same problem, no repeat


def test_read_only_dump_dir_never_breaks_the_call(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
            pytest.skip("running as root and `chattr +i` is not allowed: no read-only directory")
    else:
        d.chmod(0o555)
    monkeypatch.setenv("EMBER_DUMP", str(d))
    try:
        x = torch.randn(4)
        with pytest.warns(dump.DumpWarning, match="unusable"):
            torch.testing.assert_close(er.compile(_f, backend="eager")(x), _f(x))
        assert not list(d.iterdir())
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(d)], check=True)
        else:
            d.chmod(0o700)


def test_failing_writes_never_break_the_call(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Any failure while writing (here: a full disk while saving the outputs) is a warning."""
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    real = dump.save_tensors

    def full(path: str, tensors: object) -> None:
        if ".outputs." in path:
            raise OSError(28, "No space left on device", path)
        real(path, tensors)  # type: ignore[arg-type]

    monkeypatch.setattr(dump, "save_tensors", full)
    x = torch.randn(2)
    with pytest.warns(dump.DumpWarning, match="No space left on device"):
        torch.testing.assert_close(er.compile(_f, backend="eager")(x), _f(x))
    assert not list(tmp_path.glob("*.outputs.safetensors"))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# -- #17: resume functions' kernels ------------------------------------------------------------
def _breaks(x):
    y = torch.sin(x) * 2
    print("a graph break")
    return torch.cos(y) + 1


def test_every_compiled_graph_writes_its_kernels_dump(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_cache: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With the inductor backend, the graph before a break and the resume function's graph
    both write NAME.kernels.ir (a replayable compiled module)."""
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    x = torch.randn(6)
    with torch.no_grad():
        torch.testing.assert_close(er.compile(_breaks)(x), _breaks(x))
    capsys.readouterr()
    captured = sorted(p.name for p in tmp_path.glob("*.ir") if not p.name.endswith(".kernels.ir"))
    assert len(captured) == 2 and any(n.startswith("__resume") for n in captured), captured
    for name in captured:
        kernels = tmp_path / name.replace(".ir", ".kernels.ir")
        assert kernels.exists(), name
        assert "kernels.call" in kernels.read_text()
