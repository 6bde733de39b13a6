"""A generated wrapper's one batch check of its tensor inputs (inductor/inputcheck.py, with the
runtime's C tensor checker registered): learned on the first call, it replaces the per-input
checks and the kernels' `.contiguous()` calls; any input it does not pass (a transposed view, a
wrong dtype or shape, another type, requires_grad changed) runs the per-input path with its
copies and errors, so results always match the interpreter."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.inductor.kernels import compile_module
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, Module, parse
from ember.runtime import tensorcheck

# every input reaches C++ kernels by address (made contiguous where it is not); %w two kernels
TEXT = """ember.ir 1.0

graph @f(%x: f32[8, 16], %w: f32[8, 16], %b: f32[16]) -> (f32[8, 16], f32[8]) {
  %y = aten.mul.Tensor(%x, %w) : f32[8, 16]
  %z = aten.add.Tensor(%y, %b) : f32[8, 16]
  %t = aten.tanh.default(%z) : f32[8, 16]
  %s = aten.sum.dim_IntList(%w, [1]) : f32[8]
  return (%t, %s)
}
"""

_M: list[Module] = []


def module() -> Module:
    if not _M:
        _M.append(compile_module(parse(TEXT)))
    return _M[0]


def inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g),
            torch.randn(16, generator=g)]


@pytest.fixture(autouse=True)
def _checker() -> None:
    if tensorcheck.checker() is None:
        pytest.skip("no C tensor checker here (no compiler or Python headers)")


def _same(got: Any, m: Module, ins: list[Any]) -> None:
    want = Interpreter(m).run(ins, "f").outputs
    for x, y in zip(got.outputs, want, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_learned_batch_check_skips_the_per_input_copies(monkeypatch: Any) -> None:
    m = module()
    w = generate(m, "f")
    ic = w.call.__globals__["_ic"]
    assert "_ic.check(" in w.source and not ic.learned
    assert "_bad('input %" not in w.source  # (the per-input checks: one loop, InputCheck.each)
    _same(w.call(inputs(0)), m, inputs(0))  # the first call learns
    assert ic.learned
    made: list[int] = []
    real = torch.Tensor.contiguous

    def counted(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        out = real(self, *a, **k)
        made.append(int(out is not self))  # 1: a copy
        return out
    monkeypatch.setattr(torch.Tensor, "contiguous", counted)
    got = w.call(inputs(1))
    assert made == []  # inputs the batch check passed are not made contiguous per kernel
    _same(got, m, inputs(1))
    x, wt, b = inputs(2)
    ins = [x, wt.t().contiguous().t(), b]  # (a transposed view: fails the batch check)
    made.clear()
    got = w.call(ins)
    # the per-input path made it contiguous for its two kernels once, not once per kernel
    assert sum(made) == 1 and "if _ok else" not in w.source
    _same(got, m, ins)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), change=st.sampled_from(
    ["none", "transposed", "parameter", "requires_grad", "dtype", "shape", "offset"]),
    which=st.integers(0, 2))
def test_any_input_the_batch_check_refuses_runs_the_per_input_path(
        seed: int, change: str, which: int) -> None:
    m = module()
    w = generate(m, "f")
    w.call(inputs(seed + 1))  # learned from plain contiguous inputs
    assert w.call.__globals__["_ic"].learned
    ins: list[Any] = inputs(seed)
    t = ins[which]
    if change == "transposed" and t.dim() == 2:
        ins[which] = t.t().contiguous().t()
    elif change == "parameter":
        ins[which] = torch.nn.Parameter(t)
    elif change == "requires_grad":
        ins[which] = t.requires_grad_()
    elif change == "offset":  # the same shape and strides, a storage offset
        ins[which] = torch.cat([torch.zeros(1), t.flatten()])[1:].view(t.shape)
    elif change == "dtype":
        with pytest.raises(RuntimeError, match="is torch.float64"):
            w.call([*ins[:which], t.double(), *ins[which + 1:]])
        return
    elif change == "shape":
        with pytest.raises(RuntimeError, match=r"expected f32\["):
            w.call([*ins[:which], t[:-1] if t.dim() else t, *ins[which + 1:]])
        return
    with torch.no_grad():
        _same(w.call(ins), m, ins)


def test_a_first_call_with_a_strided_input_learns_on_a_later_call() -> None:
    """A first call with a transposed input learns nothing from it, but the check tries
    again on later calls (calls 2, 4, 8, ...: a caller that always passes strided inputs
    pays a learning attempt ever more rarely), so a caller whose first call alone was
    strided gets the batch check from its second call on."""
    m = module()
    w = generate(m, "f")
    ic = w.call.__globals__["_ic"]
    x, wt, b = inputs(3)
    ins = [x, wt.t().contiguous().t(), b]
    _same(w.call(ins), m, ins)
    assert not ic.learned
    _same(w.call(inputs(4)), m, inputs(4))
    assert ic.learned
    _same(w.call(ins), m, ins)  # (still refused once learned: the per-input path)


def test_always_strided_inputs_try_to_learn_ever_more_rarely(monkeypatch: Any) -> None:
    m = module()
    w = generate(m, "f")
    ic = w.call.__globals__["_ic"]
    tries: list[int] = []
    calls = [0]
    real = ic._learn

    def counted(types: Any, ts: Any, spec: Any) -> bool:
        tries.append(calls[0])
        return real(types, ts, spec)
    monkeypatch.setattr(ic, "_learn", counted)
    ic.check = counted  # (the unlearned check the first call runs)
    x, wt, b = inputs(5)
    ins = [x, wt.t().contiguous().t(), b]
    for k in range(1, 40):
        calls[0] = k
        _same(w.call(ins), m, ins)
    assert tries == [1, 2, 4, 8, 16, 32] and not ic.learned
