"""Snapshot the compiled modules (C++ kernel blocks and kernels.* graphs) of IR files, to check
that a refactor of the inductor leaves the generated code unchanged (not a pytest test: a tool).

    PYTHONPATH=. .venv/bin/python -m packages.inductor.tests.cpp_snapshot OUT_DIR FILE.ir...
    diff -r BEFORE_DIR AFTER_DIR

Each FILE.ir runs through the `inductor` pipeline (no g++ build) and OUT_DIR/<stem>.kernels.ir
gets the printed result; a module the pipeline refuses gets its error instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ember.inductor  # noqa: F401  (the passes and pipelines)
from ember.ir import parse
from ember.ir.passes import run_pipeline


def snapshot(out: Path, files: list[Path]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in files:
        try:
            text = str(run_pipeline(parse(f.read_text()), "inductor"))
        except Exception as e:  # noqa: BLE001  (the error is the snapshot)
            text = f"# {type(e).__name__}: {e}\n"
        (out / f"{f.parent.name}.{f.stem}.kernels.ir").write_text(text)


if __name__ == "__main__":
    snapshot(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
