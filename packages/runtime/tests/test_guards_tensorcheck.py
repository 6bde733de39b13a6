"""The fast guard check's tensor checks in C (runtime/tensorcheck.py): every way torch offers to
change a tensor's metadata without a Python-visible signal (`p.data = ...`, `requires_grad_()`,
`resize_`, `set_`, `as_strided_`, in-place views) must still fail the check and recompile, and
the fast check must agree with the full Python check after any of them."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.overrides import TorchFunctionMode

from ember.runtime import tensorcheck
from packages.runtime.tests.guard_checks import (
    assert_checks_agree,
    both_ways,
    compiled_eager,
)


class Net(nn.Module):
    scale: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.lin(x) * self.scale.sum()
        return y


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    with torch.no_grad():  # (grad mode is guarded first: keep it fixed)
        yield


def test_checker_builds_and_the_fast_check_uses_it() -> None:
    assert tensorcheck.checker() is not None, "the C checker did not build or self-test"
    m = Net()
    c, cf, x = compiled_eager(m, 2, 4)
    code = cf.entries[0].code
    src = code.fast_source
    assert src is not None
    assert ".stride()" not in src and ".requires_grad" not in src  # all four tensors in C
    assert "(TT" in src
    assert code.guard(m, (x,), {}) == code.full(m, (x,), {})


def _mutated(change: Callable[[Net], Any], reason: str) -> None:
    m = Net()
    c, cf, x = compiled_eager(m, 2, 4)
    c(x)
    change(m)
    want, got = both_ways(m, c, x)
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert type(got) is type(want)
    h = cf.history
    assert any(reason in r for r in h.recompilations), h.recompilations


def _swap_data(p: torch.Tensor, new: torch.Tensor) -> None:
    p.data = new


def _scale(m: Net) -> Any:
    return m._buffers["scale"]


def _params(m: Net) -> Any:
    return m.lin._parameters


_MUTATIONS: list[tuple[str, Callable[[Net], Any], str]] = [
    ("data dtype", lambda m: _swap_data(m.lin.weight, m.lin.weight.data.double()),
     "self.lin.weight: dtype float64"),
    ("data shape", lambda m: _swap_data(m.lin.bias, torch.randn(1)),
     "self.lin.bias: shape [1]"),
    ("data strides", lambda m: _swap_data(m.lin.weight, m.lin.weight.data.t()),
     "self.lin.weight: stride [1, 4]"),
    ("requires_grad_", lambda m: m.lin.bias.requires_grad_(False),
     "self.lin.bias: requires_grad False"),
    ("resize_", lambda m: _scale(m).resize_(2), "self.scale: shape [2]"),
    ("set_", lambda m: _scale(m).set_(torch.ones(8)[::2]), "self.scale: stride [2]"),
    ("as_strided_", lambda m: _scale(m).as_strided_((2, 2), (1, 2)), "self.scale: shape [2, 2]"),
    ("unsqueeze_", lambda m: _scale(m).unsqueeze_(0), "self.scale: shape [1, 4]"),
    ("t_", lambda m: m.lin.weight.t_(),
     "self.lin.weight: stride [1, 4]"),
    ("parameter to tensor", lambda m: _params(m).__setitem__("bias", torch.zeros(4)),
     "self.lin.bias: type Tensor"),
]


@pytest.mark.parametrize("name,change,reason", _MUTATIONS, ids=[n for n, _, _ in _MUTATIONS])
def test_metadata_mutation_recompiles(name: str, change: Callable[[Net], Any],
                                      reason: str) -> None:
    _mutated(change, reason)


@pytest.mark.filterwarnings("ignore:.*sparse_coo tensor input")
def test_argument_type_and_layout_changes_recompile() -> None:
    c, cf, x = compiled_eager(Net(), 2, 4)
    h = cf.history
    for i, y in enumerate((nn.Parameter(torch.randn(2, 4)), torch.randn(4, 2).t(),
                           torch.randn(2, 4).to_sparse())):
        try:
            c(y)
        except Exception:  # (eager refuses a sparse input too: the guards are what matters)
            pass
        assert len(h.recompilations) == i + 1, h.recompilations
    assert "x: type Parameter" in h.recompilations[0]


def test_torch_function_mode_runs_the_full_check() -> None:
    class Spy(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    m = Net()
    c, cf, x = compiled_eager(m, 2, 4)
    code = cf.entries[0].code
    assert code.fast_source is not None
    if not isinstance(code.guard, types.FunctionType):  # a C guard program (guardvm.py)
        prog: Any = code.guard
        assert isinstance(prog(m, (x,), {}), list) and prog.failed == -1
        with Spy():
            assert isinstance(prog(m, (x,), {}), list)
        # the failing `if` is the last one, the tensor check's
        assert prog.failed == code.fast_source.count("return _full(S, A, K)") - 2
        return
    calls = [0]
    full = code.full

    def counted(*a: Any) -> Any:
        calls[0] += 1
        return full(*a)
    # the generated fast check calls the full check through its namespace's _full
    ns = code.guard.__globals__
    ns["_full"] = counted
    try:
        assert isinstance(code.guard(m, (x,), {}), list) and calls[0] == 0
        with Spy():
            assert isinstance(code.guard(m, (x,), {}), list)
        assert calls[0] == 1
    finally:
        ns["_full"] = full


def test_without_the_checker_the_fast_check_keeps_python_tensor_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensorcheck, "checker", lambda: None)
    m = Net()
    c, cf, x = compiled_eager(m, 2, 4)
    src = cf.entries[0].code.fast_source
    assert src is not None and ".stride() ==" in src and "(TT" not in src
    _swap_data(m.lin.weight, m.lin.weight.data.t())
    c(x)
    assert any("stride [1, 4]" in r for r in cf.history.recompilations)


def test_self_test_refuses_a_reader_that_misreads() -> None:
    mod = tensorcheck.checker()
    assert mod is not None

    class Broken:
        check = staticmethod(mod.check)

        @staticmethod
        def read(t: torch.Tensor) -> Any:
            got = mod.read(t)
            return got[:7] + (tuple(reversed(got[7])),) if got is not None else None

    class Lenient:
        read = staticmethod(mod.read)

        @staticmethod
        def check(types: Any, ts: Any, spec: bytes) -> bool:
            return True

    assert tensorcheck.self_test(mod) is None
    assert tensorcheck.self_test(Broken) is not None
    assert tensorcheck.self_test(Lenient) is not None


_STEPS = [m for _, m, _ in _MUTATIONS] + [
    lambda m: _swap_data(m.lin.weight, torch.randn(4, 4)),  # same metadata: still passes
    lambda m: m.lin.bias.requires_grad_(True),
    lambda m: _scale(m).set_(torch.ones(4)),
    lambda m: m.lin.weight.add_(1.0),  # a version bump, no metadata change
]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, len(_STEPS) - 1), max_size=5),
       st.sampled_from([(2, 4), (3, 4), (4, 2)]))
def test_fast_check_agrees_with_full_check(steps: list[int], shape: tuple[int, int]) -> None:
    """After any mutations, the C-backed fast check gives what the full check gives."""
    m = Net()
    c, cf, x = compiled_eager(m, 2, 4)
    code = cf.entries[0].code
    assert code.fast_source is not None and "(TT" in code.fast_source
    for i in steps:
        try:
            _STEPS[i](m)
        except RuntimeError:  # (a mutation the current metadata refuses)
            pass
        assert_checks_agree(code, m, torch.randn(*shape))


def _specs(ts: list[Any]) -> list[list[int]]:
    mod = tensorcheck.checker()
    out = []
    for t in ts:
        r = mod.read(t)
        out.append([*r[:6], *r[6], *r[7]])
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.data())
def test_long_tuples_fail_at_every_position(n: int, data: Any) -> None:
    """The check prefetches objects and TensorImpls ahead of the one it checks: a changed
    field, a wrong type or a non-tensor at any position (ahead of the check too) fails the
    check, never crashes it, and the unchanged tuple passes."""
    mod = tensorcheck.checker()
    if mod is None:
        pytest.skip("no C checker")
    base = torch.randn(6, 5)
    ts: list[Any] = [base[: 1 + i % 5] if i % 3 else nn.Parameter(torch.randn(i % 4 + 1))
                     for i in range(n)]
    specs = _specs(ts)
    types_ = tuple(type(t) for t in ts)
    assert mod.check(types_, tuple(ts), tensorcheck.pack(specs)) is True
    k = data.draw(st.integers(0, n - 1))
    what = data.draw(st.sampled_from(["field", "type", "object", "requires_grad"]))
    bad_types, bad_ts, bad_specs = list(types_), list(ts), [list(s) for s in specs]
    if what == "field":
        f = data.draw(st.integers(1, len(specs[k]) - 1))
        bad_specs[k][f] += 1
    elif what == "type":
        bad_types[k] = torch.Tensor if types_[k] is nn.Parameter else nn.Parameter
    elif what == "object":
        bad_ts[k] = data.draw(st.sampled_from([1, None, "x", object(), [torch.ones(1)]]))
    else:
        bad_ts[k] = ts[k].detach().requires_grad_(not ts[k].requires_grad)
        if type(ts[k]) is nn.Parameter:
            bad_ts[k] = nn.Parameter(bad_ts[k].detach(), requires_grad=not ts[k].requires_grad)
    assert mod.check(tuple(bad_types), tuple(bad_ts), tensorcheck.pack(bad_specs)) is False
