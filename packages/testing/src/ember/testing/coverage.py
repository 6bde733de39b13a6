"""Generated docs: docs/prims.md (the prim set) and docs/ops.md (op coverage).

    python -m ember.testing.coverage --write    # regenerate both
    python -m ember.testing.coverage --check    # exit 1 if either is stale

A test runs `--check`, so the committed pages always match the code.

A layer above prims that adds an op-database check (the inductor's "cpu kernel") declares what
its check runs in a data file `packages/<layer>/tests/opdb_<name>.toml`, which its test reads
too: the families it runs, the ops it skips and the ops allowed to leave parts on the reference
interpreter, each with the reason. docs/ops.md is rendered from the same files, so it says
exactly what the tests run; a data file keeps ember.testing from importing the layers above
prims (tests/test_package_dag.py). Format (`read_scope`):

    check = "cpu kernel"
    test = "packages/inductor/tests/test_opdb_cpu.py"
    about = "what `yes` means"
    families = ["pointwise", "shape"]
    [skip]          # op -> why the check does not run it
    "aten.digamma.default" = "prims.digamma has no C++ template yet"
    [fallback]      # op -> why a kernel of it may run on the reference interpreter
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ember.prims.decomp import DECOMPOSITIONS
from ember.prims.ops import PRIMS
from ember.testing.opdb import CHECKS, OpDB, load_all

ROOT = Path(__file__).resolve().parents[5]  # the repo (editable installs)
DOCS = ROOT / "docs"
SCOPE_FILES = "packages/*/tests/opdb_*.toml"

# Checks that exist so far; the others are filled in by the layers that add them.
IMPLEMENTED_CHECKS = {"decomposition"}


@dataclass(frozen=True)
class CheckScope:
    """What a layer's op-database check runs (one `opdb_*.toml` data file)."""

    check: str  # one of opdb.CHECKS
    test: str  # the test file that runs it, relative to the repo
    about: str  # what `yes` means, for docs/ops.md
    families: frozenset[str]
    skip: Mapping[str, str]  # op -> why the check does not run it
    fallback: Mapping[str, str]  # op -> why a kernel of it may run on the reference interpreter
    source: str  # the data file, relative to the repo

    def status(self, op: str, family: str) -> str:
        """The op's cell in docs/ops.md."""
        if family not in self.families:
            return "-"
        if op in self.skip:
            return f"no: {self.skip[op]}"
        if op in self.fallback:
            return f"yes, partly on the reference: {self.fallback[op]}"
        return "yes"


def read_scope(path: Path, root: Path = ROOT) -> CheckScope:
    """Parse one scope data file; a malformed one raises ValueError naming the file."""
    try:
        d = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None
    check, test, families = d.get("check"), d.get("test"), d.get("families")
    about = d.get("about", "")
    if check not in CHECKS:
        raise ValueError(f"{path}: `check` must be one of {CHECKS}, not {check!r}")
    if not isinstance(test, str):
        raise ValueError(f"{path}: `test` must be the path of the test file")
    if not isinstance(about, str):
        raise ValueError(f"{path}: `about` must be text")
    if not isinstance(families, list) or not all(isinstance(f, str) for f in families):
        raise ValueError(f"{path}: `families` must be a list of family names")
    tables: dict[str, dict[str, str]] = {}
    for key in ("skip", "fallback"):
        t = d.get(key, {})
        if not isinstance(t, dict) or not all(
                isinstance(v, str) and v.strip() and "|" not in v for v in t.values()):
            raise ValueError(f"{path}: [{key}] must map ops to reasons (text without `|`)")
        tables[key] = dict(t)
    unknown = set(d) - {"check", "test", "about", "families", "skip", "fallback"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    full, base = path.resolve(), root.resolve()
    source = full.relative_to(base).as_posix() if full.is_relative_to(base) else str(path)
    return CheckScope(check, test, " ".join(about.split()), frozenset(families), tables["skip"], tables["fallback"],
                      source)


def check_scopes(root: Path = ROOT) -> dict[str, CheckScope]:
    """check -> its scope, from every layer's data file."""
    out: dict[str, CheckScope] = {}
    for path in sorted(root.glob(SCOPE_FILES)):
        scope = read_scope(path, root)
        if scope.check in out:
            raise ValueError(f"{path}: check {scope.check!r} is declared twice")
        out[scope.check] = scope
    return out


def render_prims() -> str:
    lines = [
        "# ember's prims",
        "",
        "Generated from `packages/prims/src/ember/prims/ops.py` by",
        "`python -m ember.testing.coverage --write`; do not edit by hand.",
        "",
        f"{len(PRIMS)} prims. Operands are positional, attributes are keywords. Elementwise",
        "prims take operands of one shape and dtype (numbers take the tensor's dtype):",
        "broadcasting and type promotion are explicit, done by the decompositions.",
        "Dims are non-negative. Every shape rule is exact over symbolic sizes.",
        "",
        "Traits (declared in each prim's record, read by the passes): `fresh` results are new",
        "storage, `alias` results may share an operand's; `elementwise`; a reduction's combine,",
        "`associative` or `positional`.",
        "",
    ]
    group = None
    for p in PRIMS:
        if p.group != group:
            group = p.group
            lines += ["", f"## {group}", "", "| prim | semantics | shape | dtype | traits |",
                      "|---|---|---|---|---|"]
        traits = ", ".join([p.aliasing, *(["elementwise"] if p.elementwise else []),
                            *([p.reduction] if p.reduction else [])])
        lines.append(f"| `prims.{p.signature}` | {p.doc} | {_doc(p.shape)} | {_doc(p.dtype)} "
                     f"| {traits} |")
    lines += ["", "Random numbers: see `packages/prims/src/ember/prims/philox.py` for the counter",
              "layout every backend implements.", ""]
    return "\n".join(lines)


def _doc(fn: object) -> str:
    return (getattr(fn, "__doc__", None) or "").strip().replace("|", "\\|")


def render_ops(db: OpDB, scopes: Mapping[str, CheckScope]) -> str:
    ops = sorted(set(DECOMPOSITIONS.ops()) | {e.op for e in db.entries()})
    lines = [
        "# Op coverage",
        "",
        "Generated from the op database by `python -m ember.testing.coverage --write`;",
        "do not edit by hand. A check is `yes` when the op database runs it for the op with",
        "hypothesis (`packages/prims/tests/test_opdb.py` and the layers' own op-database tests),",
        "`-` when that layer is not built yet, or the reason it does not apply.",
        "",
        *[f"- {c}: `{sc.test}`, families {', '.join(sorted(sc.families))}. {sc.about}"
          f" `no: ...` and `yes, partly on the reference: ...` come from `{sc.source}`,"
          " the table the test runs." for c, sc in sorted(scopes.items())],
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
            elif check in scopes:
                cells.append(scopes[check].status(op, e.family))
            else:
                cells.append("yes" if check in IMPLEMENTED_CHECKS else "-")
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def pages() -> dict[Path, str]:
    db = load_all()
    return {DOCS / "prims.md": render_prims(), DOCS / "ops.md": render_ops(db, check_scopes())}


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
