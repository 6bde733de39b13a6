"""Generated docs: docs/prims.md (the prim set) and docs/ops.md (op coverage).

    python -m ember.prims.testing.coverage --write    # regenerate both
    python -m ember.prims.testing.coverage --check    # exit 1 if either is stale

A test runs `--check`, so the committed pages always match the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ember.prims.decomp import DECOMPOSITIONS
from ember.prims.ops import PRIMS
from ember.prims.testing.opdb import CHECK_SCOPE, CHECKS, OpDB, load_all

DOCS = Path(__file__).resolve().parents[6] / "docs"  # the repo (editable installs)

# Checks that exist so far; the others are filled in by the layers that add them.
IMPLEMENTED_CHECKS = {"decomposition"}


def render_prims() -> str:
    lines = [
        "# ember's prims",
        "",
        "Generated from `packages/prims/src/ember/prims/ops.py` by",
        "`python -m ember.prims.testing.coverage --write`; do not edit by hand.",
        "",
        f"{len(PRIMS)} prims. Operands are positional, attributes are keywords. Elementwise",
        "prims take operands of one shape and dtype (numbers take the tensor's dtype):",
        "broadcasting and type promotion are explicit, done by the decompositions.",
        "Dims are non-negative. Every shape rule is exact over symbolic sizes.",
        "",
    ]
    group = None
    for p in PRIMS:
        if p.group != group:
            group = p.group
            lines += ["", f"## {group}", "", "| prim | semantics | shape | dtype |",
                      "|---|---|---|---|"]
        lines.append(f"| `prims.{p.signature}` | {p.doc} | {_doc(p.shape)} | {_doc(p.dtype)} |")
    lines += ["", "Random numbers: see `packages/prims/src/ember/prims/philox.py` for the counter",
              "layout every backend implements.", ""]
    return "\n".join(lines)


def _doc(fn: object) -> str:
    return (getattr(fn, "__doc__", None) or "").strip().replace("|", "\\|")


def render_ops(db: OpDB) -> str:
    ops = sorted(set(DECOMPOSITIONS.ops()) | {e.op for e in db.entries()})
    lines = [
        "# Op coverage",
        "",
        "Generated from the op database by `python -m ember.prims.testing.coverage --write`;",
        "do not edit by hand. A check is `yes` when the op database runs it for the op with",
        "hypothesis (`packages/prims/tests/test_opdb.py` and the layers' own op-database tests),",
        "`-` when that layer is not built yet, or the reason it does not apply.",
        "",
        f"{len(ops)} ops, {sum(1 for o in ops if o in DECOMPOSITIONS)} with decompositions.",
        "",
        "| op | " + " | ".join(CHECKS) + " |",
        "|---|" + "---|" * len(CHECKS),
    ]
    for op in ops:
        e = db[op] if op in db else None
        cells = []
        for check in CHECKS:
            if e is None:
                cells.append("no entry")
            elif check in e.gaps:
                cells.append(e.gaps[check])
            elif check == "decomposition" and op not in DECOMPOSITIONS:
                cells.append("missing")
            elif check in CHECK_SCOPE:
                families, gaps = CHECK_SCOPE[check]
                cells.append(gaps.get(op, "yes") if e.family in families else "-")
            else:
                cells.append("yes" if check in IMPLEMENTED_CHECKS else "-")
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def pages() -> dict[Path, str]:
    db = load_all()
    return {DOCS / "prims.md": render_prims(), DOCS / "ops.md": render_ops(db)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    stale = []
    for path, text in pages().items():
        current = path.read_text() if path.exists() else ""
        if current != text:
            stale.append(path)
            if a.write:
                path.write_text(text)
    for p in stale:
        print(f"{'wrote' if a.write else 'stale'}: {p}")
    return 1 if stale and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
