"""Coverage: every decomposition has an op-database entry, every entry a decomposition, and
the generated docs (docs/prims.md, docs/ops.md) are up to date."""

from __future__ import annotations

from ember.prims.decomp import DECOMPOSITIONS
from ember.prims.testing import coverage
from ember.prims.testing.opdb import load_all


def test_every_decomposition_has_an_opdb_entry() -> None:
    db = load_all()
    missing = [op for op in DECOMPOSITIONS.ops() if op not in db]
    assert not missing, f"decompositions without an op-database entry (property test): {missing}"


def test_every_entry_has_its_checks_or_a_reason() -> None:
    for e in load_all().entries():
        if "decomposition" not in e.gaps:
            assert e.op in DECOMPOSITIONS, f"{e.op} has an entry but no decomposition"


def test_generated_docs_are_current() -> None:
    stale = [str(p) for p, text in coverage.pages().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, (f"stale: {stale}; regenerate with "
                       f"`.venv/bin/python -m ember.prims.testing.coverage --write`")
