#!/usr/bin/env python3
"""ember's one entry point: set up `.venv/` when needed, then run a nox session in it.

    python3 dev.py demo                 # set up, then run the demo
    python3 dev.py test                 # set up, then ruff + mypy + pytest (what CI runs)
    python3 dev.py SESSION [--] [ARGS]  # any nox session (`nox -l` lists them)
    python3 dev.py dev                  # (re)install everything into .venv/ now

Needs only python3 >= 3.11 with pip; everything else is installed into .venv/.
"""

from __future__ import annotations

import subprocess
import sys

from tools import bootstrap

ALIASES = {"test": "tests"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    session = ALIASES.get(argv[0], argv[0])
    args = argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    try:
        bootstrap.ensure(force=session == "dev")
    except subprocess.CalledProcessError as e:
        print(f"[ember] set-up failed (exit {e.returncode}); see the output above", flush=True)
        return e.returncode or 1
    if session == "dev":
        return 0
    cmd = [str(bootstrap.venv_bin("nox")), "-s", session]
    if args:
        cmd += ["--", *args]
    print(f"[ember] nox -s {' '.join(cmd[2:])}", flush=True)
    return subprocess.call(cmd, cwd=bootstrap.ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
