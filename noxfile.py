"""nox sessions for ember. Run them through `python3 dev.py SESSION [-- ARGS]`.

All sessions share the one environment `.venv/` (python=False: nox makes no venvs of its own) and
call the tools in `.venv/bin/`. `dev` (re)installs that environment with tools/bootstrap.py, the
same code that dev.py runs before every session. `tests` also runs EXTRA_TESTS on the other
Pythons capture supports, each in its own venv made by the same code (`.venv-py312/`, ...) on a
background thread while the main suite runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeAlias

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from tools import bootstrap  # noqa: E402

nox.options.sessions = ["tests"]


# What `tests` runs on each of bootstrap.EXTRA_PYTHONS: capture's opcode tables, resume
# bytecode and functionalization are per Python version. The end-to-end files compile real
# programs and models through capture (graph breaks, side effects, guards, fallbacks, the
# Python-construct and nn.Module corpora, Hugging Face models' own Python) and the C++ inductor.
# ~6 min per Python on the loaded 2-core machine; the rest of runtime's tests is ~10x that.
EXTRA_TESTS = (
    "packages/capture/tests",
    "packages/runtime/tests/test_graph_breaks.py",
    "packages/runtime/tests/test_side_effects.py",
    "packages/runtime/tests/test_compile_guards.py",
    "packages/runtime/tests/test_compile_fallbacks.py",
    "packages/runtime/tests/test_compile_corpus_python.py",
    "packages/runtime/tests/test_compile_corpus_modules.py",
    "packages/runtime/tests/test_hf_models.py",
    "packages/runtime/tests/test_compile_inductor.py",
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
    (their venvs are set up meanwhile, in the background; skipped, with the reason, where that
    Python is missing; not run when pytest arguments are given); fails if any of them failed."""
    pending = _start_extra_pythons(session)
    status = {
        "ruff check": _call(session, [_bin("ruff"), "check", "."]),
        "mypy": _call(session, [_bin("mypy")]),
    }
    status["pytest"], summary = _pytest(session, list(session.posargs), _profile("ci"))
    extras = _finish_extra_pythons(session, pending)
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


# Another Python's state between the two halves: its set-up under way, or why it is not run.
Pending: TypeAlias = "dict[str, Future[bootstrap.Extra] | str]"


def _start_extra_pythons(session: nox.Session) -> Pending:
    """Start setting up the venvs of the wanted EXTRA_PYTHONS, one after another on a background
    thread (their output goes to each venv's ember-install.log, not between pytest's lines)."""
    out: Pending = {}
    wanted = bootstrap.wanted_extras()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-extra-python")
    for version in bootstrap.EXTRA_PYTHONS:
        name = "python{}.{}".format(*version)
        if session.posargs:
            out[name] = "not run (pytest arguments were given)"
        elif wanted[version]:
            out[name] = f"skipped: {wanted[version]}"
        elif (python := bootstrap.find_python(version)) is None:
            out[name] = f"skipped: no {name} on this machine"
        else:
            session.log(f"{name}: setting up {bootstrap.extra_venv(version).name}/ in the "
                        f"background (log: {bootstrap.install_log(version).relative_to(ROOT)})")
            out[name] = pool.submit(bootstrap.ensure_extra, version, python)
    pool.shutdown(wait=False)  # the submitted set-ups still run; the pool takes no more
    return out


def _finish_extra_pythons(session: nox.Session, pending: Pending
                          ) -> dict[str, tuple[int | None, str]]:
    """Per other Python: (pytest's exit code, its summary line); (1, why) when its set-up
    failed; (None, why) when skipped."""
    out: dict[str, tuple[int | None, str]] = {}
    for name, job in pending.items():
        if isinstance(job, str):
            session.log(f"{name}: {job}")
            out[name] = (None, job)
            continue
        if not job.done():
            session.log(f"{name}: waiting for its venv's set-up")
        extra = job.result()
        if extra.venv is None:
            session.log(f"{name}: {'FAILED' if extra.failed else 'skipped'}: {extra.reason}")
            if extra.failed:
                _show_tail(bootstrap.install_log(extra.version))
            out[name] = (1 if extra.failed else None,
                         f"{'FAILED' if extra.failed else 'skipped'}: {extra.reason}")
            continue
        session.log(f"{name}: {extra.venv.name}/ ready ({extra.seconds / 60:.1f} min)")
        code, line = _pytest(session, list(EXTRA_TESTS), _profile("ci"), extra.venv)
        out[name] = (code, f"{line.strip('= ')} (venv set-up {extra.seconds / 60:.1f} min)")
    return out


def _extra_pythons(session: nox.Session) -> dict[str, tuple[int | None, str]]:
    """Both halves at once: set up, then run EXTRA_TESTS, on each other Python."""
    return _finish_extra_pythons(session, _start_extra_pythons(session))


def _show_tail(log: Path, lines: int = 40) -> None:
    if log.exists():
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- last {len(tail)} lines of {log.relative_to(ROOT)} ---", *tail, sep="\n")


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
