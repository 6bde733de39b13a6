"""Random ops through philox: distributions against eager (mean, variance, a two-sample
Kolmogorov-Smirnov test at fixed seeds), dropout's scaling and mask probability, determinism,
the per-graph seed/offset parameters and the counter layout (no two random ops of a graph
overlap), and shapes/dtypes as eager gives them."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import ember.prims  # noqa: F401  (registers prims and decompositions)
from ember.ir import Interpreter, Module, parse, verify
from ember.prims import philox
from ember.prims.decomp import DECOMPOSITIONS, DecompContext, DecompositionError, decompose_module
from ember.prims.decomp.random import philox_params, with_philox_inputs
from ember.testing.harness import op_module
from ember.testing.opdb import Sample

N = 20_000
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical
    CDFs."""
    a, b = a.double().flatten().sort()[0], b.double().flatten().sort()[0]
    grid = torch.cat([a, b])
    fa = torch.searchsorted(a, grid, right=True).double() / a.numel()
    fb = torch.searchsorted(b, grid, right=True).double() / b.numel()
    return float((fa - fb).abs().max())


def ks_critical(n: int, m: int, alpha: float = 1e-3) -> float:
    """The statistic's critical value at level alpha (asymptotic)."""
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def decomposed(op: str, *args: Any, **kwargs: Any) -> tuple[Module, list[Any]]:
    m, inputs = op_module(op, Sample(args, kwargs))
    d = decompose_module(m, DECOMPOSITIONS)
    verify(d)
    return d, inputs


def run(d: Module, inputs: list[Any], seed: int = 0, offset: int = 0) -> list[Any]:
    return Interpreter(d).run(with_philox_inputs(d.graph(), inputs, seed, offset)).outputs


def ember_random(op: str, *args: Any, seed: int = 7, offset: int = 0, **kwargs: Any) -> Any:
    d, inputs = decomposed(op, *args, **kwargs)
    return run(d, inputs, seed, offset)


def eager_random(op: str, *args: Any, seed: int = 7, **kwargs: Any) -> Any:
    torch.manual_seed(seed)
    overload = getattr(getattr(torch.ops.aten, op.split(".")[1]), op.split(".")[2])
    return overload(*args, **kwargs)


def test_ks_statistic_has_power() -> None:
    """The test below can fail: it separates uniform from uniform squared."""
    g = torch.Generator().manual_seed(0)
    u, v = torch.rand(N, generator=g), torch.rand(N, generator=g)
    assert ks_statistic(u, v) < ks_critical(N, N)
    assert ks_statistic(u, v**2) > ks_critical(N, N)
    assert ks_statistic(u, v * 0.98) > ks_critical(N, N)


# ---- distributions against eager --------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_rand_matches_eager_distribution(dtype: torch.dtype) -> None:
    (ours,) = ember_random("aten.rand.default", [N], dtype=dtype)
    theirs = eager_random("aten.rand.default", [N], dtype=dtype)
    assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape
    x = ours.double()
    assert 0 <= float(x.min()) and float(x.max()) < 1
    assert abs(float(x.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / N)
    assert abs(float(x.var()) - 1 / 12) < 0.004
    assert ks_statistic(ours, theirs) < ks_critical(N, N)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_randn_matches_eager_distribution(dtype: torch.dtype) -> None:
    (ours,) = ember_random("aten.randn.default", [N], dtype=dtype)
    theirs = eager_random("aten.randn.default", [N], dtype=dtype)
    assert ours.dtype == theirs.dtype == dtype
    x = ours.double()
    assert abs(float(x.mean())) < 5 / math.sqrt(N)
    assert abs(float(x.var()) - 1) < 0.05
    assert ks_statistic(ours, theirs) < ks_critical(N, N)


def test_normal_and_uniform_scale_and_shift() -> None:
    x = torch.zeros(N)
    (n,) = ember_random("aten.normal_functional.default", x, 2.0, 0.5)
    assert abs(float(n.mean()) - 2.0) < 5 * 0.5 / math.sqrt(N)
    assert abs(float(n.std()) - 0.5) < 0.02
    assert ks_statistic(n, eager_random("aten.normal_functional.default", x, 2.0, 0.5)) < \
        ks_critical(N, N)
    bounds: dict[str, Any] = {"from": -3.0, "to": 1.0}
    (u,) = ember_random("aten.uniform.default", x, **bounds)
    assert float(u.min()) >= -3 and float(u.max()) < 1
    assert ks_statistic(u, eager_random("aten.uniform.default", x, -3.0, 1.0)) < \
        ks_critical(N, N)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.float32], ids=str)
def test_randint_matches_eager_distribution(dtype: torch.dtype) -> None:
    (ours,) = ember_random("aten.randint.low", -3, 7, [N], dtype=dtype)
    theirs = eager_random("aten.randint.low", -3, 7, [N], dtype=dtype)
    assert ours.dtype == theirs.dtype == dtype
    counts = torch.bincount((ours.long() + 3), minlength=10).double()
    assert counts.numel() == 10 and bool((counts > 0).all())
    expected = N / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # chi-square, 9 degrees of freedom, p = 0.001
    assert ks_statistic(ours, theirs) < ks_critical(N, N)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_bernoulli_probability(p: float) -> None:
    x = torch.empty(N)
    (ours,) = ember_random("aten.bernoulli.p", x, p)
    theirs = eager_random("aten.bernoulli.p", x, p)
    sigma = math.sqrt(p * (1 - p) / N)
    assert abs(float(ours.mean()) - p) < 5 * sigma
    assert abs(float(ours.mean()) - float(theirs.mean())) < 5 * math.sqrt(2) * sigma
    # bernoulli(self) takes self as the probabilities: the mean follows them
    probs = torch.linspace(0, 1, N)
    (b,) = ember_random("aten.bernoulli.default", probs)
    assert abs(float((b - probs).mean())) < 5 * math.sqrt(1 / 6 / N)
    assert bool((b[probs == 0] == 0).all()) and bool((b[probs == 1] == 1).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_scaling_and_mask_probability(dtype: torch.dtype, p: float) -> None:
    x = torch.randn(N, generator=torch.Generator().manual_seed(1)).to(dtype)
    out, mask = ember_random("aten.native_dropout.default", x, p, True)
    e_out, e_mask = eager_random("aten.native_dropout.default", x, p, True)
    assert (out.dtype, mask.dtype, out.shape) == (e_out.dtype, e_mask.dtype, e_out.shape)
    keep = float(mask.double().mean())
    assert abs(keep - (1 - p)) < 5 * math.sqrt(max(p * (1 - p), 1e-12) / N) + 1e-12
    assert abs(keep - float(e_mask.double().mean())) < 0.03
    scale = 0.0 if p == 1 else 1 / (1 - p)
    assert torch.equal(out[mask], (x[mask].float() * scale).to(dtype))
    assert bool((out[~mask] == 0).all())
    # the expectation is kept: E[out] = E[x]
    if 0 < p < 1:
        assert abs(float(out.double().mean() - x.double().mean())) < 0.05
    # not training: identity and a full mask
    out, mask = ember_random("aten.native_dropout.default", x, p, False)
    assert torch.equal(out, x) and bool(mask.all())


# ---- determinism, parameters and the counter layout -----------------------------------------


def test_same_seed_and_offset_give_the_same_bits() -> None:
    d, inputs = decomposed("aten.randn.default", [64], dtype=torch.float16)
    a, b = run(d, inputs, 3, 100)[0], run(d, inputs, 3, 100)[0]
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert not torch.equal(a, run(d, inputs, 3, 101)[0])
    assert not torch.equal(a, run(d, inputs, 4, 100)[0])


def test_decompose_adds_seed_and_offset_parameters_once() -> None:
    text = """ember.ir 1.0

graph @f(%x: f32[4, 3]) -> (f32[4, 3], f32[4, 3], f32[4, 3]) {
  %a = aten.rand_like.default(%x) : f32[4, 3]
  %b = aten.randn_like.default(%x) : f32[4, 3]
  %c, %m = aten.native_dropout.default(%x, 0.5, true) : (f32[4, 3], b8[4, 3])
  return (%a, %b, %c)
}
"""
    d = decompose_module(parse(text), DECOMPOSITIONS)
    g = d.graph()
    assert [str(p.type) for p in g.params] == ["f32[4, 3]", "i64", "i64"]
    assert [p.name for p in g.params[1:]] == ["philox_seed", "philox_offset"]
    assert philox_params(g) == (1, 2, 12 + 24 + 12)  # randn takes two counters an element
    printed = str(d)
    assert "attrs(philox=[1, 2, 48])" in printed
    assert str(parse(printed)) == printed
    # decomposing again keeps the parameters and the count
    again = decompose_module(d, DECOMPOSITIONS)
    assert str(again) == printed
    # no random op: no parameters
    plain = decompose_module(parse(text.replace("rand_like", "neg").replace(
        "randn_like", "neg").replace("aten.native_dropout.default(%x, 0.5, true)",
                                     "aten.native_dropout.default(%x, 0.5, false)")),
        DECOMPOSITIONS)
    assert len(plain.graph().params) == 1 and philox_params(plain.graph()) is None


def test_random_ops_of_a_graph_use_consecutive_counters() -> None:
    """Op k starts where op k-1 stopped: rand [n], randn [m] (2m counters), rand [r]."""
    n, m, r = 5, 4, 3
    text = f"""ember.ir 1.0

graph @f() -> (f32[{n}], f64[{m}], f32[{r}]) {{
  %a = aten.rand.default([{n}]) : f32[{n}]
  %b = aten.randn.default([{m}], dtype=f64) : f64[{m}]
  %c = aten.rand.default([{r}]) : f32[{r}]
  return (%a, %b, %c)
}}
"""
    d = decompose_module(parse(text), DECOMPOSITIONS)
    assert philox_params(d.graph()) == (0, 1, n + 2 * m + r)
    seed, off = 11, 1000
    a, b, c = Interpreter(d).run([seed, off]).outputs
    assert torch.equal(a, philox.uniform(seed, off, (n,), torch.float32))
    u1 = philox.uniform(seed, off + n, (m,), torch.float64)
    u2 = philox.uniform(seed, off + n + m, (m,), torch.float64)
    box_muller = torch.sqrt(-2 * torch.log(1 - u1)) * torch.cos(2 * math.pi * u2)
    torch.testing.assert_close(b, box_muller, rtol=1e-12, atol=1e-12)
    assert torch.equal(c, philox.uniform(seed, off + n + 2 * m, (r,), torch.float32))
    # the next call, with the offset advanced by `consumed`, continues the stream
    a2 = Interpreter(d).run([seed, off + n + 2 * m + r]).outputs[0]
    assert torch.equal(a2, philox.uniform(seed, off + n + 2 * m + r, (n,), torch.float32))


def test_symbolic_sizes_consume_a_size_expression() -> None:
    text = """ember.ir 1.0

symbol s0 hint=4 min=2

graph @f(%x: f32[s0, 3]) -> (f32[s0, 3], f32[s0, 3]) {
  %a = aten.randn_like.default(%x) : f32[s0, 3]
  %b = aten.rand_like.default(%x) : f32[s0, 3]
  return (%a, %b)
}
"""
    d = decompose_module(parse(text), DECOMPOSITIONS)
    printed = str(d)
    assert "attrs(philox=[1, 2, s0 * 9])" in printed, printed
    assert "skip=s0 * 6" in printed
    assert str(parse(printed)) == printed
    x = torch.zeros(7, 3)  # not the hint
    a, b = Interpreter(d).run([x, 5, 0]).outputs
    assert a.shape == b.shape == (7, 3)
    assert torch.equal(b.flatten(), philox.uniform(5, 42, (21,), torch.float32))


def test_random_decompositions_need_the_pass_state() -> None:
    m, _ = op_module("aten.rand.default", Sample(([3],)))
    from ember.ir import Builder
    node = m.graph().nodes[0]
    ctx = DecompContext(Builder(m), node, DECOMPOSITIONS)
    with pytest.raises(DecompositionError, match="decompose pass"):
        DECOMPOSITIONS.apply(ctx, node.op, node.args, node.kwargs)


@pytest.mark.parametrize("op,args,kwargs", [
    ("aten.rand.default", ([2, 0, 3],), {"dtype": torch.float16}),
    ("aten.randn_like.default", (torch.zeros(3, 2, dtype=torch.bfloat16),), {}),
    ("aten.randint.default", (4, [5]), {}),
    ("aten.randint_like.low_dtype", (torch.zeros(2, dtype=torch.int32), -2, 3), {}),
    ("aten.bernoulli.p", (torch.zeros(3, dtype=torch.int64), 0.5), {}),
    ("aten.native_dropout.default", (torch.zeros(2, 3, dtype=torch.float16), 0.1, None), {}),
    ("aten.normal.float_float", (0.0, 1.0, [4]), {"dtype": torch.float64}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_types_match_eager(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ours = ember_random(op, *args, **kwargs)
    theirs = eager_random(op, *args, **kwargs)
    theirs = list(theirs) if isinstance(theirs, tuple) else [theirs]
    assert [(t.dtype, t.shape) for t in ours] == [(t.dtype, t.shape) for t in theirs]


def test_prims_backend_feeds_seed_and_advances_the_offset() -> None:
    from ember.ir.backends import default_backends
    m = parse("""ember.ir 1.0

graph @f(%x: f32[3]) -> (f32[3]) {
  %a = aten.rand_like.default(%x) : f32[3]
  return (%a)
}
""")
    torch.manual_seed(5)
    run1 = default_backends().get("prims").prepare(m)
    x = torch.zeros(3)
    first, second = run1(None, [x]).outputs[0], run1(None, [x]).outputs[0]
    assert torch.equal(first, philox.uniform(5, 0, (3,), torch.float32))
    assert torch.equal(second, philox.uniform(5, 3, (3,), torch.float32))
    run2 = default_backends().get("prims").prepare(m)
    assert torch.equal(run2(None, [x]).outputs[0], first)
