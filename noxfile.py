"""nox sessions for ember. Run them through `python3 dev.py SESSION [-- ARGS]`.

All sessions share the one environment `.venv/` (python=False: nox makes no venvs of its own) and
call the tools in `.venv/bin/`. `dev` (re)installs that environment with tools/bootstrap.py, the
same code that dev.py runs before every session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from tools import bootstrap  # noqa: E402

nox.options.sessions = ["tests"]


def _bin(name: str) -> str:
    return str(bootstrap.venv_bin(name))


def _show(session: nox.Session, cmd: list[str]) -> None:
    session.log(
        "$ " + " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd)
    )


def _call(session: nox.Session, cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run a command, streaming its output; return its exit code (do not raise)."""
    _show(session, cmd)
    return subprocess.call(cmd, cwd=ROOT, env={**os.environ, **(env or {})})


def _pytest(session: nox.Session, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run pytest streaming its output; return (exit code, its closing summary line)."""
    cmd = [_bin("pytest"), *args]
    _show(session, cmd)
    last = ""
    with subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if line.strip():
                last = line.rstrip("\n")
    sys.stdout.flush()
    return proc.returncode, last


def _profile(default: str) -> dict[str, str]:
    return {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", default)}


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """ruff check, mypy, pytest (hypothesis profile `ci`); fails if any of the three failed."""
    status = {
        "ruff check": _call(session, [_bin("ruff"), "check", "."]),
        "mypy": _call(session, [_bin("mypy")]),
    }
    status["pytest"], summary = _pytest(session, list(session.posargs), _profile("ci"))
    failed = [name for name, code in status.items() if code != 0]
    report = ", ".join(f"{name}: {'FAILED' if code else 'ok'}" for name, code in status.items())
    print(f"\n[ember] tests: {report}")
    print(summary, flush=True)  # pytest's summary is the last thing printed
    if failed:
        session.error(f"failed: {', '.join(failed)}")


@nox.session(python=False)
def fuzz(session: nox.Session) -> None:
    """Tests marked `fuzz`, under hypothesis profile `fuzz` (long)."""
    code, _ = _pytest(session, ["-m", "fuzz", *session.posargs], _profile("fuzz"))
    if code == 5:
        session.log("no tests are marked fuzz yet")
    elif code:
        session.error("fuzz failed")


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff check (formatting is not enforced)."""
    session.run(_bin("ruff"), "check", *(session.posargs or ["."]), external=True)


@nox.session(python=False)
def typecheck(session: nox.Session) -> None:
    """mypy over packages/*/src (the files and settings in pyproject.toml)."""
    session.run(_bin("mypy"), *session.posargs, external=True)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """benchmarks/run.py: eager vs torch.compile vs ember (args: --suite, --filter, --quick)."""
    runner = ROOT / "benchmarks" / "run.py"
    if not runner.exists():
        session.log("no benchmarks exist yet (benchmarks/run.py is missing)")
        return
    session.run(_bin("python"), str(runner), *session.posargs, external=True)


@nox.session(python=False)
def demo(session: nox.Session) -> None:
    """The end-to-end demo: python -m ember.runtime.demo (a GPT-NeoX and a conv net compiled)."""
    session.run(_bin("python"), "-m", "ember.runtime.demo", *session.posargs, external=True)


@nox.session(python=False)
def dev(session: nox.Session) -> None:
    """(Re)install every package editable + the dev tools into .venv/."""
    bootstrap.ensure(force=True, log=session.log)
