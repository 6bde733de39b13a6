"""Generic checks over the op database: every decomposition against eager, eagerly sized and
with symbolic sizes."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.testing.harness import check_decomposition
from ember.testing.opdb import OpEntry, load_all

OPDB = load_all()
# an entry kept whole on purpose (a `decomposition` gap, with its reason) has no prims form
ENTRIES = [e for e in OPDB.entries() if "decomposition" not in e.gaps]
_SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.filter_too_much])


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.op)
def test_decomposition_matches_eager(entry: OpEntry) -> None:
    @_SETTINGS
    @given(entry.samples())
    def run(sample) -> None:  # type: ignore[no-untyped-def]
        check_decomposition(entry, sample)

    run()


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.symbolic], ids=lambda e: e.op)
def test_decomposition_with_symbolic_sizes(entry: OpEntry) -> None:
    @_SETTINGS
    @given(entry.samples())
    def run(sample) -> None:  # type: ignore[no-untyped-def]
        check_decomposition(entry, sample, symbolic=True)

    run()


_LONG = settings(_SETTINGS, max_examples=5_000)


@pytest.mark.fuzz
@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") != "fuzz",
                    reason="long; `python3 dev.py fuzz -- -k opdb_long` runs it")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.op)
def test_opdb_long(entry: OpEntry) -> None:
    """The op database at 5,000 examples per entry and size mode (`python3 dev.py fuzz`)."""

    @_LONG
    @given(entry.samples(), st.booleans())
    def run(sample, symbolic: bool) -> None:  # type: ignore[no-untyped-def]
        check_decomposition(entry, sample, symbolic=symbolic and entry.symbolic)

    run()
