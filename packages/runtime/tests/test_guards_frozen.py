"""The fast guard check's identity test for immutable values (runtime/fastguards.py
`_frozen_anchor`): the guards on a conv's `stride`/`padding`/`dilation` tuples and a norm's
`eps` are tested as `value is <the value captured>` first, the guards themselves only where
that fails. Every change of such a value, and of every other guarded property of the model
(parameter identity, requires_grad, dtype, the input's shape, training, hooks, grad mode),
must still recompile; an equal value in a new object must not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ember.runtime.testing import assert_same
from packages.runtime.tests.guard_checks import assert_checks_agree, both_ways, compiled_eager


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU6()
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv2(self.act(self.bn(self.conv(x))))
        return out


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    with torch.no_grad():  # (grad mode is guarded first: keep it fixed but where changed)
        yield


def _net() -> tuple[Net, Any, Any, torch.Tensor]:
    m = Net().eval()
    c, cf, x = compiled_eager(m, 2, 3, 8, 8)
    return m, c, cf, x


def test_immutable_values_are_tested_by_identity_first() -> None:
    m, c, cf, x = _net()
    code = cf.entries[0].code
    src = code.fast_source
    assert src is not None
    # the stride tuple's five guards (type, length, two items' type and value) as one test
    assert src.count(" is FZ") >= 5, src  # stride, padding, dilation, eps, momentum, ...
    merged = [ln for ln in src.splitlines() if " is FZ" in ln and "len(" in ln]
    assert merged, src
    assert_checks_agree(code, m, x)


def _recompiles(change: Callable[[Net], Any], reason: str, *, shape: tuple[int, ...] = ()
                ) -> None:
    m, c, cf, x = _net()
    change(m)
    if shape:
        x = torch.randn(*shape)
    want, got = both_ways(m, c, x)
    assert type(want) is type(got)
    if isinstance(want, torch.Tensor):
        assert_same(want, got)
    h = cf.history
    assert len(h.recompilations) == 1 and reason in h.recompilations[0], h.recompilations


@pytest.mark.parametrize("change, reason", [
    (lambda m: setattr(m.conv, "stride", (1, 1)), "self.conv.stride[0] is 1, expected 2"),
    (lambda m: setattr(m.conv, "stride", (2, 1)), "self.conv.stride[1] is 1, expected 2"),
    (lambda m: setattr(m.conv, "stride", [2, 2]), "type(self.conv.stride) is tuple"),
    (lambda m: setattr(m.conv, "stride", (2, 2, 2)), "len(self.conv.stride) is 3, expected 2"),
    (lambda m: setattr(m.bn, "momentum", 0.2), "self.bn.momentum is 0.2, expected 0.1"),
    (lambda m: setattr(m.conv, "padding", (1, 0)), "self.conv.padding[1] is 0, expected 1"),
    (lambda m: setattr(m.conv, "dilation", (2, 2)), "self.conv.dilation[0] is 2, expected 1"),
    (lambda m: setattr(m.conv, "padding_mode", "reflect"), "self.conv.padding_mode is 'reflect'"),
    (lambda m: setattr(m.bn, "eps", 1e-3), "self.bn.eps is 0.001, expected 1e-05"),
    (lambda m: setattr(m.bn, "eps", 1), "self.bn.eps is 1, expected 1e-05"),
    (lambda m: setattr(m.act, "min_val", -1.0), "self.act.min_val is -1.0, expected 0.0"),
    (lambda m: setattr(m.conv2, "weight", nn.Parameter(torch.randn(4, 4, 3, 3))),
     "self.conv2.weight: shape [4, 4, 3, 3]"),
    (lambda m: m.conv.weight.requires_grad_(False), "self.conv.weight: requires_grad False"),
    (lambda m: setattr(m.conv2.weight, "data", m.conv2.weight.data.double()),
     "self.conv2.weight: dtype float64"),
    (lambda m: m.bn.running_mean.resize_(2), "self.bn.running_mean"),
    (lambda m: m.train(), "self.bn.training is True, expected False"),
    (lambda m: m.act.register_forward_hook(lambda mod, i, o: o * 2),
     "self.act has no forward/backward hooks"),
])
def test_each_change_recompiles(change: Callable[[Net], Any], reason: str) -> None:
    _recompiles(change, reason)


def test_input_shape_and_grad_mode_recompile() -> None:
    _recompiles(lambda m: None, "x: shape", shape=(2, 3, 10, 10))
    m, c, cf, x = _net()
    with torch.enable_grad():
        assert_same(m(x), c(x))
    assert len(cf.history.recompilations) == 1, cf.history.recompilations


@pytest.mark.parametrize("change", [
    lambda m: setattr(m.conv, "stride", tuple([2, 2])),  # equal, another tuple object
    lambda m: setattr(m.conv, "padding", (int("1"), int("1"))),
    lambda m: setattr(m.bn, "eps", float("1e-05")),  # equal, another float object
    lambda m: setattr(m.bn, "momentum", 0.1 + 0.0 * len(str(m))),
])
def test_an_equal_value_in_another_object_does_not_recompile(change: Callable[[Net], Any]
                                                             ) -> None:
    m, c, cf, x = _net()
    change(m)
    assert_same(m(x), c(x))
    assert_checks_agree(cf.entries[0].code, m, x)
    assert cf.history.recompilations == [] and len(cf.entries) == 1


def test_a_new_parameter_of_the_same_metadata_is_read_not_recompiled() -> None:
    m, c, cf, x = _net()  # (parameters are the graph's inputs, guarded by their metadata)
    m.conv.weight = nn.Parameter(torch.randn(4, 3, 3, 3))
    assert_same(m(x), c(x))
    assert cf.history.recompilations == []


_CHANGES: list[Callable[[Net], Any]] = [
    lambda m: setattr(m.conv, "stride", (2, 2)),
    lambda m: setattr(m.conv, "stride", (1, 1)),
    lambda m: setattr(m.conv, "stride", [2, 2]),
    lambda m: setattr(m.conv, "padding", (1, 1)),
    lambda m: setattr(m.conv, "padding", (0, 1)),
    lambda m: setattr(m.bn, "eps", 1e-5),
    lambda m: setattr(m.bn, "eps", 1e-3),
    lambda m: setattr(m.bn, "eps", 1),
    lambda m: setattr(m.act, "max_val", 6.0),
    lambda m: setattr(m.act, "max_val", 5.0),
    lambda m: m.conv.weight.requires_grad_(not m.conv.weight.requires_grad),
]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, len(_CHANGES) - 1), max_size=6))
def test_fast_check_agrees_with_full_check(changes: list[int]) -> None:
    m, c, cf, x = _net()
    for i in changes:
        _CHANGES[i](m)
        for e in cf.entries:
            assert_checks_agree(e.code, m, x)
        assert_same(m(x), c(x))
