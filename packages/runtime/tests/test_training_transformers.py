"""Training the transformer parts fast: fused CPU attention kept as one extern forward and
backward (the min-cut saves its logsumexp, never the probabilities), cross-entropy's backward
as one pointwise pass (the target's pick differentiates to a one-hot select, softmax's max is
not differentiated, row statistics are saved rather than recomputed)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.autograd.joint import build_joint
from ember.autograd.testing import run_joint
from ember.capture import capture
from ember.ir import Graph, Interpreter, TensorType, parse, verify
from ember.runtime.training import plan_training
from ember.runtime.writeback import backend_module
from ember.testing.harness import decomposed, eager
from ember.testing.opdb import Sample

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
FLASH_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
TOL = {"rtol": 1e-4, "atol": 1e-5}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), hk=st.integers(1, 2), groups=st.integers(1, 2),
       ls=st.tuples(st.integers(1, 6), st.integers(1, 6)), e=st.integers(1, 5),
       form=st.sampled_from(["plain", "causal", "mask"]), scale=st.sampled_from([None, 0.5]),
       f64=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_flash_backward_decomposes_to_the_kernels_gradients(
        b: int, hk: int, groups: int, ls: tuple[int, int], e: int, form: str,
        scale: float | None, f64: bool, seed: int) -> None:
    """The backward kernel's decomposition (for pipelines that decompose it) gives torch's
    kernel's gradients: causal (L != S too), additive masks with -inf (fully masked rows),
    GQA's shared key/value heads, a given scale."""
    L, S = ls
    dt = torch.float64 if f64 else torch.float32
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hk * groups, L, e, generator=g, dtype=dt)
    k, v = (torch.randn(b, hk, S, e, generator=g, dtype=dt) for _ in range(2))
    kw: dict[str, Any] = {} if scale is None else {"scale": scale}
    if form == "mask":
        kw["attn_mask"] = torch.randn(b, 1, L, S, generator=g, dtype=dt).masked_fill(
            torch.rand(b, 1, L, S, generator=g) > 0.7, -math.inf)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, 0.0, form == "causal", **kw)
    sample = Sample((torch.randn_like(out), q, k, v, out, lse, 0.0, form == "causal"), kw)
    d, inputs = decomposed(FLASH_BACKWARD, sample)
    got = Interpreter(d).run(inputs).outputs
    torch.testing.assert_close(list(got), eager(FLASH_BACKWARD, sample), **TOL)


class _Attention(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.h = heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, s, d))  # type: ignore[no-any-return]


def _loss(m: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    y = m(x)
    return F.cross_entropy(y.reshape(-1, y.shape[-1]), t.reshape(-1))


def _plan(m: nn.Module, *args: Any) -> Any:
    cap = capture(lambda *a: _loss(m, *a), args, {})
    assert not isinstance(cap, Exception) and hasattr(cap, "module")
    return plan_training(backend_module(cap), cap.input_examples, set())


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_attention_trains_as_one_extern_forward_and_backward(backend: str) -> None:
    torch.manual_seed(0)
    ref = _Attention()
    torch.manual_seed(0)
    model = _Attention()
    x, t = torch.randn(2, 6, 16), torch.randint(0, 16, (2, 6))
    c = er.compile(lambda x, t: _loss(model, x, t), backend=backend)
    for m, fn in ((ref, lambda: _loss(ref, x, t)), (model, lambda: c(x, t))):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            loss = fn()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        m.losses = losses  # type: ignore[assignment]
    torch.testing.assert_close(model.losses, ref.losses, **TOL)
    torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), **TOL)
    rep = er.explain(c)
    assert not rep.fallbacks, str(rep)

    plan = _plan(model, x, t)
    fwd, bwd = plan.forward.graph(), plan.backward.graph()
    assert [n.op for n in fwd.nodes if n.op.startswith("aten.")] == [FLASH]
    assert [n.op for n in bwd.nodes if n.op.startswith("aten.")] == [FLASH_BACKWARD]
    # the backward recomputes the probabilities from the logsumexp: nothing [.., L, S] saved,
    # and no softmax written in prims on either side
    assert not [v for v in fwd.outputs[plan.n_results:] if _shape(v)[-2:] == (6, 6)]
    assert not [n for g in (fwd, bwd) for n in g.nodes if n.op == "prims.exp"
                and _shape(n.results[0])[-2:] == (6, 6)]


def _shape(v: Any) -> tuple[Any, ...]:
    return tuple(v.type.shape) if isinstance(v.type, TensorType) else ()


def _ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


def test_cross_entropy_backward_is_one_pass_over_the_logits() -> None:
    """No scatter into a dense zeros buffer (the target's pick is a one-hot select), no
    gradient through log_softmax's max (no amax or tie count in the backward), and the row
    statistics saved: the backward reads one saved [N, C] value (the logits, which the forward
    writes anyway, not exp(x - max)) and recomputes no reduction of the forward; the loss
    picks the target's logit, so no row sum of a one-hot reaches the backward."""
    torch.manual_seed(0)
    m = nn.Linear(8, 10)
    x, t = torch.randn(6, 8), torch.randint(0, 10, (6,))
    plan = _plan(m, x, t)
    bwd = plan.backward.graph()
    assert not {"prims.scatter_add", "prims.scatter", "prims.amax"} & set(_ops(bwd)), _ops(bwd)
    saved = plan.forward.graph().outputs[plan.n_results:]
    full = [v for v in saved if _shape(v) == (6, 10)]
    assert len(full) == 1, saved
    made = {r: n for n in plan.forward.graph().nodes for r in n.results}
    assert made[full[0]].op in ("prims.matmul", "prims.add"), made[full[0]].op  # x @ W^T + b
    # over the logits' shape: the bias gradient, nothing else
    sums = [n for n in bwd.nodes if n.op == "prims.sum" and _shape(n.args[0]) == (6, 10)]
    assert len(sums) == 1 and sums[0].kwargs["dims"] == [0], [str(n) for n in sums]
    # the same gradients as eager
    c = er.compile(lambda x, t: F.cross_entropy(m(x), t), backend="inductor")
    c(x, t).backward()
    got = [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
    m.zero_grad()
    F.cross_entropy(m(x), t).backward()
    torch.testing.assert_close(got, [p.grad for p in m.parameters()], **TOL)


GATHER = """ember.ir 1.0

graph @f(%x: f32[4, 5], %i: i64[4, 1]) -> (f32[4, 1]) {
  %g = prims.gather(%x, %i, dim=1) : f32[4, 1]
  return (%g)
}
"""


def test_a_gather_of_one_index_per_row_differentiates_to_a_one_hot_select() -> None:
    m = build_joint(parse(GATHER), inputs=[0])
    verify(m)
    assert "prims.scatter_add" not in _ops(m.graph("backward"))
    x, i = torch.randn(4, 5), torch.tensor([[3], [0], [4], [3]])
    ct = torch.tensor([[1.0], [float("nan")], [-2.0], [float("inf")]])
    lx = x.clone().requires_grad_()
    torch.gather(lx, 1, i).backward(ct)
    torch.testing.assert_close(run_joint(m, [x, i], [ct]), [lx.grad], equal_nan=True)
