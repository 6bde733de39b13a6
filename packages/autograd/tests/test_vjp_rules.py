"""The VJP registry and its rules, prim by prim: every prim has a rule or a listed reason, and
each rule's cotangents equal torch.autograd's for the prim's torch reference (one-node prims
graphs, hypothesis over shapes and values)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.autograd.joint import build_joint
from ember.autograd.testing import run_joint
from ember.autograd.vjp import NO_DERIVATIVE, VJP_RULES, VJPContext, vjp
from ember.ir import DType, GraphBuilder, Module, Node, TensorType, Value, parse, verify
from ember.prims.ops import PRIMS, PRIMS_BY_OP
from ember.testing import strategies as S

_SETTINGS = settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow,
                                                             HealthCheck.data_too_large])


# ---- the registry ---------------------------------------------------------------------------

def test_every_prim_has_a_rule_or_a_reason() -> None:
    prims = {p.op for p in PRIMS}
    missing = sorted(prims - set(VJP_RULES) - set(NO_DERIVATIVE))
    assert not missing, f"prims with neither a VJP rule nor a NO_DERIVATIVE reason: {missing}"
    assert not set(VJP_RULES) & set(NO_DERIVATIVE)
    assert all(why.strip() for why in NO_DERIVATIVE.values())
    assert set(NO_DERIVATIVE) <= prims
    # rules beyond the prims are for ops kept whole as externs
    assert all(op.startswith("aten.") for op in set(VJP_RULES) - prims)


def test_coverage_check_fails_for_a_new_prim(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coverage test is a test: a prim without a rule or reason makes it fail."""
    fake = PRIMS[0].__class__("fake_op", "test", "fake_op(x)", "", PRIMS[0].shape,
                              PRIMS[0].dtype, PRIMS[0].ref, aliasing="alias")
    monkeypatch.setattr(f"{__name__}.PRIMS", (*PRIMS, fake))
    with pytest.raises(AssertionError, match="prims.fake_op"):
        test_every_prim_has_a_rule_or_a_reason()


def test_duplicate_registration_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        vjp("prims.exp")(lambda ctx, node, cts: [None])


# ---- rules against torch.autograd on the prim's reference -----------------------------------

def _prim_module(op: str, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Module, list[Any]]:
    m = Module()
    gb = GraphBuilder(m, "f")
    inputs: list[Any] = []

    def bind(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            inputs.append(a)
            return gb.param(f"a{len(inputs) - 1}", TensorType(DType.from_torch(a.dtype),
                                                              tuple(a.shape)))
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            return [bind(x) for x in a]
        return a

    gb.ret(gb.emit(op, [bind(a) for a in args], kwargs))
    return m, inputs


def check_prim(op: str, args: Sequence[Any], kwargs: dict[str, Any] | None = None,
               seed: int = 0, atol: float = 1e-7, rtol: float = 1e-6,
               ref: Callable[..., Any] | None = None) -> None:
    """One prim's joint graph (built, verified, round-tripped, run) against torch.autograd of
    the prim's torch reference; inputs are f64 so only the formulas are compared."""
    kwargs = kwargs or {}
    m, inputs = _prim_module(op, args, kwargs)
    j = build_joint(m)
    verify(j)
    assert str(parse(str(j))) == str(j)
    leaves = [x.detach().requires_grad_(x.dtype.is_floating_point) for x in inputs]
    it = iter(leaves)

    def sub(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return next(it)
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            return [next(it) for _ in a]
        return a

    outs = (ref or PRIMS_BY_OP[op].ref)(*[sub(a) for a in args], **kwargs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    gen = torch.Generator().manual_seed(seed)
    cts = [torch.randn(o.shape, generator=gen, dtype=o.dtype) if o.dtype.is_floating_point
           else None for o in outs]
    got = run_joint(j, inputs, cts)
    wrt = [x for x in leaves if x.requires_grad]
    pairs = [(o, c) for o, c in zip(outs, cts, strict=True) if c is not None and o.requires_grad]
    want = torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs],
                               allow_unused=True)
    assert len(got) == len(wrt)
    for g, w, x in zip(got, want, wrt, strict=True):
        w = torch.zeros_like(x) if w is None else w
        torch.testing.assert_close(g, w, equal_nan=True, atol=atol, rtol=rtol,
                                   msg=lambda msg: f"{op}: {msg}")  # noqa: B023


def _f64(shape: Sequence[int], low: float = -3, high: float = 3) -> st.SearchStrategy[Any]:
    return S.tensors(tuple(shape), torch.float64, low=low, high=high, special=False)


_DOMAIN = {"log": (0.1, 4), "log2": (0.1, 4), "log10": (0.1, 4), "log1p": (-0.9, 4),
           "sqrt": (0.1, 4), "rsqrt": (0.1, 4), "asin": (-0.9, 0.9), "acos": (-0.9, 0.9),
           "atanh": (-0.9, 0.9), "acosh": (1.1, 4), "erfinv": (-0.9, 0.9), "lgamma": (0.1, 4),
           "tan": (-1.2, 1.2)}
UNARY = sorted(p.name for p in PRIMS if p.group == "elementwise unary" and p.op in VJP_RULES)


@pytest.mark.parametrize("name", UNARY)
def test_unary(name: str) -> None:
    low, high = _DOMAIN.get(name, (-3, 3))

    @_SETTINGS
    @given(S.shapes(0, 3).flatmap(lambda s: _f64(s, low, high)), st.integers(0, 99))
    def run(x: torch.Tensor, seed: int) -> None:
        check_prim(f"prims.{name}", [x], seed=seed)

    run()


BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2", "fmod", "remainder"]


@pytest.mark.parametrize("name", BINARY)
def test_binary(name: str) -> None:
    @_SETTINGS
    @given(S.shapes(0, 3).flatmap(lambda s: st.tuples(_f64(s, 0.5, 3), _f64(s, -2, 2))),
           st.integers(0, 99), st.booleans())
    def run(xy: tuple[torch.Tensor, torch.Tensor], seed: int, number: bool) -> None:
        x, y = xy
        if name in ("fmod", "remainder", "div"):
            y = y.sign().where(y != 0, 1.0) * (y.abs() + 0.5)  # away from 0
        check_prim(f"prims.{name}", [x, 1.5 if number else y], seed=seed)

    run()


def test_maximum_minimum_ties_split_the_gradient() -> None:
    """torch's convention: where the operands tie, each gets half (and against a number the
    tensor gets all of it, as torch's clamp)."""
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    y = torch.tensor([1.0, 0.0, 5.0], dtype=torch.float64)
    check_prim("prims.maximum", [x, y])
    check_prim("prims.minimum", [x, y])
    m, inputs = _prim_module("prims.maximum", [x, 1.0], {})
    (g,) = run_joint(build_joint(m), inputs, [torch.ones(3, dtype=torch.float64)])
    assert g.tolist() == [1.0, 1.0, 1.0]


def test_abs_at_zero_and_pow_at_zero_base() -> None:
    check_prim("prims.abs", [torch.tensor([0.0, -1.0, 2.0], dtype=torch.float64)])
    base = torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64)
    check_prim("prims.pow", [base, torch.tensor([0.0, 2.0, -1.0], dtype=torch.float64)])
    check_prim("prims.pow", [base, 0])


def test_where_and_convert() -> None:
    c = torch.tensor([True, False, True])
    a, b = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    check_prim("prims.where", [c, a, b])
    check_prim("prims.where", [c, a, 0.5])
    check_prim("prims.convert_element_type", [a], {"dtype": DType.f32}, atol=1e-6)
    # from an integer: no gradient flows (the parameter is not differentiable at all)
    m, _ = _prim_module("prims.convert_element_type", [torch.arange(3)], {"dtype": DType.f64})
    assert build_joint(m).graph("backward").outputs == []


# shape ops: (prim, args builder from a drawn f64 tensor of rank 3, kwargs)
def _shape_cases(x: torch.Tensor) -> list[tuple[str, list[Any], dict[str, Any]]]:
    a, b, c = x.shape
    return [
        ("prims.broadcast_in_dim", [x[:, :1]], {"shape": [2, a, 3, c],
                                                "broadcast_dims": [1, 2, 3]}),
        ("prims.broadcast_in_dim", [x[:1]], {"shape": [4, b, c, 2], "broadcast_dims": [0, 1, 2]}),
        ("prims.reshape", [x], {"shape": [b, a * c]}),
        ("prims.permute", [x], {"dims": [2, 0, 1]}),
        ("prims.slice", [x], {"start": [0, b // 2, 0], "limit": [a, b, c], "step": [2, 1, 3]}),
        ("prims.pad", [x, 0.5], {"config": [[1, -1, 0], [0, 2, 1], [-1, 1, 2]]}),
        ("prims.concatenate", [[x, x[:, :1]]], {"dim": 1}),
        ("prims.unsqueeze", [x], {"dims": [0, 3]}),
        ("prims.squeeze", [x[:, :1]], {"dims": [1]}),
        ("prims.rev", [x], {"dims": [0, 2]}),
        ("prims.sum", [x], {"dims": [0, 2]}),
        ("prims.prod", [x], {"dims": [1, 2]}),
        ("prims.amax", [x], {"dims": [1]}),
        ("prims.amin", [x], {"dims": [0, 2]}),
        ("prims.cumsum", [x], {"dim": 1}),
        ("prims.cumprod", [x], {"dim": 1}),
        ("prims.sort", [x], {"dim": 2, "descending": True}),
        ("prims.topk", [x], {"k": 1, "dim": 1, "largest": False}),
    ]


_ONE_CALL: dict[str, Callable[..., Any]] = {
    "prims.amax": lambda x, *, dims: torch.amax(x, dims),
    "prims.amin": lambda x, *, dims: torch.amin(x, dims),
}
_RANK3 = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(2, 3))


@pytest.mark.parametrize("case", range(18))
def test_shape_reduction_scan_sort(case: int) -> None:
    @_SETTINGS
    @given(_RANK3.flatmap(lambda s: S.tensors(s, torch.float64, low=-2, high=2, special=False)),
           st.integers(0, 99))
    def run(x: torch.Tensor, seed: int) -> None:
        x = x.round()  # small integers: ties in amax/amin and zeros in prod/cumprod
        op, args, kw = _shape_cases(x)[case]
        # amax/amin over several dims in one call share the gradient among all ties (eager's
        # rule); the prims' reference reduces one dim at a time
        ref = _ONE_CALL.get(op)
        check_prim(op, args, kw, seed=seed, ref=ref)

    run()


def _index_cases(x: torch.Tensor, idx: torch.Tensor) -> list[tuple[str, list[Any], dict[str, Any]]]:
    src = torch.randn(idx.shape, dtype=x.dtype)
    return [("prims.gather", [x, idx], {"dim": 1}),
            ("prims.scatter_add", [x, idx, src], {"dim": 1}),
            ("prims.scatter", [x, idx[:, :1], src[:, :1]], {"dim": 1})]


@pytest.mark.parametrize("case", range(3))
def test_indexing(case: int) -> None:
    @_SETTINGS
    @given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 5), st.data())
    def run(a: int, b: int, k: int, data: st.DataObject) -> None:
        x = torch.randn(a, b, dtype=torch.float64)
        idx = torch.tensor(data.draw(st.lists(st.integers(0, b - 1), min_size=a * k,
                                              max_size=a * k))).reshape(a, k)
        op, args, kw = _index_cases(x, idx)[case]
        check_prim(op, args, kw)

    run()


def test_matmul() -> None:
    @_SETTINGS
    @given(st.integers(0, 3), st.integers(1, 3), st.integers(0, 3), st.integers(1, 2))
    def run(m: int, k: int, n: int, batch: int) -> None:
        a = torch.randn(batch, m, k, dtype=torch.float64)
        b = torch.randn(batch, k, n, dtype=torch.float64)
        check_prim("prims.matmul", [a, b])

    run()


def test_convolution() -> None:
    """Input and weight gradients over groups, stride, padding and dilation (1-d and 2-d)."""

    @settings(_SETTINGS, max_examples=25)
    @given(st.integers(1, 2), st.sampled_from([1, 2]), st.integers(1, 2), st.integers(1, 2),
           st.integers(1, 3), st.integers(0, 2), st.integers(1, 2), st.integers(1, 2),
           st.integers(4, 7), st.booleans())
    def run(n: int, g: int, cg: int, og: int, k: int, p: int, s: int, d: int, size: int,
            two_d: bool) -> None:
        spatial = [size, size - 1] if two_d else [size]
        ks = [k, max(1, k - 1)] if two_d else [k]
        if any(sz + 2 * p - d * (kk - 1) - 1 < 0 for sz, kk in zip(spatial, ks)):
            return
        x = torch.randn(n, g * cg, *spatial, dtype=torch.float64)
        w = torch.randn(g * og, cg, *ks, dtype=torch.float64)
        r = len(spatial)
        check_prim("prims.convolution", [x, w], {"stride": [s] * r, "padding": [p] * r,
                                                 "dilation": [d] * r, "groups": g})

    run()


# ---- the registry's contract with the joint graph -------------------------------------------

def test_a_rule_with_a_wrong_type_is_reported() -> None:
    m, _ = _prim_module("prims.neg", [torch.randn(2, 3)], {})
    bad: Callable[[VJPContext, Node, list[Value | None]], list[Any]] = \
        lambda ctx, node, cts: [ctx.p("sum", cts[0], dims=[0])]  # noqa: E731
    from ember.autograd.vjp import core

    old = core.VJP_RULES["prims.neg"]
    core.VJP_RULES["prims.neg"] = bad
    try:
        with pytest.raises(ValueError, match="prims.neg gave a cotangent f32\\[3\\]"):
            build_joint(m)
    finally:
        core.VJP_RULES["prims.neg"] = old
