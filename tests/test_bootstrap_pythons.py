"""The other Pythons of `dev.py test` (tools/bootstrap.py, noxfile.py): found where they are
installed, each skipped with its reason where it or a CPU torch for it is missing, never
silently."""

from __future__ import annotations

import sys
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
