"""The fast guard check (runtime/fastguards.py): reads through instance dicts where a guard has
fixed an object's type or identity, and never passes where the full check fails. Every shortcut
it takes has a change here that must still recompile."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ember.runtime.testing import assert_same
from packages.runtime.tests.guard_checks import (
    assert_checks_agree,
    both_ways,
    compiled_eager,
)


class Config:
    """A config with a Python __getattribute__ mapping aliases (as transformers' configs)."""

    attribute_map = {"width": "hidden"}
    # set by the tests (absent until then: the guards check that they are absent)
    gate: int
    other: str

    def __init__(self) -> None:
        self.hidden = 3
        self.use_bias = True
        self.mode = "sum"

    def __getattribute__(self, key: str) -> Any:
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class Block(nn.Module):
    extra: torch.Tensor | float  # (set by the tests: a buffer or a float)

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.lin(x) * self.scale
        if hasattr(self, "extra"):
            y = y + self.extra
        return y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = Config()
        self.block = Block()
        self.norm = nn.LayerNorm(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        if self.config.use_bias:
            y = y + 1
        if self.config.mode == "sum":
            y = y + x
        if not hasattr(self.config, "gate"):
            y = y * 2
        if self.training:
            y = y - 1
        out: torch.Tensor = self.norm(y)
        return out


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    with torch.no_grad():  # (the guards check grad mode first: keep it fixed)
        yield


def test_fast_check_is_built_and_reads_dicts() -> None:
    m = Net()
    c, cf, x = compiled_eager(m, 2, 3)
    code = cf.entries[0].code
    assert code.fast_source is not None and code.guard is not code.full
    src = code.fast_source
    assert "hasattr(" not in src  # absent attributes: dict lookups
    assert "._modules[" not in src and "._forward_hooks" not in src  # modules: their dicts
    assert "_ga(" in src  # the config's reads skip its Python __getattribute__
    assert code.guard(m, (x,), {}) == code.full(m, (x,), {})
    assert code.check(m, (torch.randn(3, 3),), {}) == code.full(m, (torch.randn(3, 3),), {})


def _recompiles(change: Any, reason: str) -> None:
    m = Net()
    c, cf, x = compiled_eager(m, 2, 3)
    assert_same(m(x), c(x))
    change(m)
    assert_same(m(x), c(x))
    assert_same(m(x), c(x))
    h = cf.history
    assert len(h.graphs) == 2, h.recompilations
    assert len(h.recompilations) == 1 and reason in h.recompilations[0], h.recompilations


def test_module_attribute_change_recompiles() -> None:
    _recompiles(lambda m: setattr(m.block, "scale", 3.0), "self.block.scale is 3.0")


def test_submodule_swap_recompiles() -> None:
    _recompiles(lambda m: setattr(m.block, "lin", nn.Linear(3, 3)), "self.block.lin is")


def test_forward_hook_recompiles() -> None:
    _recompiles(lambda m: m.norm.register_forward_hook(lambda mod, i, o: o * 3),
                "self.norm has no forward/backward hooks")


def test_training_flag_recompiles() -> None:
    _recompiles(lambda m: m.eval(), "self.training is False, expected True")


def test_requires_grad_change_recompiles() -> None:
    _recompiles(lambda m: m.block.lin.weight.requires_grad_(False),
                "self.block.lin.weight: requires_grad False")


def test_parameter_data_dtype_change_recompiles() -> None:
    def change(m: Net) -> None:
        m.norm.weight.data = m.norm.weight.data.double()
        m.norm.bias.data = m.norm.bias.data.double()
        m.block.lin.double()
        m.block.lin.float()  # back to float: new storages, same parameters, no change
    m = Net()
    c, cf, x = compiled_eager(m, 2, 3)
    change(m)
    want, got = both_ways(m, c, x)
    assert type(want) is type(got)
    h = cf.history
    assert any("self.norm.weight: dtype float64" in r for r in h.recompilations), \
        h.recompilations


def test_config_attribute_and_alias_changes_recompile() -> None:
    _recompiles(lambda m: setattr(m.config, "mode", "none"), "self.config.mode is 'none'")
    _recompiles(lambda m: setattr(m.config, "use_bias", False), "self.config.use_bias")


def test_absent_attribute_added_recompiles() -> None:
    _recompiles(lambda m: setattr(m.config, "gate", 1), "self.config has no attribute 'gate'")
    _recompiles(lambda m: setattr(Config, "gate", 1), "'gate'")
    del Config.gate
    _recompiles(lambda m: m.block.register_buffer("extra", torch.ones(3)),
                "self.block has no attribute 'extra'")
    _recompiles(lambda m: setattr(m.block, "extra", 0.5),
                "self.block has no attribute 'extra'")


def test_attribute_alias_added_recompiles() -> None:
    # the config's __getattribute__ starts mapping a name capture read directly
    def change(m: Net) -> None:
        m.config.attribute_map = {"width": "hidden", "mode": "other"}
        m.config.other = "none"
    _recompiles(change, "self.config")


_CHANGES = [
    lambda m: setattr(m.block, "scale", 2.0),  # same value: no recompile needed
    lambda m: setattr(m.block, "scale", 5.0),
    lambda m: setattr(m.config, "mode", "none"),
    lambda m: setattr(m.config, "mode", "sum"),
    lambda m: setattr(m.config, "gate", 1),
    lambda m: m.config.__dict__.pop("gate", None),
    lambda m: m.train(),
    lambda m: m.eval(),
    lambda m: setattr(m.block, "lin", nn.Linear(3, 3)),
    lambda m: m.norm.weight.requires_grad_(not m.norm.weight.requires_grad),
    lambda m: setattr(m.norm, "weight", nn.Parameter(torch.ones(3))),
    lambda m: m.block.register_buffer("extra", torch.ones(3)),
    lambda m: m.block.__dict__["_buffers"].pop("extra", None),
]


@settings(max_examples=25)
@given(st.lists(st.integers(0, len(_CHANGES) - 1), max_size=6),
       st.sampled_from([(2, 3), (4, 3)]))
def test_fast_check_agrees_with_full_check(changes: list[int], shape: tuple[int, int]) -> None:
    """After any mutations, the fast check gives what the full check gives: the same inputs
    (the same objects) when the guards hold, the same failing index when not."""
    m = Net()
    c, cf, x = compiled_eager(m, 2, 3)
    code = cf.entries[0].code
    assert code.fast_source is not None
    for i in changes:
        _CHANGES[i](m)
        assert_checks_agree(code, m, torch.randn(*shape))
