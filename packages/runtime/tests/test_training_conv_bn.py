"""Convolution + BatchNorm training: the convolution gradients are torch's backward kernel (one
extern call per gradient that is needed), and BatchNorm's backward has the closed form (its
full-size reductions read only the cotangent and saved values, none waits for another), with
eager's losses, gradients and parameters over SGD steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember.runtime as er
from ember.ir import Graph, Node, TensorType, Value

CONV_BACKWARD = "aten.convolution_backward.default"
TOL: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-5}


class _Net(nn.Module):
    def __init__(self, bn: Callable[[int], nn.Module], layers: int = 2) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        c = 3
        for out in (4, 6)[:layers]:
            mods += [nn.Conv2d(c, out, 3, padding=1, bias=False), bn(out), nn.ReLU()]
            c = out
        self.body = nn.Sequential(*mods)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))  # type: ignore[no-any-return]


BNS: dict[str, Callable[[int], nn.Module]] = {
    "affine": nn.BatchNorm2d,
    "no-affine": lambda c: nn.BatchNorm2d(c, affine=False),
    "no-running-stats": lambda c: nn.BatchNorm2d(c, track_running_stats=False),
}


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 3, 6, 6, generator=g) * 2 + 1, torch.randint(0, 5, (4,), generator=g)


def _train(model: nn.Module, call: Callable[..., torch.Tensor], steps: int = 3) -> list[Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    got: list[Any] = []
    for i in range(steps):
        x, t = _data(i)
        opt.zero_grad()
        loss = F.cross_entropy(call(x), t)
        loss.backward()
        got.append((loss.detach(), [p.grad for p in model.parameters()]))
        opt.step()
    return got


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
@pytest.mark.parametrize("bn", sorted(BNS))
def test_conv_bn_training_matches_eager(bn: str, backend: str) -> None:
    torch.manual_seed(0)
    ref = _Net(BNS[bn])
    torch.manual_seed(0)
    model = _Net(BNS[bn])
    c = er.compile(model, backend=backend)
    torch.testing.assert_close(_train(model, c), _train(ref, ref), **TOL)
    torch.testing.assert_close(list(model.state_dict().values()),
                               list(ref.state_dict().values()), **TOL)
    rep = er.explain(c)
    assert "training" not in rep.fallback_kinds, str(rep)
    if backend == "inductor":
        assert any("its backward as" in n and "C++ kernel(s)" in n for n in rep.notes), \
            rep.notes


def _plan(layers: int) -> Any:
    from ember.capture import Captured, capture
    from ember.runtime.training import plan_training
    from ember.runtime.writeback import backend_module

    torch.manual_seed(0)
    m = _Net(nn.BatchNorm2d, layers)
    x, _ = _data(0)
    cap = capture(m, (x,), {})
    assert isinstance(cap, Captured), cap
    no_grad = {u.result for u in cap.updates if not u.grad}
    return plan_training(backend_module(cap), cap.input_examples, no_grad)


def test_convolution_gradients_are_one_kernel_call_each() -> None:
    # the second convolution needs both gradients, the first only its weight's (the batch
    # does not require grad): three calls, and no convolution written in prims
    bwd = _plan(2).backward.graph()
    calls = [n for n in bwd.nodes if n.op == CONV_BACKWARD]
    masks = sorted(tuple(n.args[-1]) for n in calls if isinstance(n.args[-1], list))
    assert masks == [(False, True, False), (False, True, False), (True, False, False)], masks
    assert not [n for n in bwd.nodes if n.op == "prims.convolution"]


def _full_size_sums(g: Graph, shape: tuple[int, ...]) -> list[Node]:
    return [n for n in g.nodes if n.op == "prims.sum" and isinstance(n.args[0], Value)
            and isinstance(n.args[0].type, TensorType)
            # NCHW, or NHWC where the backward computes channels-last (autograd/layout.py)
            and n.args[0].type.shape in (shape, (shape[0], shape[2], shape[3], shape[1]))]


def test_batchnorm_backward_reductions_do_not_wait_for_each_other() -> None:
    # closed form: sum(g) and sum(g * xhat) (and the parameters' sums) read the cotangent and
    # saved values only, so one pass computes them all; differentiating the mean and variance
    # as written chains them (the mean's term reduces what the variance's reduction gave).
    # Forward statistics the partitioner chose to recompute are not gradient reductions.
    plan = _plan(1)
    bwd = plan.backward.graph()
    forward = {r.name for n in plan.forward.graph().nodes for r in n.results}
    sums = [n for n in _full_size_sums(bwd, (4, 4, 6, 6)) if n.results[0].name not in forward]
    assert 2 <= len(sums) <= 4, [n.op for n in sums]
    made = {r: n for n in bwd.nodes for r in n.results}
    full = {id(n) for n in sums}

    def upstream(n: Node) -> set[int]:
        seen: set[int] = set()
        stack = [o for o in n.operands() if o in made]
        while stack:
            p = made[stack.pop()]
            if id(p) not in seen:
                seen.add(id(p))
                stack.extend(o for o in p.operands() if o in made)
        return seen

    for n in sums:
        assert not (upstream(n) & full), f"%{n.results[0].name} reduces another reduction"
