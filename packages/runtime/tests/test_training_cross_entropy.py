"""Cross-entropy in training: the loss is `lse(x) - x[t]` (the target's pick pushed through
log_softmax's subtractions, prims/decomp/losses.py), its backward one pointwise pass over the
saved logits; eager's values and input gradients for every target / ignore_index / weight /
reduction / label smoothing, on [N, C] and [N, C, H, W] inputs."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.capture import capture
from ember.ir import TensorType
from ember.runtime.training import plan_training
from ember.runtime.writeback import backend_module


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 5), c=st.integers(1, 6), spatial=st.booleans(),
       reduction=st.sampled_from(["mean", "sum", "none"]), ignore=st.sampled_from([-100, 0, 2]),
       ignored=st.floats(0.0, 1.0), weighted=st.booleans(),
       smoothing=st.sampled_from([0.0, 0.2]), scale=st.sampled_from([1.0, 40.0]),
       seed=st.integers(0, 2**31 - 1))
def test_cross_entropy_values_and_gradients_are_eagers(
        n: int, c: int, spatial: bool, reduction: str, ignore: int, ignored: float,
        weighted: bool, smoothing: float, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    shape = (n, c, 2, 3) if spatial else (n, c)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    tshape = (n, 2, 3) if spatial else (n,)
    t = torch.randint(0, c, tshape, generator=g)
    t[torch.rand(tshape, generator=g) < ignored] = ignore  # some (or all) targets ignored
    w = torch.rand(c, generator=g, dtype=torch.float64) + 0.1

    def f(x: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(x, t, weight=w if weighted else None, ignore_index=ignore,
                               reduction=reduction, label_smoothing=smoothing)

    xe = x.clone().requires_grad_()
    want = f(xe, t, w)
    ct = torch.randn(want.shape, generator=g, dtype=torch.float64)
    (want_grad,) = torch.autograd.grad(want, xe, ct)
    xg = x.clone().requires_grad_()
    got = er.compile(f, backend="aot_eager")(xg, t, w)
    (got_grad,) = torch.autograd.grad(got, xg, ct)
    torch.testing.assert_close(got, want.detach(), equal_nan=True)
    torch.testing.assert_close(got_grad, want_grad, equal_nan=True)


def _plan(fn: Any, *args: Any) -> Any:
    cap = capture(fn, args, {})
    assert not isinstance(cap, Exception) and hasattr(cap, "module")
    return plan_training(backend_module(cap), cap.input_examples, set())


def _shape(v: Any) -> tuple[Any, ...]:
    return tuple(v.type.shape) if isinstance(v.type, TensorType) else ()


def test_the_forward_computes_no_log_probabilities() -> None:
    """Over the logits' shape the forward only shifts, exponentiates and reduces: no
    log_softmax tensor (x - max - log sum) is computed for the loss to pick from."""
    torch.manual_seed(0)
    m = nn.Linear(8, 10, bias=False)
    x, t = torch.randn(6, 8), torch.randint(0, 10, (6,))
    plan = _plan(lambda x, t: F.cross_entropy(m(x), t), x, t)
    full = [n.op for n in plan.forward.graph().nodes if _shape(n.results[0]) == (6, 10)]
    assert full.count("prims.sub") == 1, full  # x - max, not also (x - max) - log(sum)
    assert "prims.log" not in full, full


def test_log_probabilities_read_elsewhere_still_pick_right() -> None:
    """The log-probabilities also returned: computed once, the loss still eager's."""
    torch.manual_seed(0)
    m = nn.Linear(8, 5)
    x, t = torch.randn(7, 8), torch.randint(0, 5, (7,))

    def f(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp = F.log_softmax(m(x), 1)
        return F.nll_loss(lp, t), lp

    c = er.compile(f, backend="inductor")
    (loss, lp), (want_loss, want_lp) = c(x, t), f(x, t)
    (loss + lp.sum()).backward()
    got = [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
    m.zero_grad()
    (want_loss + want_lp.sum()).backward()
    torch.testing.assert_close([loss, lp], [want_loss, want_lp])
    torch.testing.assert_close(got, [p.grad for p in m.parameters()], rtol=1e-4, atol=1e-5)
