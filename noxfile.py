"""nox sessions for ember. Run them through `python3 dev.py SESSION [-- ARGS]`.

All sessions share the one environment `.venv/` (python=False: nox makes no venvs of its own) and
call the tools in `.venv/bin/`. `dev` (re)installs that environment with tools/bootstrap.py, the
same code that dev.py runs before every session. `tests` also runs EXTRA_TESTS on the other
Pythons capture supports, each in its own venv made by the same code (`.venv-py312/`, ...).
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


# What `tests` runs on each of bootstrap.EXTRA_PYTHONS: capture's opcode tables, resume
# bytecode and functionalization are per Python version; the end-to-end files compile through
# capture (graph breaks, side effects, guards, the Python-construct corpus) and inductor.
EXTRA_TESTS = (
    "packages/capture/tests",
    "packages/runtime/tests/test_graph_breaks.py",
    "packages/runtime/tests/test_side_effects.py",
    "packages/runtime/tests/test_compile_guards.py",
    "packages/runtime/tests/test_compile_corpus_python.py",
    "packages/runtime/tests/test_inductor_end_to_end.py",
)


def _bin(name: str, venv: Path = bootstrap.VENV) -> str:
    return str(bootstrap.venv_bin(name, venv))


def _show(session: nox.Session, cmd: list[str]) -> None:
    session.log(
        "$ " + " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd)
    )


def _call(session: nox.Session, cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run a command, streaming its output; return its exit code (do not raise)."""
    _show(session, cmd)
    return subprocess.call(cmd, cwd=ROOT, env={**os.environ, **(env or {})})


def _pytest(session: nox.Session, args: list[str], env: dict[str, str],
            venv: Path = bootstrap.VENV) -> tuple[int, str]:
    """Run pytest streaming its output; return (exit code, its closing summary line)."""
    cmd = [_bin("pytest", venv), *args]
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
    """ruff check, mypy, pytest (hypothesis profile `ci`), then EXTRA_TESTS on each other Python
    (skipped, with the reason, where it or a CPU torch for it is missing; not run when pytest
    arguments are given); fails if any of them failed."""
    status = {
        "ruff check": _call(session, [_bin("ruff"), "check", "."]),
        "mypy": _call(session, [_bin("mypy")]),
    }
    status["pytest"], summary = _pytest(session, list(session.posargs), _profile("ci"))
    extras = _extra_pythons(session)
    failed = [name for name, code in status.items() if code != 0]
    failed += [name for name, (code, _) in extras.items() if code]
    words = [f"{name}: {'FAILED' if code else 'ok'}" for name, code in status.items()]
    words += [f"{name}: {'skipped' if code is None else 'FAILED' if code else 'ok'}"
              for name, (code, _) in extras.items()]
    print(f"\n[ember] tests: {', '.join(words)}")
    for name, (_, line) in extras.items():
        print(f"[ember] {name}: {line}")
    print(summary, flush=True)  # pytest's summary is the last thing printed
    if failed:
        session.error(f"failed: {', '.join(failed)}")


def _extra_pythons(session: nox.Session) -> dict[str, tuple[int | None, str]]:
    """Per other Python: (pytest's exit code, its summary line), or (None, why skipped)."""
    out: dict[str, tuple[int | None, str]] = {}
    for version in bootstrap.EXTRA_PYTHONS:
        name = "python{}.{}".format(*version)
        if session.posargs:
            out[name] = (None, "not run (pytest arguments were given)")
            continue
        extra = bootstrap.ensure_extra(version, log=session.log)
        if extra.venv is None:
            session.log(f"{name}: skipped: {extra.reason}")
            out[name] = (None, f"skipped: {extra.reason}")
            continue
        code, line = _pytest(session, list(EXTRA_TESTS), _profile("ci"), extra.venv)
        out[name] = (code, line)
    return out


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
