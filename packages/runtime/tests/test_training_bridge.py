"""The training bridge's per-step work (runtime/training.py `_Step`): results that are inputs,
integer results, retained graphs and autograd's version checks of saved tensors, each as in
eager, on the compiled (aot_eager) forward and backward."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.runtime.training import TrainingRunner


def _pair(fn: Any) -> tuple[Any, Any]:
    return fn, er.compile(fn, backend="aot_eager")


def _grads(fn: Any, *args: torch.Tensor) -> list[Any]:
    xs = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*xs)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return [out, [x.grad for x in xs]]


def test_an_input_returned_as_is_is_eagers() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * w).sum(), w

    eager, comp = _pair(f)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    want, got = _grads(eager, x, w), _grads(comp, x, w)
    torch.testing.assert_close(got, want)
    wc = w.detach().clone().requires_grad_()
    loss, same = comp(x, wc)
    assert same is wc  # as eager's f returns w itself
    (loss + same.sum()).backward()
    torch.testing.assert_close(wc.grad, x + 1)
    entries = comp.entries
    assert isinstance(entries[0].runner, TrainingRunner)


def test_integer_results_are_not_differentiable() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.sin()
        return y.sum(), y.argmax()

    eager, comp = _pair(f)
    x = torch.randn(5, requires_grad=True)
    loss, idx = comp(x)
    assert not idx.requires_grad and idx.dtype is torch.int64
    assert int(idx) == int(eager(x)[1])
    loss.backward()
    torch.testing.assert_close(x.grad, x.detach().cos())


def test_retained_graph_backs_twice_and_accumulates() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).tanh().sum()

    comp = er.compile(f, backend="aot_eager")
    x, w = torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)
    loss = comp(x, w)
    loss.backward(retain_graph=True)
    assert w.grad is not None
    first = w.grad.clone()
    loss.backward()
    torch.testing.assert_close(w.grad, 2 * first)
    with pytest.raises(RuntimeError):
        loss.backward()  # freed after a backward without retain_graph, as in eager


def test_an_in_place_change_of_a_saved_input_is_refused_as_in_eager() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x * w).sin().sum()

    errors: list[bool | None] = []
    for fn in _pair(f):
        x, w = torch.randn(4), torch.randn(4, requires_grad=True)
        loss = fn(x, w)
        with torch.no_grad():
            x.add_(1)  # x is saved for w's gradient
        try:
            loss.backward()
            errors.append(None)
        except RuntimeError as e:
            errors.append("modified by an inplace operation" in str(e))
    assert errors == [True, True]
