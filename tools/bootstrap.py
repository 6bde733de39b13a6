"""Create and update the one development environment, `.venv/` at the repo root.

Used by `dev.py` (the README's entry point) and by the nox session `dev`. Needs only python3 (with
its venv module), pip and network access to the package index. Every ember package is installed
editable (and the worked plugin under examples/), with the umbrella's `dev` extra, in ONE pip command
under constraints.txt, so the local dists satisfy each other and torch stays on the pinned CPU
build. Layers with a `test` extra are installed with it: ember-testing (packages/testing/, the op
database), test support that is no layer's dependency, comes in that way.

`.venv/.ember-stamp` holds a hash of everything that decides what gets installed (the pyproject
files, constraints.txt, this file, the venv's Python version); when it matches, nothing is run.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".ember-stamp"
CONSTRAINTS = ROOT / "constraints.txt"
# Install order is irrelevant to pip; listed bottom-up along the package DAG for the reader.
PACKAGES = ("ir", "capture", "prims", "autograd", "inductor", "runtime")
# test support, not library: the `test` extra of the layers whose tests use it
TEST_PACKAGES = ("testing",)
# worked third-party plugin packages, installed so their entry points are tested as a user's
EXAMPLES = ("ember-plugin-example",)
MIN_PYTHON = (3, 11)

Log = Callable[[str], object]


def _log(msg: str) -> None:
    print(f"[ember] {msg}", flush=True)


def venv_bin(name: str) -> Path:
    """Path of an executable installed in the environment, e.g. venv_bin("pytest")."""
    return VENV / "bin" / name


def stamp_inputs() -> list[Path]:
    """The files whose content decides what the environment holds."""
    files = [ROOT / "pyproject.toml", CONSTRAINTS, Path(__file__).resolve()]
    files += [ROOT / "packages" / name / "pyproject.toml" for name in PACKAGES + TEST_PACKAGES]
    files += [ROOT / "examples" / name / "pyproject.toml" for name in EXAMPLES]
    return files


def _venv_python_version() -> str:
    out = subprocess.run(
        [str(venv_bin("python")), "-c", "import sys; print(*sys.version_info[:2], sep='.')"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def fingerprint() -> str:
    h = hashlib.sha256()
    h.update(f"python {_venv_python_version()}\n".encode())
    for path in stamp_inputs():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def extras(name: str) -> list[str]:
    """The optional-dependency groups of packages/<name>/ that the dev set-up installs."""
    with open(ROOT / "packages" / name / "pyproject.toml", "rb") as f:
        groups = tomllib.load(f)["project"].get("optional-dependencies", {})
    return [g for g in ("test",) if g in groups]


def install_command() -> list[str]:
    cmd = [str(venv_bin("python")), "-m", "pip", "install", "--progress-bar", "off", "-q"]
    cmd += ["-c", str(CONSTRAINTS)]
    for name in PACKAGES + TEST_PACKAGES:
        wanted = extras(name)
        cmd += ["-e", str(ROOT / "packages" / name) + (f"[{','.join(wanted)}]" if wanted else "")]
    for name in EXAMPLES:
        cmd += ["-e", str(ROOT / "examples" / name)]
    cmd += ["-e", f"{ROOT}[dev]"]
    return cmd


def is_current() -> bool:
    """True when .venv exists and its stamp matches the current inputs."""
    if not venv_bin("python").exists() or not STAMP.exists():
        return False
    return STAMP.read_text().strip() == fingerprint()


def ensure(force: bool = False, log: Log = _log) -> Path:
    """Make `.venv/` hold every ember package (editable) plus the dev tools; return its path.

    Creates the venv when missing; (re)installs when the stamp is stale or `force` is set;
    otherwise returns at once.
    """
    if sys.version_info < MIN_PYTHON:
        raise SystemExit(f"ember needs Python >= 3.11; this is {sys.version.split()[0]}")
    if not venv_bin("python").exists():
        log(f"creating {VENV.relative_to(ROOT)}/ with {sys.executable}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    elif not force and is_current():
        log(".venv/ is up to date")
        return VENV
    log("installing all ember packages (editable) + dev tools into .venv/ (first time: minutes)")
    STAMP.unlink(missing_ok=True)  # a failed install must not leave a valid stamp behind
    subprocess.run(install_command(), check=True, cwd=ROOT)
    STAMP.write_text(fingerprint() + "\n")
    log("installed; .venv/bin/ember is the CLI")
    return VENV


if __name__ == "__main__":
    ensure(force="--force" in sys.argv[1:])
