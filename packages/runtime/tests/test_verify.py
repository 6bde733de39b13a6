"""`ember verify`: one line per check, FAIL with a fix and exit status 1 when a required check
fails (a missing or broken C++ compiler, torch outside the declared range, an unsafe kernel
cache, a compile that fell back to eager), notes for optional targets, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ember.runtime import cli, demo, verify
from ember.runtime.verify import Result


def _clean_env(tmp_path: Path, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_CXX", "PATH")}
    env.update(PATH=path, EMBER_CACHE_DIR=str(tmp_path / "cache"))
    return env


def test_happy_path_here(capsys: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))  # a fresh cache: real builds
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path / "dump"))
    assert cli.main(["verify"]) == 0
    out = capsys.readouterr().out.splitlines()
    names = [name for name, _ in verify.CHECKS]
    assert len(out) == len(names) + 1
    for line, name in zip(out, names, strict=False):
        assert line.split()[0] in ("ok", "note") and name in line
    text = "\n".join(out)
    assert "compiled to 1 C++ kernel(s); matches eager" in text
    assert "ok   kernel cache" in text and "mode 700" in text
    assert "note cuda target" in text and "not built yet" in text
    assert out[-1].startswith("ember verify: this installation works")
    # the probe is verify's, not the user's: nothing is dumped, EMBER_DUMP is left set
    assert not (tmp_path / "dump").exists() and os.environ["EMBER_DUMP"] == str(tmp_path / "dump")


def test_fake_compiler_fails_with_a_fix(tmp_path: Path) -> None:
    # the inductor runs $EMBER_CXX, else g++ from PATH: a PATH holding only a g++ that exits 1,
    # EMBER_CXX unset (a fresh process: the compiler's identity is cached per process)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "g++").write_text("#!/bin/sh\nexit 1\n")
    (bindir / "g++").chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "ember.runtime.verify"], capture_output=True,
                       text=True, env=_clean_env(tmp_path, str(bindir)), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    cxx = next(ln for ln in lines if ln.startswith("FAIL c++ compiler"))
    assert f"`{bindir}/g++ --version` printed nothing: not a working compiler" in cxx
    assert "— install g++ (Debian: apt install g++) or set EMBER_CXX" in cxx
    assert any(ln.startswith("FAIL cpu target") and "not tried: needs c++ compiler" in ln
               for ln in lines)
    assert any(ln.startswith("ok   python") for ln in lines)
    assert lines[-1].startswith("ember verify: FAILED") and "c++ compiler" in lines[-1]


def test_no_compiler_on_path_fails_with_a_fix(tmp_path: Path, monkeypatch: Any,
                                              capsys: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory
    monkeypatch.delenv("EMBER_CXX", raising=False)
    monkeypatch.setattr(verify, "CHECKS", [c for c in verify.CHECKS if c[0] in
                                           ("python", "c++ compiler", "openmp", "cpu target")])
    assert cli.main(["verify"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("FAIL c++ compiler g++ not found on PATH — install g++ (Debian: apt "
                      "install g++) or set EMBER_CXX to a C++17 compiler")
    assert out[2] == "FAIL openmp       not tried: needs c++ compiler (see above)"
    assert out[-1] == ("ember verify: FAILED (1 ok, 0 note(s), 3 failed): c++ compiler, "
                       "openmp, cpu target")


def test_torch_outside_the_declared_range(monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setattr(verify, "torch_version", lambda: "2.1.0")
    monkeypatch.setattr(verify, "CHECKS", verify.CHECKS[:2])
    assert verify.verify() == 1
    out = capsys.readouterr().out
    assert "ok   python" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("FAIL torch"))
    # the range comes from the packages' metadata (they declare torch>=2.9)
    assert "2.1.0 is outside the supported range >=2.9" in line
    assert "install torch>=2.9" in line
    assert out.splitlines()[-1] == "ember verify: FAILED (1 ok, 0 note(s), 1 failed): torch"


def test_python_outside_the_declared_range(monkeypatch: Any) -> None:
    monkeypatch.setattr(verify, "python_version", lambda: "3.10.4")
    [r] = verify.run_checks([("python", verify.check_python)])
    assert r.status == "fail" and "3.10.4 is outside the supported range >=3.11" in r.found


def test_a_compile_that_fell_back_to_eager_fails(monkeypatch: Any) -> None:
    compile_mod = sys.modules["ember.runtime.compile"]  # the package's `compile` shadows it

    def broken(module: Any, *a: Any) -> Any:
        raise RuntimeError("no C++ today")

    # load_module builds and loads the generated C++ (the CPU target's loader); its failure
    # makes compile() run the graph on the eager backend, a fallback
    monkeypatch.setattr(compile_mod, "load_module", broken)
    [r] = verify.run_checks([("cpu target", verify.check_cpu_target)])
    assert r.status == "fail"
    assert "did not run compiled C++" in r.found and "no C++ today" in r.found


def test_unsafe_kernel_cache_fails(tmp_path: Path, monkeypatch: Any) -> None:
    d = tmp_path / "inductor"
    d.mkdir(mode=0o700)
    d.chmod(0o777)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    [r] = verify.run_checks([("kernel cache", verify.check_cache)])
    assert r.status == "fail" and "is not used" in r.found and "writable by" in r.found
    assert f"chmod 700 {d}" in r.fix


def test_read_only_kernel_cache_is_a_note(tmp_path: Path, monkeypatch: Any) -> None:
    d = tmp_path / "inductor"
    d.mkdir(mode=0o500)
    real_access = os.access

    def access(path: Any, mode: int, **kw: Any) -> bool:  # root ignores the mode bits
        if Path(path) == d and mode & os.W_OK:
            return False
        return real_access(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    try:
        [r] = verify.run_checks([("kernel cache", verify.check_cache)])
    finally:
        d.chmod(0o700)
    assert r.status == "note" and "read-only" in r.found and "chmod u+w" in r.fix


def test_a_check_that_raises_is_one_fail_line() -> None:
    def boom(done: Any) -> Result:
        raise OSError("disk on fire\nsecond line")

    results = verify.run_checks([("boom", boom), ("python", verify.check_python)])
    assert results[0] == Result("boom", "fail", "OSError: disk on fire")
    assert results[1].status == "ok"  # the later checks still run
    assert verify.report(results).splitlines()[0] == "FAIL boom   OSError: disk on fire"


def test_demo_stops_when_a_required_check_fails(monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setattr(verify, "run_checks", lambda: [
        Result("python", "ok", "3.11.7"),
        Result("c++ compiler", "fail", "g++ not found on PATH", "install g++")])
    assert demo.main(["--small"]) == 1
    out = capsys.readouterr().out
    assert "  FAIL c++ compiler g++ not found on PATH — install g++" in out
    assert "demo: stopped" in out and "part 1" not in out


_VERSIONS = st.lists(st.integers(0, 12), min_size=1, max_size=4).map(
    lambda v: ".".join(map(str, v)))


@given(_VERSIONS, _VERSIONS, st.sampled_from(["==", "!=", "<=", ">=", "<", ">", "~="]),
       st.booleans())
def test_satisfies_agrees_with_pep440(v: str, bound: str, op: str, star: bool) -> None:
    specifiers = pytest.importorskip("packaging.specifiers")
    if op == "~=" and "." not in bound:
        return  # not a valid PEP 440 clause
    spec = f"{op}{bound}" + (".*" if star and op in ("==", "!=") else "")
    assert verify.satisfies(v, spec) == (v in specifiers.SpecifierSet(spec))


def test_satisfies_ignores_local_parts_and_rejects_what_it_cannot_read() -> None:
    assert verify.satisfies("2.13.0+cpu", ">=2.9,<3")
    assert not verify.satisfies("2.8.1", ">=2.9")
    with pytest.raises(ValueError):
        verify.satisfies("2.9", ">=2.9; python_version > '3'")
