"""The op database's "triton kernel" check (issue 16): every op of every family the data file
`opdb_triton.toml` lists, decomposed, lowered to loops, fused and rendered as Triton kernels,
run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported) against eager,
over the entry's hypothesis samples (f32, f16, f64, ints, bools; 0- and 1-sized dims,
non-contiguous inputs; bf16 samples are left out here, the interpreter computes bf16 wrongly:
benchmarks/gpu_cuda_suite.py runs the same check with bf16 on the GPU). The check is in
opdb_triton_check.py.

The interpreter costs tens of milliseconds per launch, so CI draws `EXAMPLES` examples per family
(one module of a graph per op each; EMBER_OPDB_TRITON_EXAMPLES=n for more), and the long run
(`python3 dev.py fuzz -- -k opdb_triton`) draws 25 per family. A kernel left to the reference
interpreter (`triton_fallback`) fails unless the op is in the data file's [fallback] table; ops
the check does not run are in its [skip] table, with the reason; docs/ops.md shows both.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton column needs the triton package")

from ember.testing import coverage
from ember.testing.opdb import Sample
from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.inductor.tests.opdb_cpu_check import SCOPE as CPU_SCOPE
from packages.inductor.tests.opdb_cpu_check import examples_from_env, run_family
from packages.inductor.tests.opdb_triton_check import (
    OPDB,
    SCOPE,
    check_family,
    check_prims,
    family_entries,
    on_device,
    runnable,
)
from packages.inductor.tests.test_opdb_cpu import UNREACHED_PRIMS, _shift_operands

pytestmark = INTERPRETER_ONLY

FAMILIES = tuple(sorted(SCOPE.families))
EXAMPLES = examples_from_env("EMBER_OPDB_TRITON_EXAMPLES", 2)
LONG_EXAMPLES = 25


def _run_family(family: str, examples: int) -> None:
    run_family(check_family, family_entries(family), examples)


@pytest.mark.parametrize("family", FAMILIES)
def test_triton_kernels_match_eager(family: str) -> None:
    _run_family(family, EXAMPLES)


@pytest.mark.fuzz
@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") != "fuzz",
                    reason="long; `python3 dev.py fuzz -- -k opdb_triton` runs it")
@pytest.mark.parametrize("family", FAMILIES)
def test_triton_kernels_match_eager_long(family: str) -> None:
    _run_family(family, LONG_EXAMPLES)


def test_prims_no_entry_reaches() -> None:
    """shift_left/shift_right (no entry decomposes to them), against the prims' torch
    implementation, shifts past the width and negative ones included."""
    @settings(max_examples=2, suppress_health_check=[HealthCheck.too_slow])
    @given(st.fixed_dictionaries({p: _shift_operands() for p in UNREACHED_PRIMS}))
    def run(samples: dict[str, list[torch.Tensor]]) -> None:
        check_prims(samples)

    run()


def test_integer_division_modulo_and_power() -> None:
    """Integer div (trunc and floor), fmod, remainder and pow (negative exponents, overflow
    wrapping as eager's), in every integer width, with the divisor's sign mixed."""
    ops = ("aten.div.Tensor_mode", "aten.fmod.Tensor", "aten.remainder.Tensor",
           "aten.pow.Tensor_Tensor", "aten.floor_divide.default")
    entries = [OPDB[op] for op in ops]
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        lo = 0 if dtype == torch.uint8 else -40
        a = torch.randint(lo, 40, (3, 7), generator=g).to(dtype)
        b = torch.randint(1, 9, (3, 7), generator=g).to(dtype)
        if dtype != torch.uint8:
            b = b * torch.where(torch.rand(3, 7, generator=g) > 0.5, 1, -1).to(dtype)
        e = torch.randint(-3 if dtype != torch.uint8 else 0, 12, (3, 7), generator=g).to(dtype)
        samples = {"aten.div.Tensor_mode": Sample((a, b), {"rounding_mode": "trunc"}),
                   "aten.fmod.Tensor": Sample((a, b)), "aten.remainder.Tensor": Sample((a, b)),
                   "aten.pow.Tensor_Tensor": Sample((a, e)),
                   "aten.floor_divide.default": Sample((a, b))}
        assert not check_family(entries, samples), dtype


def test_found_bugs_stay_fixed() -> None:
    """Samples that failed once: an empty tensor (the index decomposition divided by zero), f64
    literals (rounded to f32 by Triton), f64 sqrt (tl.sqrt_rn takes f32 only), bitwise_not of
    u8 (the interpreter's ~ fails on unsigned types)."""
    samples = {
        "aten.abs.default": Sample((torch.randn(4, 0, 1),)),
        "aten.rsub.Scalar": Sample((torch.randn(6, dtype=torch.float64)[::2], 2),
                                   {"alpha": -0.01847798004746437}),
        "aten.sqrt.default": Sample((torch.rand(3, dtype=torch.float64),)),
        "aten.bitwise_not.default": Sample((torch.arange(5, dtype=torch.uint8),)),
    }
    failures = check_family([OPDB[op] for op in samples], samples)
    assert not failures, failures


def test_bf16_is_left_to_the_device() -> None:
    x = torch.randn(3, dtype=torch.bfloat16)
    assert not runnable(Sample((x,)), "cpu") and runnable(Sample((x,)), "cuda")
    assert not runnable(Sample((3,), {"dtype": torch.bfloat16}), "cpu")


def test_factories_get_the_checked_device() -> None:
    # called as aten overloads, factories ignore `with torch.device("cuda")`: the H200 run of
    # 2026-12-03 had creation and random modules refused for cpu values beside cuda ones
    s = on_device(Sample((3,), {"dtype": torch.float32}), "cuda", "aten.arange.default")
    assert s.kwargs == {"dtype": torch.float32, "device": torch.device("cuda")}
    assert on_device(Sample(([2, 3],)), "cuda", "aten.rand.default").kwargs["device"] \
        == torch.device("cuda")
    assert "device" not in on_device(Sample((3,)), "cpu", "aten.arange.default").kwargs
    kept = Sample((3,), {"device": torch.device("meta")})
    assert on_device(kept, "cuda", "aten.arange.default").kwargs["device"].type == "meta"
    assert "device" not in on_device(Sample((1.5,)), "cuda", "aten.fill.Scalar").kwargs


def test_nll_total_weight_is_compared_only_when_reduced() -> None:
    # eager's CUDA nll_loss2d leaves total_weight unwritten for reduction="none" and an empty
    # batch (garbage on the H200): compared only under "mean" and "sum"
    e = OPDB["aten.nll_loss2d_forward.default"]
    assert e.compare is not None
    x, t = torch.randn(0, 1, 3, 1), torch.zeros(0, 3, 1, dtype=torch.long)
    loss, total = torch.ops.aten.nll_loss2d_forward(x, t, None, 0, 0)
    e.compare(Sample((x, t, None, 0, 0)), [loss, total], [loss, torch.tensor(7.0)])
    with pytest.raises(AssertionError):
        e.compare(Sample((x, t, None, 1, 0)), [loss, total], [loss, torch.tensor(7.0)])


def test_every_family_is_checked() -> None:
    assert {e.family for e in OPDB.entries()} <= SCOPE.families


def test_tables_name_real_entries() -> None:
    for table in (SCOPE.skip, SCOPE.fallback):
        for op, why in table.items():
            assert op in OPDB and OPDB[op].family in SCOPE.families and why, op
    assert not set(SCOPE.skip) & set(SCOPE.fallback)
    assert set(SCOPE.skip) <= set(CPU_SCOPE.skip) | {"aten.digamma.default"}


def test_docs_read_the_same_table() -> None:
    """docs/ops.md's "triton kernel" column is rendered from the data file this test runs."""
    assert coverage.check_scopes()["triton kernel"] == SCOPE
    text = coverage.render_ops(OPDB, coverage.check_scopes())
    for op, why in SCOPE.skip.items():
        assert f"no: {why}" in next(ln for ln in text.splitlines() if f"`{op}`" in ln)
