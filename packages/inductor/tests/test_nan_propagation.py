"""NaN and inf go through max/min/clamp-like ops and folded conv epilogues as in eager.

torch.relu, clamp, hardtanh, maximum and minimum keep NaN (as where(x > y, x, y) does not). The CPU target
folds eval BatchNorm and ReLU after a convolution (targets/cpu/epilogue.py): the ReLU there once
was oneDNN's post-op, which maps NaN to 0, so conv -> BatchNorm with a negative running
variance -> relu gave 0 where eager gives NaN (found by `ember minimize`).

Each group is compiled once (fixed shapes, so no recompiles); the examples vary the data only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.inductor  # noqa: F401  (registers the passes and the backend)
from ember.ir import parse
from ember.ir.backends import default_backends
from ember.runtime import FallbackWarning
from ember.runtime import compile as ember_compile

FAST = settings(max_examples=25, deadline=None)
SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf])


def _specials(n: int, values: st.SearchStrategy[float] = SPECIAL
              ) -> st.SearchStrategy[list[tuple[int, float]]]:
    return st.lists(st.tuples(st.integers(0, n - 1), values), max_size=6)


def _with(t: torch.Tensor, where: list[tuple[int, float]]) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    for i, v in where:
        flat[i] = v
    return t


def _close(got: Any, want: Any) -> None:
    for g, w in zip(got, want, strict=True):
        # the folded BatchNorm rounds differently from the unfolded chain (f32 tolerances)
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-4, atol=1e-4)


_COMPILED: dict[str, Callable[..., Any]] = {}


def _compiled(name: str, fn: Callable[..., Any], *args: torch.Tensor) -> Callable[..., Any]:
    """`fn` compiled by ember's inductor once per test session; a fallback to eager (which
    would make the comparison vacuous) is an error."""
    if name not in _COMPILED:
        c = ember_compile(fn, backend="inductor")
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            c(*args)
        _COMPILED[name] = c
    return _COMPILED[name]


# ---- pointwise max/min/clamp-like ops ------------------------------------------------------------

def pointwise(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.relu(x), F.relu6(x), F.hardtanh(x, -0.5, 0.5), torch.clamp(x, -0.3, 0.7),
            torch.clamp_min(x, 0.1), torch.clamp_max(x, -0.1), torch.clamp(x, min=y),
            torch.clamp(x, max=y), torch.maximum(x, y), torch.minimum(x, y),
            F.leaky_relu(x, 0.1), F.threshold(x, 0.2, -1.0),
            F.hardsigmoid(x), F.hardswish(x), F.elu(x), torch.where(x > y, x, y))


@FAST
@given(_specials(24), _specials(24), st.integers(0, 2**16))
def test_pointwise_propagate_nan_and_inf(wx: list[tuple[int, float]],
                                         wy: list[tuple[int, float]], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = _with(torch.randn(4, 6, generator=g), wx)
    y = _with(torch.randn(4, 6, generator=g), wy)
    fn = _compiled("pointwise", pointwise, x, y)
    _close(fn(x, y), pointwise(x, y))


# ---- convolutions with folded epilogues ----------------------------------------------------------

class ConvNet(nn.Module):
    """Three convolutions of x, each with a chain the CPU target folds: BatchNorm+ReLU,
    bias+ReLU, BatchNorm alone; and a linear+ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.cbr = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                 nn.ReLU())
        self.cr = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.cb = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.lr = nn.Sequential(nn.Linear(6, 5), nn.ReLU())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.cbr(x), self.cr(x), self.cb(x), self.lr(x)


_NET: list[ConvNet] = []


def _net() -> ConvNet:
    if not _NET:
        torch.manual_seed(0)
        _NET.append(ConvNet().eval())
    return _NET[0]


@FAST
@given(_specials(3 * 6 * 6), _specials(8, st.sampled_from([math.nan, -1.0, -0.5, -1e-30])),
       _specials(8, st.just(math.nan)), _specials(8, st.just(math.nan)),
       _specials(8, st.sampled_from([math.nan, -1.0])), st.integers(0, 2**16))
def test_conv_epilogues_propagate_nan(wx: list[tuple[int, float]],
                                      wvar: list[tuple[int, float]],
                                      wmean: list[tuple[int, float]],
                                      wbeta: list[tuple[int, float]],
                                      wgamma: list[tuple[int, float]], seed: int) -> None:
    """NaN/inf in the input, negative or NaN running variances (NaN after BatchNorm) and NaN
    statistics and affine parameters: the conv results equal eager's, NaN where eager's are.
    The parameters are changed between calls of one compiled module (read on every call)."""
    g = torch.Generator().manual_seed(seed)
    net = _net()
    x = _with(torch.randn(1, 3, 6, 6, generator=g), wx)
    with torch.no_grad():
        for bn in (net.cbr[1], net.cb[1]):
            assert isinstance(bn, nn.BatchNorm2d)
            bn.running_var.copy_(_with(torch.rand(8, generator=g) + 0.5, wvar))
            bn.running_mean.copy_(_with(torch.randn(8, generator=g), wmean))
            bn.bias.copy_(_with(torch.randn(8, generator=g), wbeta))
            bn.weight.copy_(_with(torch.randn(8, generator=g), wgamma))
        fn = _compiled("convnet", net, x)
        _close(fn(x), net(x))


# ---- the minimized reproducer ----------------------------------------------------------------------

MIN_IR = """ember.ir 1.0

graph @forward(%x: f32[2, 3, 16, 16], %w: f32[32, 3, 3, 3], %mean: f32[32], %var: f32[32], %gamma: f32[32], %beta: f32[32]) -> (f32[2, 32, 16, 16]) {
  %c = aten.convolution.default(%x, %w, none, [1, 1], [1, 1], [1, 1], false, [0, 0], 1) : f32[2, 32, 16, 16]
  %bn, %bn.0, %bn.1 = aten.native_batch_norm.default(%c, %gamma, %beta, %mean, %var, false, 0.1, 1e-05) : (f32[2, 32, 16, 16], f32[0], f32[0])
  %relu = aten.relu.default(%bn) : f32[2, 32, 16, 16]
  return (%relu)
}
"""  # noqa: E501


@pytest.mark.parametrize("backend", ["inductor", "prims"])
def test_minimized_conv_bn_relu_negative_running_var(backend: str) -> None:
    """conv -> batch norm (eval) -> relu with some running variances negative: those channels
    are NaN, as in eager (the inductor gave 0.0 there)."""
    g = torch.Generator().manual_seed(13)
    var = torch.randn(32, generator=g)
    inputs = [torch.randn(2, 3, 16, 16, generator=g), torch.randn(32, 3, 3, 3, generator=g),
              torch.randn(32, generator=g), var, torch.randn(32, generator=g),
              torch.randn(32, generator=g)]
    eager = torch.relu(F.batch_norm(F.conv2d(inputs[0], inputs[1], padding=1), inputs[2], var,
                                    inputs[4], inputs[5], False, 0.1, 1e-5))
    negative = var + 1e-5 < 0
    assert negative.any() and (~negative).any()
    assert eager[:, negative].isnan().all() and not eager[:, ~negative].isnan().any()
    run = default_backends().get(backend).prepare(parse(MIN_IR))
    (got,) = run(None, inputs).outputs
    torch.testing.assert_close(got, eager, equal_nan=True, rtol=1e-4, atol=1e-4)
