"""The other Pythons of `dev.py test` (tools/bootstrap.py, noxfile.py): found where they are
installed, set up in the background while the main suite runs, each skipped with its reason where
it is missing or not wanted (never silently), and a failed set-up fails the run."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import bootstrap  # noqa: E402


class _Session:
    """What the nox session helpers use of nox.Session."""

    def __init__(self, posargs: list[str]):
        self.posargs = posargs
        self.logged: list[str] = []

    def log(self, msg: str) -> None:
        self.logged.append(msg)


def test_the_running_python_is_found() -> None:
    found = bootstrap.find_python(sys.version_info[:2])
    assert found is not None
    assert bootstrap._python_version(found) == "{}.{}".format(*sys.version_info[:2])


def test_a_missing_python_is_skipped_with_its_reason() -> None:
    extra = bootstrap.ensure_extra((3, 99))
    assert extra.venv is None and extra.reason == "no python3.99 on this machine"
    assert not bootstrap.extra_venv((3, 99)).exists()


def test_torch_pin_is_the_constraints_line() -> None:
    pin = bootstrap.torch_pin()
    assert pin.startswith("torch==")
    assert pin in bootstrap.CONSTRAINTS.read_text().splitlines()


def test_every_extra_python_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nox")
    import noxfile

    monkeypatch.delenv("EMBER_EXTRA_PYTHONS", raising=False)
    monkeypatch.setattr(bootstrap, "EXTRA_PYTHONS", ((3, 98), (3, 99)))
    session: Any = _Session([])
    out = noxfile._extra_pythons(session)
    assert out == {f"python3.{m}": (None, f"skipped: no python3.{m} on this machine")
                   for m in (98, 99)}
    assert all("skipped" in line for line in session.logged)
    session = _Session(["tests/some_test.py"])
    assert noxfile._extra_pythons(session) == {
        f"python3.{m}": (None, "not run (pytest arguments were given)") for m in (98, 99)}


def test_extra_tests_exist() -> None:
    import noxfile

    for path in noxfile.EXTRA_TESTS:
        assert (ROOT / path).exists(), path


def test_other_pythons_install_the_packages_and_the_test_tools_only() -> None:
    reqs = bootstrap.dev_requirements(bootstrap.EXTRA_DEV)
    assert len(reqs) == len(bootstrap.EXTRA_DEV), reqs  # each still in the dev extra
    cmd = bootstrap.install_command(bootstrap.extra_venv((3, 13)))
    assert cmd[0] == str(bootstrap.extra_venv((3, 13)) / "bin" / "python")
    assert f"{bootstrap.ROOT}[dev]" not in cmd and set(reqs) <= set(cmd)
    assert str(bootstrap.ROOT / "packages" / "capture") in cmd
    assert f"{bootstrap.ROOT}[dev]" in bootstrap.install_command()


def test_ember_extra_pythons_picks_them() -> None:
    every = {v: "" for v in bootstrap.EXTRA_PYTHONS}
    assert bootstrap.wanted_extras("") == {v: "EMBER_EXTRA_PYTHONS=" for v in every}
    assert bootstrap.wanted_extras("none") == {v: "EMBER_EXTRA_PYTHONS=none" for v in every}
    last = bootstrap.EXTRA_PYTHONS[-1]
    picked = bootstrap.wanted_extras("{}.{}".format(*last))
    assert picked[last] == "" and all(picked[v] for v in every if v != last)
    with pytest.raises(SystemExit, match="3.99 is not one of"):
        bootstrap.wanted_extras("3.12,3.99")


def test_ember_extra_pythons_unset_wants_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_EXTRA_PYTHONS", raising=False)
    assert bootstrap.wanted_extras() == {v: "" for v in bootstrap.EXTRA_PYTHONS}


def test_a_failed_set_up_is_a_failure_with_its_log(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(bootstrap, "ROOT", tmp_path)

    def pip_fails(**kw: Any) -> Path:
        kw["out"].write("ERROR: no matching distribution for torch\n")
        raise subprocess.CalledProcessError(1, ["pip"])

    monkeypatch.setattr(bootstrap, "ensure", pip_fails)
    extra = bootstrap.ensure_extra((3, 99), python=sys.executable)
    assert extra.failed and extra.venv is None
    assert "failed (exit 1)" in extra.reason and ".venv-py399/ember-install.log" in extra.reason
    assert "no matching distribution" in bootstrap.install_log((3, 99)).read_text()


def test_set_up_runs_in_the_background_and_a_failure_fails_the_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("nox")
    import noxfile

    release = threading.Event()
    started: list[tuple[int, int]] = []

    def slow_failing_set_up(version: tuple[int, int], python: str) -> bootstrap.Extra:
        started.append(version)
        assert release.wait(30)
        return bootstrap.Extra(version, None, "setting up failed (exit 1)", failed=True)

    monkeypatch.delenv("EMBER_EXTRA_PYTHONS", raising=False)
    monkeypatch.setattr(bootstrap, "EXTRA_PYTHONS", ((3, 98), (3, 99)))
    monkeypatch.setattr(bootstrap, "find_python", lambda v: None if v == (3, 99) else "py")
    monkeypatch.setattr(bootstrap, "ensure_extra", slow_failing_set_up)
    session: Any = _Session([])
    pending = noxfile._start_extra_pythons(session)  # returns while the set-up still runs
    job = pending["python3.98"]
    assert not isinstance(job, str) and not job.done()
    assert pending["python3.99"] == "skipped: no python3.99 on this machine"
    release.set()
    out = noxfile._finish_extra_pythons(session, pending)
    assert started == [(3, 98)]
    assert out == {"python3.98": (1, "FAILED: setting up failed (exit 1)"),
                   "python3.99": (None, "skipped: no python3.99 on this machine")}


def test_unwanted_pythons_are_skipped_with_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nox")
    import noxfile

    monkeypatch.setenv("EMBER_EXTRA_PYTHONS", "none")
    session: Any = _Session([])
    out = noxfile._extra_pythons(session)
    assert out == {"python{}.{}".format(*v): (None, "skipped: EMBER_EXTRA_PYTHONS=none")
                   for v in bootstrap.EXTRA_PYTHONS}
