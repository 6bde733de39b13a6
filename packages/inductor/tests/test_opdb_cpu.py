"""The op database's "cpu kernel" check: every op of every family the data file
`opdb_cpu.toml` lists (all of them: pointwise, activation, reduction, shape/views, indexing,
creation, normalization, linalg, attention, convolution, pooling, random), decomposed, lowered
to loops, fused and compiled to C++ (backend "inductor"), against eager torch, over the entry's
hypothesis samples (non-contiguous inputs, 0- and 1-sized dims, every dtype the entry draws).
The check itself is in opdb_cpu_check.py.

To bound CPU time (every distinct shape and dtype is a new C++ source), one hypothesis example
draws one sample for every op of a family and builds one module holding a graph per op: one
build (g++) per example, `EXAMPLES` examples per family (EMBER_OPDB_CPU_EXAMPLES=n for a deeper
run). A failing example names every op that failed. A kernel left to the reference interpreter
(`cpp_fallback`) fails the check unless the op is in the data file's [fallback] table; ops the
inductor cannot run yet are in its [skip] table, with the reason; docs/ops.md shows both.
The two prims no entry decomposes to are checked on their own (`UNREACHED_PRIMS`), and samples
that once failed are checked every run (`test_found_bugs_stay_fixed`).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.testing import coverage
from ember.testing import strategies as S
from ember.testing.opdb import Sample
from packages.inductor.tests.opdb_cpu_check import (
    OPDB,
    SCOPE,
    check_family,
    check_prims,
    examples_from_env,
    family_entries,
    run_family,
)

FAMILIES = tuple(sorted(SCOPE.families))
# examples per family: about 1-2 s each here (one g++ build of the family's kernels)
EXAMPLES = examples_from_env("EMBER_OPDB_CPU_EXAMPLES", 4)


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_kernels_match_eager(family: str) -> None:
    run_family(check_family, family_entries(family), EXAMPLES)


# Prims that no op-database entry decomposes to (every other prim is reached by some entry's
# decomposition; measured over 3 samples per entry): checked on their own, against the prim's
# torch implementation.
UNREACHED_PRIMS = ("prims.shift_left", "prims.shift_right")


@st.composite
def _shift_operands(draw: st.DrawFn) -> list[torch.Tensor]:
    shape = draw(S.shapes(0, 3))
    dtype = draw(S.dtypes(S.INTS))
    bits = 8 * dtype.itemsize
    # shifts past the width and negative ones: torch gives 0 (or -1 for a negative a >> n)
    low = 0 if dtype == torch.uint8 else -2
    return [draw(S.tensors(shape, dtype)), draw(S.tensors(shape, dtype, low=low, high=bits + 2))]


def test_prims_no_entry_reaches() -> None:
    @settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
    @given(st.fixed_dictionaries({p: _shift_operands() for p in UNREACHED_PRIMS}))
    def run(samples: dict[str, list[torch.Tensor]]) -> None:
        check_prims(samples)

    run()


def test_found_bugs_stay_fixed() -> None:
    """Samples that failed once, checked every run: a transposed convolution (its weight is
    read flipped, a view with negative strides that torch cannot take: copied instead) and
    flash attention (its philox seed/offset outputs are u64)."""
    x = torch.randn(2, 1, 4, 2)
    samples = {
        "aten.convolution.default": Sample((x, torch.randn(1, 1, 3, 3), None, [1, 2], [2, 1],
                                            [1, 2], True, [0, 0], 1)),
        "aten._scaled_dot_product_flash_attention.default": Sample(
            tuple(torch.randn(1, 2, 3, 4) for _ in range(3))),
    }
    failures = check_family([OPDB[op] for op in samples], samples)
    assert not failures, failures


def test_every_family_is_checked() -> None:
    assert {e.family for e in OPDB.entries()} <= SCOPE.families


def test_tables_name_real_entries() -> None:
    for table in (SCOPE.skip, SCOPE.fallback):
        for op, why in table.items():
            assert op in OPDB and OPDB[op].family in SCOPE.families and why, op
    assert not set(SCOPE.skip) & set(SCOPE.fallback)


def test_docs_read_the_same_table() -> None:
    """docs/ops.md's "cpu kernel" column is rendered from the data file this test runs."""
    assert coverage.check_scopes()["cpu kernel"] == SCOPE
    text = coverage.render_ops(OPDB, coverage.check_scopes())
    for op, why in SCOPE.skip.items():
        assert f"no: {why}" in next(ln for ln in text.splitlines() if f"`{op}`" in ln)
