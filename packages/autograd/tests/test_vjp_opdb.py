"""The op database's "vjp" column: every entry not in `opdb_vjp.toml`'s [skip] table,
decomposed to prims, differentiated by the VJP rules (`build_joint`), run forward then backward
on the reference interpreter, against `torch.autograd.grad` of the eager op with the same random
cotangents (ember.autograd.testing.check_vjp).

`EXAMPLES` hypothesis examples per entry (EMBER_OPDB_VJP_EXAMPLES=n for more; the `fuzz`
variant runs 2,000 with symbolic sizes too), bounded by the active profile's max_examples.
Where eager's gradient follows a convention the prims cannot see (relu's 0 at the kink, clamp
with tensor bounds giving the whole gradient to x at a tie, where maximum/minimum split it),
`KINKS` masks those elements out, per entry, with the reason; `GRAD_TOL` widens a tolerance,
with the reason; `EAGER_RAISES` names eager backward bugs whose samples cannot be compared.
Where eager differentiates nothing (creation, comparisons, integer ops, random draws), the joint
graph over every float input and result must give zero gradients.
Samples holding inf/NaN (inputs or results) are compared where both gradients are finite:
eager's fused formulas and the prim-by-prim chain rule meet them in different products. """

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.autograd.testing import check_vjp
from ember.testing import coverage
from ember.testing.coverage import CheckScope, read_scope
from ember.testing.harness import eager
from ember.testing.opdb import OpEntry, Sample, load_all

SCOPE: CheckScope = read_scope(Path(__file__).with_name("opdb_vjp.toml"))
OPDB = load_all()
ENTRIES = [e for e in OPDB.entries() if e.op not in SCOPE.skip and e.family in SCOPE.families]

_RAW = os.environ.get("EMBER_OPDB_VJP_EXAMPLES", "4")
if not _RAW.isdigit() or int(_RAW) < 1:
    raise ValueError(f"EMBER_OPDB_VJP_EXAMPLES must be a positive integer, not {_RAW!r}")
EXAMPLES = min(int(_RAW), settings().max_examples)
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def _t(sample: Sample, i: int) -> Any:
    return sample.args[i] if i < len(sample.args) else None


def _ties(*pairs: tuple[Any, Any]) -> torch.Tensor | None:
    """Where x equals a bound (tensor or number), or is NaN, in the broadcast shape."""
    out: torch.Tensor | None = None
    for x, bound in pairs:
        if bound is None or not isinstance(x, torch.Tensor):
            continue
        b = bound.to(x.dtype) if isinstance(bound, torch.Tensor) else bound
        m = (x == b) | x.isnan()
        out = m if out is None else out | m
    return out


# op -> (why eager differs at these points, the points: a bool mask broadcastable to the
# result). The masked elements of every input's gradient are not compared.
KINKS: dict[str, tuple[str, Callable[[Sample], torch.Tensor | None]]] = {
    "aten.relu.default": (
        "eager's relu gives 0 at x == 0 and passes the gradient at NaN (threshold_backward); "
        "maximum(x, 0)'s rule follows clamp_min: the whole gradient at the tie, 0 at NaN",
        lambda s: _ties((_t(s, 0), 0.0))),
    "aten.hardtanh.default": (
        "eager's hardtanh gives 0 at the bounds and passes NaN's gradient; the clamp rule the "
        "decomposition's maximum/minimum follow gives the whole gradient at the bounds",
        lambda s: _ties((_t(s, 0), s.args[1] if len(s.args) > 1 else -1.0),
                        (_t(s, 0), s.args[2] if len(s.args) > 2 else 1.0))),
    "aten.clamp.Tensor": (
        "eager's clamp with tensor bounds gives x the whole gradient at a tie and the bound "
        "none; maximum/minimum of two tensors split it in half (torch's maximum convention); "
        "where min == max eager gives max the gradient, the decomposition's max(x, min) first "
        "then min(., max) splits it between them",
        lambda s: _ties((_t(s, 0), s.args[1] if len(s.args) > 1 else None),
                        (_t(s, 0), s.args[2] if len(s.args) > 2 else None),
                        (s.args[1] if len(s.args) > 2 and isinstance(s.args[1], torch.Tensor)
                         else None, s.args[2] if len(s.args) > 2 else None))),
    "aten.clamp_min.Tensor": (
        "as clamp.Tensor: eager gives x the whole gradient at a tie",
        lambda s: _ties((_t(s, 0), _t(s, 1)))),
    "aten.clamp_max.Tensor": (
        "as clamp.Tensor: eager gives x the whole gradient at a tie",
        lambda s: _ties((_t(s, 0), _t(s, 1)))),
}

def _dim_arg(s: Sample) -> Any:
    return s.args[1] if len(s.args) > 1 else s.kwargs.get("dim")


def _all_if(flag: bool) -> torch.Tensor | None:
    return torch.tensor(True) if flag else None


def _zero_result(op: str) -> Callable[[Sample], torch.Tensor | None]:
    def mask(s: Sample) -> torch.Tensor | None:
        out = eager(op, s)[0]
        return _all_if(bool((out == 0).any()))
    return mask


def _lambd(s: Sample) -> float:
    return float(s.args[1] if len(s.args) > 1 else s.kwargs.get("lambd", 0.5))


KINKS["aten.softshrink.default"] = (
    "eager's softshrink passes the gradient at |x| == lambd (its kernel's comparison order); "
    "the decomposition's where() gives 0 there; at NaN eager's comparisons are false and give "
    "0 where the decomposition's select passes the gradient",
    lambda s: (_t(s, 0).abs() == _lambd(s)) | _t(s, 0).isnan())
KINKS["aten.remainder.Tensor"] = (
    "with an infinite divisor eager's backward gives the divisor -floor(a / b) * grad (floor "
    "of -0.0 is -1 there); the decomposition's floor-division rule gives 0",
    lambda s: _t(s, 1).isinf() if isinstance(s.args[1], torch.Tensor) else None)
KINKS["aten.hardshrink.default"] = (
    "at NaN eager's hardshrink_backward (a closed-interval test, false for NaN) passes the "
    "gradient where the decomposition's select gives 0",
    lambda s: _t(s, 0).isnan())
KINKS["aten.hardswish.default"] = (
    "eager's hardswish_backward puts x == 3 in the middle piece ((2x + 3) / 6 = 1.5) and "
    "x == -3 in it too; the decomposition's clamp gives the outer pieces' slopes there",
    lambda s: _t(s, 0).abs() == 3.0)
KINKS["aten.atan2.default"] = (
    "eager's atan2 backward squares an integer operand in its own dtype (uint8 wraps); the "
    "decomposition converts it to the float type first",
    lambda s: _all_if(any(isinstance(a, torch.Tensor) and not a.dtype.is_floating_point
                          for a in s.args)))

_ZERO_NORM = ("eager's backward gives 0 where the norm/deviation is 0 (masked_fill(result == "
              "0, 0)); sqrt's derivative there is infinite and the chain rule gives NaN")
_EMPTY_DIM = ("eager's backward with dim=[] differentiates as if nothing were reduced while its "
              "forward reduces every dim (a torch bug)")
for _op in ("aten.var.correction", "aten.var_mean.correction", "aten.var.dim"):
    KINKS[_op] = (_EMPTY_DIM, lambda s: _all_if(_dim_arg(s) == []))


def _std_kinks(op: str) -> Callable[[Sample], torch.Tensor | None]:
    zero = _zero_result(op)
    return lambda s: _all_if(_dim_arg(s) == []) or zero(s)


for _op in ("aten.std.correction", "aten.std_mean.correction"):
    KINKS[_op] = (_EMPTY_DIM + "; and " + _ZERO_NORM, _std_kinks(_op))
KINKS["aten.linalg_vector_norm.default"] = (_ZERO_NORM, _zero_result(
    "aten.linalg_vector_norm.default"))

_BN_STRIDED = ("eager's batch-norm backward reads non-contiguous running_mean/running_var "
               "wrongly (garbage; a torch bug), in eval mode")
for _op in ("aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit_functional"
            ".default", "aten._native_batch_norm_legit_no_training.default",
            "aten.native_batch_norm.default"):
    KINKS[_op] = (_BN_STRIDED, lambda s: _all_if(any(
        isinstance(a, torch.Tensor) and not a.is_contiguous() for a in s.args[3:5])))

def _small_group_var(s: Sample) -> torch.Tensor | None:
    x, n, groups = s.args[0], s.args[3], s.args[6]
    if x.dtype not in (torch.float16, torch.bfloat16) or x.numel() == 0:
        return None
    var = x.float().reshape(n, groups, -1).var(-1, correction=0)
    return _all_if(bool((var < 1e-3).any()))


KINKS["aten.native_group_norm.default"] = (
    "eager's f16/bf16 group-norm backward cubes rstd in the half type: a group of (nearly) "
    "zero variance overflows to inf and gives NaN; the decomposition's backward runs in f32",
    _small_group_var)

_NARROW = ("eager's narrow_copy backward ignores a negative start (a torch bug: x[1], start -1 "
           "gives a zero gradient; x[2], start -2 raises 'must match the size')")
KINKS["aten.narrow_copy.default"] = (_NARROW, lambda s: _all_if(s.args[2] < 0))

# op -> (why eager raises, a substring of its message): such samples are not compared
EAGER_RAISES: dict[str, tuple[str, str]] = {
    "aten.atan2.default": (
        "eager's atan2 backward negates a bool operand (a torch bug): 'Negation, the `-` "
        "operator, on a bool tensor is not supported'", "on a bool tensor is not supported"),
    "aten.scatter_add.default": (
        "eager's scatter_add backward returns src's gradient in the index's shape where src is "
        "larger and a dim is 0 (a torch bug): 'returned an invalid gradient'",
        "returned an invalid gradient"),
    "aten.scatter.src": (
        "as scatter_add: eager's backward returns src's gradient in the index's shape where "
        "src is larger and a dim is 0 (a torch bug)", "returned an invalid gradient"),
    "aten.native_group_norm.default": (
        "eager's group-norm backward fails on a 0-sized batch with a 0-sized spatial dim (a "
        "torch bug: 'is invalid for input of size')", "is invalid for input of size"),
    "aten.native_layer_norm.default": (
        "eager's layer-norm backward refuses an f16/bf16 input with f32 weight or bias "
        "('expected scalar type'), though its forward takes it", "expected scalar type"),
    "aten.narrow_copy.default": (_NARROW, "must match the size"),
    "aten.clamp.Tensor": (
        "eager's clamp backward cannot broadcast a 0-dim x against an empty bound (a torch bug: "
        "'doesn't match the broadcast shape')", "doesn't match the broadcast shape"),
}

# op -> ({grad dtype: (rtol, atol)}, why)
GRAD_TOL: dict[str, tuple[dict[torch.dtype, tuple[float, float]], str]] = {
    "aten.atan2.default": (
        {torch.float64: (1e-2, 1e-2), torch.float32: (1e-2, 1e-2)},
        "eager's atan2 backward squares a 0-dim f16/bf16 operand in its own dtype before "
        "adding it to the f32/f64 one; the decomposition converts it first"),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (
        {torch.float16: (3e-2, 3e-2), torch.bfloat16: (6e-2, 6e-2)},
        "f16/bf16 attention backward: eager's fused kernel accumulates blocks in f32 and "
        "rounds once; the decomposition's backward rounds at each prim's f16/bf16 boundary"),
}
_NORM_GRAD = ({torch.float32: (1e-4, 1e-4), torch.float64: (1e-7, 1e-7),
               torch.float16: (5e-2, 2e-1), torch.bfloat16: (1e-1, 6e-1)},
              "normalization backward: eager's kernel sums grad * x_hat in one fused f32 pass; "
              "the chain rule through mean, variance and rsqrt sums and rounds in other orders, "
              "and over a small batch x's gradient (ct - mean(ct) - x_hat * mean(ct * x_hat)) "
              "is a difference of nearly equal terms: f16/bf16 ulps of those terms")
for _op in ("aten.native_layer_norm.default", "aten.native_group_norm.default",
            "aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
            "aten._native_batch_norm_legit_functional.default",
            "aten._native_batch_norm_legit_no_training.default",
            "aten.native_batch_norm.default"):
    GRAD_TOL[_op] = _NORM_GRAD

def _mask(op: str) -> Callable[[Sample], torch.Tensor | None] | None:
    return KINKS[op][1] if op in KINKS else None


def _tol(op: str) -> dict[torch.dtype, tuple[float, float]] | None:
    return GRAD_TOL[op][0] if op in GRAD_TOL else None


def _check(entry: OpEntry, sample: Sample, seed: int, symbolic: bool = False) -> None:
    try:
        _compare(entry, sample, seed, symbolic)
    except RuntimeError as e:
        if entry.op not in EAGER_RAISES or EAGER_RAISES[entry.op][1] not in str(e):
            raise


def _compare(entry: OpEntry, sample: Sample, seed: int, symbolic: bool) -> None:
    # False where eager differentiates nothing (creation, comparisons, integer results)
    check_vjp(entry, sample, seed, mask=_mask(entry.op), tol=_tol(entry.op),
              symbolic=symbolic and entry.symbolic)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.op)
def test_vjp_matches_eager(entry: OpEntry) -> None:
    @settings(max_examples=EXAMPLES, suppress_health_check=_HEALTH)
    @given(entry.samples(), st.integers(0, 2**32 - 1))
    def run(sample: Sample, seed: int) -> None:
        _check(entry, sample, seed)

    run()


_LONG = settings(max_examples=2_000, suppress_health_check=_HEALTH)


@pytest.mark.fuzz
@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") != "fuzz",
                    reason="long; `python3 dev.py fuzz -- -k vjp_long` runs it")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.op)
def test_vjp_long(entry: OpEntry) -> None:
    @_LONG
    @given(entry.samples(), st.integers(0, 2**32 - 1), st.booleans())
    def run(sample: Sample, seed: int, symbolic: bool) -> None:
        _check(entry, sample, seed, symbolic)

    run()


def test_tables_name_real_entries() -> None:
    for table in (SCOPE.skip, KINKS, GRAD_TOL, EAGER_RAISES):
        for op in table:
            assert op in OPDB and OPDB[op].family in SCOPE.families, op
    assert not set(SCOPE.skip) & (set(KINKS) | set(GRAD_TOL) | set(EAGER_RAISES))
    assert all(why for why, _ in KINKS.values()) and all(why for _, why in GRAD_TOL.values())
    assert {e.family for e in OPDB.entries()} <= SCOPE.families


def test_docs_read_the_same_table() -> None:
    """docs/ops.md's "vjp" column is rendered from the data file this test runs."""
    assert coverage.check_scopes()["vjp"] == SCOPE
    text = coverage.render_ops(OPDB, coverage.check_scopes())
    for op, why in SCOPE.skip.items():
        assert f"no: {why}" in next(ln for ln in text.splitlines() if f"`{op}`" in ln)
