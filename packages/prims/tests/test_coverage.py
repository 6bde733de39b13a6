"""Coverage: every decomposition has an op-database entry, every entry a decomposition, and
the generated docs (docs/prims.md, docs/ops.md) are up to date."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.prims.decomp import DECOMPOSITIONS
from ember.testing import coverage
from ember.testing.opdb import load_all


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
                       f"`.venv/bin/python -m ember.testing.coverage --write`")


def test_check_scope_files(tmp_path: Path) -> None:
    """A layer's scope data file: parsed into the cells of docs/ops.md; a malformed one is a
    clear error naming the file."""
    f = tmp_path / "opdb_x.toml"
    f.write_text('check = "cpu kernel"\ntest = "t.py"\nfamilies = ["shape"]\n'
                 '[skip]\n"aten.a" = "why a"\n[fallback]\n"aten.b" = "why b"\n')
    sc = coverage.read_scope(f, tmp_path)
    assert sc.source == "opdb_x.toml"
    assert [sc.status(op, fam) for op, fam in [("aten.a", "shape"), ("aten.b", "shape"),
                                               ("aten.c", "shape"), ("aten.a", "pointwise")]] \
        == ["no: why a", "yes, partly on the reference: why b", "yes", "-"]
    for bad in ['check = "speed"\ntest = "t"\nfamilies = []\n',
                'check = "cpu kernel"\ntest = "t"\nfamilies = "shape"\n',
                'check = "cpu kernel"\ntest = "t"\nfamilies = []\n[skip]\n"aten.a" = "x | y"\n',
                'check = "cpu kernel"\ntest = "t"\nfamilies = []\nextra = 1\n',
                'check = [\n']:
        f.write_text(bad)
        with pytest.raises(ValueError, match="opdb_x.toml"):
            coverage.read_scope(f, tmp_path)
