"""Is a backend's (or a pipeline's) result right? Tolerances for whole graphs, the comparison
report, and the inputs of a check: what `ember check` and `ember minimize` share.

Tolerances. `torch.testing.assert_close`'s defaults (f32: rtol 1.3e-6, atol 1e-5) are for one
op. A whole graph run by another backend legitimately differs more: each reduction it orders
differently (a matmul's blocking, a fused softmax, a sum split over threads) changes the result
by up to about n * eps * sum(|terms|), and that error flows through the layers after it. Two
things follow. The relative part must allow many ulps (a few hundred to a thousand eps for
f32), and the absolute part must scale with the magnitude of the values involved: a logit near
0 computed from terms of size 400 (cancellation) carries an absolute error of about 400 * n *
eps, not a relative one. The output's own largest magnitude stands in for `sum(|terms|)`: an
element passes when

    |actual - expected| <= atol * scale + rtol * |expected|,   scale = max(1, max |expected|)

with NaNs equal to NaNs and infinities to equal infinities. Per dtype (see DEFAULT_TOLERANCES):
f32/c64 rtol 1e-4 and atol 1e-5 (about 840 and 84 eps; a tiny GPT-NeoX's logits differ by
about 9e-5 at magnitude 400 when reordered, i.e. 2e-7 of the scale, while a wrong
decomposition or kernel is off by 1e-3 and more); f16 rtol 1e-2, atol 1e-3 (about 10 and 1
eps); bf16 rtol 5e-2, atol 1e-2 (about 6 and 1.3 eps: half-precision graphs accumulate in f32,
so their error is mostly the final rounding); f64 keeps assert_close's 1e-7 (graphs in f64
often run some op in f32); float8 rtol 0.25, atol 0.125. Integers and bools must be equal.
`--rtol`/`--atol` replace the numbers for every floating dtype (the atol still scales).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ember.ir import Graph, Module, Node, default_registry
from ember.prims.decomp.random import philox_params
from ember.runtime.tensors import (
    InputError,
    load_inputs,
    random_inputs,
    to_stored,
)

# (rtol, atol): see the module docstring for why
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7), torch.complex128: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5), torch.complex64: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3), torch.bfloat16: (5e-2, 1e-2),
    torch.float8_e4m3fn: (0.25, 0.125), torch.float8_e5m2: (0.25, 0.125),
    torch.float8_e4m3fnuz: (0.25, 0.125), torch.float8_e5m2fnuz: (0.25, 0.125),
}
PHILOX_SEED, PHILOX_OFFSET = "philox_seed", "philox_offset"  # as dump.py writes them


@dataclass(frozen=True)
class Tolerance:
    """Overrides of the per-dtype defaults (None: the dtype's default)."""

    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("rtol", self.rtol), ("atol", self.atol)):
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"--{name} {v}: a tolerance is a finite number >= 0")

    def for_dtype(self, dt: torch.dtype) -> tuple[float, float]:
        if not (dt.is_floating_point or dt.is_complex):
            return 0.0, 0.0
        r, a = DEFAULT_TOLERANCES.get(dt, (1e-7, 1e-7))
        return (r if self.rtol is None else self.rtol), (a if self.atol is None else self.atol)

    def describe(self) -> str:
        if self.rtol is not None and self.atol is not None:
            return f"rtol {self.rtol:g}, atol {self.atol:g} x max(1, max|expected|)"
        return ("per-dtype defaults (f32: rtol 1e-4, atol 1e-5 x max(1, max|expected|))"
                + (f", rtol {self.rtol:g}" if self.rtol is not None else "")
                + (f", atol {self.atol:g}" if self.atol is not None else ""))


DEFAULT_TOLERANCE = Tolerance()


@dataclass
class Diff:
    """One result compared: how many elements are beyond tolerance, the worst errors, where."""

    label: str
    numel: int = 0
    mismatched: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    where: tuple[int, ...] | None = None  # the worst element (beyond tolerance if any is)
    expected: Any = None
    actual: Any = None
    rtol: float = 0.0
    atol: float = 0.0
    scale: float = 1.0
    problem: str | None = None  # a structural difference: dtype, shape or kind

    @property
    def ok(self) -> bool:
        return self.problem is None and self.mismatched == 0

    def describe(self) -> str:
        if self.problem is not None:
            return f"{self.label}: {self.problem}"
        at = "" if self.where is None else (
            f" at [{', '.join(map(str, self.where))}] (expected {self.expected!r}, "
            f"got {self.actual!r})")
        head = (f"{self.mismatched} of {self.numel} element(s) beyond tolerance" if
                self.mismatched else f"all {self.numel} element(s) within tolerance")
        return (f"{self.label}: {head}; worst abs error {self.max_abs:.3g}{at}, worst rel "
                f"error {self.max_rel:.3g} (rtol {self.rtol:g}, atol {self.atol:g} x "
                f"{self.scale:.3g})")


def compare_results(expected: Sequence[Any], actual: Sequence[Any], labels: Sequence[str],
                    tol: Tolerance = DEFAULT_TOLERANCE) -> list[Diff]:
    """Each result of a run against the reference's, with whole-graph tolerances."""
    return [compare_one(label, e, a, tol)
            for label, e, a in zip(labels, expected, actual, strict=True)]


def compare_one(label: str, expected: Any, actual: Any, tol: Tolerance = DEFAULT_TOLERANCE) -> Diff:
    try:
        te, ta = to_stored(expected), to_stored(actual)
    except InputError as e:
        return Diff(label, problem=f"cannot compare: {e}")
    if te.dtype != ta.dtype or te.shape != ta.shape:
        return Diff(label, problem=f"{_text(ta)} vs expected {_text(te)}")
    rtol, atol = tol.for_dtype(te.dtype)
    d = Diff(label, numel=te.numel(), rtol=rtol, atol=atol)
    if te.numel() == 0:
        return d
    if te.dtype == torch.bool or not (te.dtype.is_floating_point or te.is_complex()):
        bad = te != ta
        err = (te.to(torch.float64) - ta.to(torch.float64)).abs() if te.dtype != torch.bool \
            else bad.to(torch.float64)
        d.mismatched = int(bad.sum())
        d.max_abs = float(err.max())
        d.max_rel = float((err / te.to(torch.float64).abs()).nan_to_num(0.0, posinf=0.0).max()) \
            if te.dtype != torch.bool else d.max_abs
        _locate(d, te, ta, err, bad)
        return d
    wide = torch.complex128 if te.is_complex() else torch.float64
    x, y = te.to(wide), ta.to(wide)
    same = (x == y) | (x.isnan() & y.isnan())  # equal infinities, NaN where NaN
    err = torch.where(same, torch.zeros_like(x.real), (x - y).abs().nan_to_num(nan=math.inf))
    finite = x.abs()[x.isfinite()]
    d.scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
    allowed = atol * d.scale + rtol * x.abs().nan_to_num(nan=0.0, posinf=0.0)
    bad = err > allowed
    d.mismatched = int(bad.sum())
    d.max_abs = float(err.max())
    rel = torch.where(x != 0, err / x.abs(), torch.where(err > 0, math.inf, 0.0))
    d.max_rel = float(rel.nan_to_num(nan=0.0).max())
    _locate(d, te, ta, err, bad)
    return d


def _locate(d: Diff, te: torch.Tensor, ta: torch.Tensor, err: torch.Tensor,
            bad: torch.Tensor) -> None:
    """The worst element: the largest error among those beyond tolerance, else overall."""
    pick = torch.where(bad, err, torch.full_like(err, -1.0)) if d.mismatched else err
    flat = int(pick.reshape(-1).argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), te.shape)) \
        if te.dim() else ()
    d.where = idx
    d.expected, d.actual = te[idx].item(), ta[idx].item()


def _text(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


# ---- inputs and random numbers ------------------------------------------------------------


def has_random_ops(module: Module) -> bool:
    """Does the module draw random numbers from torch's generator (aten random ops)? After
    decomposition they draw from the graph's own %philox_seed/%philox_offset instead."""
    return any(is_random(n) for g in module.graphs.values() for n in g.nodes)


def is_random(node: Node) -> bool:
    """A torch op tagged nondeterministic_seeded, unless its `dropout_p` is 0 (attention ops
    carry the tag for their dropout, which is off in inference)."""
    op = default_registry().lookup(node.op)
    if op is None or not op.nondeterministic or op.torch_op is None:
        return False
    for i, a in enumerate(op.torch_op._schema.arguments):
        if a.name == "dropout_p":
            p = node.args[i] if i < len(node.args) and not a.kwarg_only else \
                node.kwargs.get(a.name, a.default_value if a.has_default_value() else None)
            return not (isinstance(p, int | float) and p == 0)
    return True


def graph_inputs(module: Module, graph: Graph, path: str | None, seed: int, max_bytes: int,
                 extras: dict[str, Any] | None = None) -> list[Any]:
    """The inputs of a run: from a safetensors file, or random (with `--random`, a graph's
    %philox_seed is the seed and its %philox_offset 0, so random ops draw reproducibly).
    `extras` receives the file's philox_seed/philox_offset where the graph has no such
    parameters (a dumped aten graph: decomposing backends seed from torch)."""
    if path is not None:
        optional: dict[str, Any] | None = None if extras is None else \
            {PHILOX_SEED: None, PHILOX_OFFSET: None}
        inputs = load_inputs(path, graph, module, optional=optional)
        if extras is not None and optional is not None:
            extras.update({k: int(v.item()) for k, v in optional.items() if v is not None})
        return inputs
    inputs = random_inputs(module, graph, seed, max_bytes)
    info = philox_params(graph)
    if info is not None:
        inputs[info[0]], inputs[info[1]] = seed - (1 << 64) if seed >= 1 << 63 else seed, 0
    if extras is not None:
        extras[PHILOX_SEED], extras[PHILOX_OFFSET] = seed, 0
    return inputs


@contextlib.contextmanager
def torch_seeded(extras: dict[str, Any], needed: bool) -> Iterator[None]:
    """Run with torch's generator seeded from `extras` (a dumped graph's philox_seed): the
    decomposing backends (prims, inductor) draw a fresh graph's first call from torch's
    initial seed at offset 0, which is what a dump records. The caller's RNG is restored."""
    if not needed or PHILOX_SEED not in extras:
        yield
        return
    offset = extras.get(PHILOX_OFFSET, 0)
    if offset:
        raise InputError(f"{PHILOX_OFFSET} is {offset}: a graph without philox parameters "
                         f"draws from offset 0; decompose it (ember opt -p decompose) to run it "
                         f"at another offset")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(extras[PHILOX_SEED]) & ((1 << 64) - 1))
        yield
