"""Create and update the one development environment, `.venv/` at the repo root.

Used by `dev.py` (the README's entry point) and by the nox session `dev`. Needs only python3 (with
its venv module), pip and network access to the package index. Every ember package is installed
editable (and the worked plugin under examples/), with the umbrella's `dev` extra, in ONE pip command
under constraints.txt, so the local dists satisfy each other and torch stays on the pinned CPU
build. Layers with a `test` extra are installed with it: ember-testing (packages/testing/, the op
database), test support that is no layer's dependency, comes in that way.

`.venv/.ember-stamp` holds a hash of everything that decides what gets installed (the pyproject
files, constraints.txt, this file, the venv's Python version); when it matches, nothing is run.

The other Pythons capture supports (EXTRA_PYTHONS) get venvs of their own, `.venv-py312/` and
`.venv-py313/`, installed by the same code (`ensure_extra`), for the capture and end-to-end tests
that `dev.py test` also runs on them, wherever that Python exists (else it is reported as
skipped, with the reason). Their torch is the pinned one: a CPU wheel where pip's find-links has
one, else the package index's build (on Linux PyPI's is the CUDA build, ~4.7 GB with its nvidia-*
libraries, which runs on a CPU-only machine). An existing venv whose stamp matches is reused as
it is; a stale one is updated in place (pip keeps a torch that already matches the pin).
EMBER_EXTRA_PYTHONS picks them (`3.13`, `3.12,3.13`; `none` skips them all, with that reason).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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
# Pythons besides the main one whose capture and end-to-end tests `dev.py test` runs (issue 18)
EXTRA_PYTHONS = ((3, 12), (3, 13))
# what their venvs take of the `dev` extra: the test runner and what those tests import,
# Hugging Face modeling code included (no linters, Triton or plotting: a smaller install)
EXTRA_DEV = ("pytest", "hypothesis", "numpy", "networkx", "safetensors", "transformers")

Log = Callable[[str], object]


def _log(msg: str) -> None:
    print(f"[ember] {msg}", flush=True)


def venv_bin(name: str, venv: Path = VENV) -> Path:
    """Path of an executable installed in the environment, e.g. venv_bin("pytest")."""
    return venv / "bin" / name


def stamp_inputs() -> list[Path]:
    """The files whose content decides what the environment holds."""
    files = [ROOT / "pyproject.toml", CONSTRAINTS, Path(__file__).resolve()]
    files += [ROOT / "packages" / name / "pyproject.toml" for name in PACKAGES + TEST_PACKAGES]
    files += [ROOT / "examples" / name / "pyproject.toml" for name in EXAMPLES]
    return files


def _python_version(python: str | Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import sys; print(*sys.version_info[:2], sep='.')"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def fingerprint(venv: Path = VENV) -> str:
    h = hashlib.sha256()
    h.update(f"python {_python_version(venv_bin('python', venv))}\n".encode())
    for path in stamp_inputs():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def extras(name: str) -> list[str]:
    """The optional-dependency groups of packages/<name>/ that the dev set-up installs."""
    with open(ROOT / "packages" / name / "pyproject.toml", "rb") as f:
        groups = tomllib.load(f)["project"].get("optional-dependencies", {})
    return [g for g in ("test",) if g in groups]


def dev_requirements(names: tuple[str, ...]) -> list[str]:
    """The requirements of the umbrella's `dev` extra for the distributions `names`."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        reqs: list[str] = tomllib.load(f)["project"]["optional-dependencies"]["dev"]
    return [r for r in reqs if re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0] in names]


def install_command(venv: Path = VENV) -> list[str]:
    """`.venv/`: everything; another Python's venv: the packages and what EXTRA_TESTS need."""
    cmd = [str(venv_bin("python", venv)), "-m", "pip", "install", "--progress-bar", "off"]
    cmd += ["-q"] if venv == VENV else []  # another Python's output is a log file: keep it all
    cmd += ["-c", str(CONSTRAINTS)]
    for name in PACKAGES + TEST_PACKAGES:
        wanted = extras(name)
        cmd += ["-e", str(ROOT / "packages" / name) + (f"[{','.join(wanted)}]" if wanted else "")]
    if venv != VENV:
        return cmd + dev_requirements(EXTRA_DEV)
    for name in EXAMPLES:
        cmd += ["-e", str(ROOT / "examples" / name)]
    cmd += ["-e", f"{ROOT}[dev]"]
    return cmd


def is_current(venv: Path = VENV) -> bool:
    """True when the venv exists and its stamp matches the current inputs."""
    stamp = venv / STAMP.name
    if not venv_bin("python", venv).exists() or not stamp.exists():
        return False
    return stamp.read_text().strip() == fingerprint(venv)


def ensure(force: bool = False, log: Log = _log, venv: Path = VENV,
           python: str = sys.executable, out: IO[str] | None = None) -> Path:
    """Make `venv` (`.venv/`) hold every ember package (editable) plus the dev tools, built with
    `python`; return its path. `out`: where venv's and pip's output go (default: this process's).

    Creates the venv when missing; (re)installs when the stamp is stale or `force` is set;
    otherwise returns at once.
    """
    if sys.version_info < MIN_PYTHON:
        raise SystemExit(f"ember needs Python >= 3.11; this is {sys.version.split()[0]}")
    name = f"{venv.relative_to(ROOT)}/"
    stamp = venv / STAMP.name
    if not venv_bin("python", venv).exists():
        log(f"creating {name} with {python}")
        subprocess.run([python, "-m", "venv", str(venv)], check=True, stdout=out, stderr=out)
    elif not force and is_current(venv):
        log(f"{name} is up to date")
        return venv
    tools = "dev" if venv == VENV else "test"
    log(f"installing all ember packages (editable) + {tools} tools into {name} (first time: "
        f"minutes)")
    stamp.unlink(missing_ok=True)  # a failed install must not leave a valid stamp behind
    subprocess.run(install_command(venv), check=True, cwd=ROOT, stdout=out, stderr=out)
    stamp.write_text(fingerprint(venv) + "\n")
    log(f"installed; {name}bin/ember is the CLI")
    return venv


# -- the other Pythons ------------------------------------------------------------------------
@dataclass(frozen=True)
class Extra:
    """One of EXTRA_PYTHONS: its venv when ready; else why not, and whether that is a failure
    (its install failed) or a skip (no such Python here, or not wanted)."""

    version: tuple[int, int]
    venv: Path | None
    reason: str = ""
    failed: bool = False
    seconds: float = 0.0  # how long setting the venv up took

    @property
    def name(self) -> str:
        return "python{}.{}".format(*self.version)


def extra_venv(version: tuple[int, int]) -> Path:
    return ROOT / ".venv-py{}{}".format(*version)


def install_log(version: tuple[int, int]) -> Path:
    """Where `ensure_extra` writes venv's and pip's output (it may run in the background)."""
    return extra_venv(version) / "ember-install.log"


def wanted_extras(env: str | None = None) -> dict[tuple[int, int], str]:
    """EXTRA_PYTHONS -> "" when wanted, else why skipped, from EMBER_EXTRA_PYTHONS (unset: all;
    `none`: none; else the versions it lists, `3.12,3.13`)."""
    env = os.environ.get("EMBER_EXTRA_PYTHONS") if env is None else env
    if env is None:
        return {v: "" for v in EXTRA_PYTHONS}
    picked = {w.strip() for w in env.replace(",", " ").split()} - {"none"}
    unknown = picked - {"{}.{}".format(*v) for v in EXTRA_PYTHONS}
    if unknown:
        raise SystemExit(f"EMBER_EXTRA_PYTHONS={env!r}: {', '.join(sorted(unknown))} is not one "
                         f"of {', '.join('{}.{}'.format(*v) for v in EXTRA_PYTHONS)} (or `none`)")
    return {v: "" if "{}.{}".format(*v) in picked else f"EMBER_EXTRA_PYTHONS={env}"
            for v in EXTRA_PYTHONS}


def find_python(version: tuple[int, int]) -> str | None:
    """An interpreter of `version`: `python3.X` on PATH, else pyenv's newest 3.X.* (its shims
    answer only for the selected version, so the install directories are looked in)."""
    exe = "python{}.{}".format(*version)
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    found = sorted(glob.glob(f"{root}/versions/{version[0]}.{version[1]}.*/bin/{exe}"),
                   key=lambda p: [int(x) if x.isdigit() else 0
                                  for x in Path(p).parts[-3].split(".")], reverse=True)
    for cand in [shutil.which(exe), *found]:
        if cand is None:
            continue
        try:
            if _python_version(cand) == "{}.{}".format(*version):
                return cand
        except (OSError, subprocess.CalledProcessError):  # a pyenv shim of another version
            continue
    return None


def torch_pin() -> str:
    """The torch requirement of constraints.txt (`torch==2.13.0`)."""
    for line in CONSTRAINTS.read_text().splitlines():
        req = line.split("#", 1)[0].strip()
        if req.startswith("torch") and req[5:6] in ("=", "<", ">", "~", "!"):
            return req
    return "torch"


def ensure_extra(version: tuple[int, int], python: str | None = None) -> Extra:
    """Set up the venv of one of EXTRA_PYTHONS as `ensure` does `.venv/` (with `python`, by
    default `find_python`'s), all its output into `install_log(version)` (so it can run beside
    a test run), or say why not."""
    name = Extra(version, None).name
    python = python or find_python(version)
    if python is None:
        return Extra(version, None, f"no {name} on this machine")
    venv = extra_venv(version)
    start = time.monotonic()
    venv.mkdir(exist_ok=True)  # `python -m venv` fills an existing directory; the log goes in it
    with open(install_log(version), "w") as out:

        def log(msg: str) -> None:
            out.write(f"[ember] {msg}\n")
            out.flush()

        log(f"{name} is {python}; torch is {torch_pin()}: a CPU wheel from pip's find-links "
            f"where there is one, else the index's build (PyPI's: CUDA, ~4.7 GB, runs on CPU)")
        try:
            ensure(log=log, venv=venv, python=python, out=out)
        except (subprocess.CalledProcessError, OSError) as e:
            code = f"exit {e.returncode}" if isinstance(e, subprocess.CalledProcessError) else e
            return Extra(version, None, f"setting up {venv.name}/ failed ({code}); its output is "
                         f"in {install_log(version).relative_to(ROOT)}", failed=True,
                         seconds=time.monotonic() - start)
    return Extra(version, venv, seconds=time.monotonic() - start)


if __name__ == "__main__":
    ensure(force="--force" in sys.argv[1:])
