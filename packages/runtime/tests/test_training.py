"""Training through compile(): eager's losses, gradients and parameters on every backend
(runtime/training.py, ember.autograd's joint graphs and partitioners)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.runtime.training import DOUBLE_BACKWARD

BACKENDS = ("eager", "aot_eager", "inductor")
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh(),
                         nn.Linear(8, 4))


def _frozen() -> nn.Module:
    m = _mlp()
    m[0].requires_grad_(False)  # a frozen first layer: no gradient, not even zeros
    return m


def _bn() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))


def _gn() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.Unflatten(1, (8, 1)), nn.GroupNorm(2, 8),
                         nn.Flatten(), nn.GELU(), nn.Linear(8, 4))


class _Inplace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h.mul_(2).add_(1)  # in-place ops on an intermediate value
        return self.b(F.relu_(h))


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e = nn.Embedding(10, 6, padding_idx=0)
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x.abs() * 3).long().clamp(0, 9)[:, :3]
        return self.fc(self.e(ids).mean(1))


class _Detached(nn.Module):
    """A detached branch, a no_grad region and an output the loss does not use."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.fc(x)
        with torch.no_grad():
            scale = y.abs().mean()
        return y * scale + y.detach() ** 2, y.sum(1)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": _mlp, "frozen": _frozen, "batchnorm": _bn, "groupnorm": _gn, "inplace": _Inplace,
    "embedding": _Embed, "detached": _Detached}


def _loss(out: Any, t: torch.Tensor) -> torch.Tensor:
    y = out[0] if isinstance(out, tuple) else out
    return F.cross_entropy(y, t)


def _nll(out: Any, t: torch.Tensor) -> torch.Tensor:
    """cross entropy as a gather of log_softmax (F.cross_entropy itself: see below)."""
    return -torch.gather(F.log_softmax(out, 1), 1, t[:, None]).mean()


def _data(step: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 6, generator=g), torch.randint(0, 4, (n,), generator=g)


def _train(model: nn.Module, call: Callable[..., Any], steps: int, sizes: list[int],
           input_grad: bool = False) -> list[Any]:
    """SGD with momentum; per step: the loss, the gradients, the input's gradient."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1,
                          momentum=0.9)
    got: list[Any] = []
    for i in range(steps):
        x, t = _data(i, sizes[i % len(sizes)])
        x.requires_grad_(input_grad)
        opt.zero_grad()
        loss = call(x, t)
        loss.backward()
        got.append((loss.detach(), [p.grad for p in model.parameters()], x.grad))
        opt.step()
    return got


def _compare(make: Callable[[], nn.Module], backend: str, steps: int = 3,
             sizes: tuple[int, ...] = (8,), loss_inside: bool = False,
             input_grad: bool = False, options: dict[str, Any] | None = None) -> Any:
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(0)
    model = make()
    if loss_inside:
        c = er.compile(lambda x, t: _nll(model(x), t), backend=backend, options=options)
        call = c
    else:
        c = er.compile(model, backend=backend, options=options)

        def call(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return _loss(c(x), t)

    loss = _nll if loss_inside else _loss
    want = _train(ref, lambda x, t: loss(ref(x), t), steps, list(sizes), input_grad)
    got = _train(model, call, steps, list(sizes), input_grad)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(list(model.state_dict().values()),
                               list(ref.state_dict().values()), **TOL)
    return c


def _no_training_fallback(c: Any) -> None:
    rep = er.explain(c)
    assert "training" not in rep.fallback_kinds, str(rep)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_matches_eager(name: str, backend: str) -> None:
    c = _compare(MODELS[name], backend)
    if backend == "inductor":
        _no_training_fallback(c)
        rep = er.explain(c)
        assert any("its backward as" in n and "C++ kernel(s)" in n for n in rep.notes), \
            rep.notes


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_inside_input_grads_and_batch_sizes(backend: str) -> None:
    c = _compare(_bn, backend, steps=4, sizes=(8, 5), loss_inside=True, input_grad=True)
    if backend != "eager":
        assert not er.explain(c).fallbacks, str(er.explain(c))


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_dropout_mask_is_the_forwards(backend: str) -> None:
    """ember draws its own (philox) mask: the gradient must be the forward's mask / (1 - p)."""
    torch.manual_seed(0)
    c = er.compile(lambda x: F.dropout(x, 0.5, training=True) * 3, backend=backend)
    x = (torch.rand(64, 8) + 0.5).requires_grad_()
    y = c(x)
    y.sum().backward()
    assert x.grad is not None
    kept = y != 0
    assert 0 < int(kept.sum()) < y.numel()
    torch.testing.assert_close(x.grad, kept.float() * 6)
    torch.testing.assert_close(y, x.detach() * kept * 6)


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_double_backward_is_refused(backend: str) -> None:
    c = er.compile(lambda x: (x.sin() * x).sum(), backend=backend)
    x = torch.randn(4, requires_grad=True)
    (g,) = torch.autograd.grad(c(x), x)  # a first backward works
    torch.testing.assert_close(g, x.detach().cos() * x.detach() + x.detach().sin())
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.grad(c(x), x, create_graph=True)


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_gradients_accumulate_and_unused_outputs(backend: str) -> None:
    torch.manual_seed(0)
    m = _Detached()
    c = er.compile(m, backend=backend)
    x = torch.randn(5, 6)
    for _ in range(2):  # two backward calls accumulate into .grad, as in eager
        y, unused = c(x)
        assert unused.requires_grad
        y.sum().backward()
    got = [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
    m.zero_grad()
    for _ in range(2):
        m(x)[0].sum().backward()
    torch.testing.assert_close(got, [p.grad for p in m.parameters()])


def test_missing_vjp_rule_is_an_honest_training_fallback() -> None:
    c = er.compile(lambda x: torch.digamma(x).sum())
    x = (torch.rand(4) + 1).requires_grad_()
    with pytest.warns(er.FallbackWarning, match="no VJP rule for prims.digamma"):
        c(x).backward()
    torch.testing.assert_close(x.grad, torch.polygamma(1, x.detach()))
    rep = er.explain(c)
    assert rep.fallback_kinds == {"training": 1}
    assert rep.fallbacks[0].ops == ("prims.digamma",)


def test_batchnorm_running_stats_with_eager_backend() -> None:
    """The write-back of running stats no longer breaks eager's saved tensors."""
    _compare(_bn, "eager", steps=2)


def test_partitioner_option_is_checked() -> None:
    with pytest.raises(ValueError, match="partitioner must be one of"):
        er.compile(_mlp(), options={"partitioner": "greedy"})
    with pytest.raises(ValueError, match="partitioner applies to"):
        er.compile(_mlp(), backend="eager", options={"partitioner": "min-cut"})


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(depth=st.integers(1, 3), width=st.integers(2, 9), bias=st.booleans(),
       act=st.sampled_from(["relu", "tanh", "sigmoid", "gelu", "silu"]))
def test_random_mlps_match_eager(depth: int, width: int, bias: bool, act: str) -> None:
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU,
            "silu": nn.SiLU}

    def make() -> nn.Module:
        layers: list[nn.Module] = []
        n = 6
        for _ in range(depth):
            layers += [nn.Linear(n, width, bias=bias), acts[act]()]
            n = width
        return nn.Sequential(*layers, nn.Linear(n, 4, bias=bias))

    _compare(make, "aot_eager", steps=2)


def _plans(make: Callable[[], nn.Module]) -> dict[str, Any]:
    from ember.capture import capture
    from ember.runtime.training import plan_training
    from ember.runtime.writeback import backend_module

    torch.manual_seed(0)
    m = make()
    x, _ = _data(0)
    cap = capture(m, (x,), {})
    assert not isinstance(cap, Exception) and hasattr(cap, "module")
    no_grad = {u.result for u in cap.updates if not u.grad}
    return {p: plan_training(backend_module(cap), cap.input_examples, no_grad, partitioner=p)
            for p in ("save-all", "recompute-all", "min-cut")}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_partitioners_saved_bytes(name: str) -> None:
    plans = _plans(MODELS[name])
    save_all, recompute, min_cut = (plans[p].report for p in ("save-all", "recompute-all",
                                                              "min-cut"))
    assert min_cut.saved_bytes <= save_all.saved_bytes
    fwd = plans["recompute-all"].forward.graph()
    params = {v.name for v in fwd.params}
    saved = fwd.outputs[len(fwd.outputs) - plans["recompute-all"].n_saved:]
    assert {v.name for v in saved} <= params  # recompute-all saves only inputs


@pytest.mark.parametrize("policy", ("save-all", "recompute-all", "min-cut"))
@pytest.mark.parametrize("name", ("batchnorm", "mlp"))
def test_partitioners_give_eagers_gradients(name: str, policy: str) -> None:
    _compare(MODELS[name], "aot_eager", steps=2, options={"partitioner": policy})


# ---- cross entropy inside the compiled function (aten.nll_loss_forward decomposed) ----------


def _train_loss(make: Callable[[], nn.Module], backend: str, loss: Callable[..., torch.Tensor],
                steps: int = 3, data: Callable[[int], Any] = _data) -> Any:
    """SGD over `steps` with `loss(model(x), t)` inside the compiled function, against eager:
    losses, gradients and parameters."""
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(0)
    model = make()
    c = er.compile(lambda x, t: loss(model(x), t), backend=backend)
    runs = []
    for m, call in ((ref, lambda x, t: loss(ref(x), t)), (model, c)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        got = []
        for i in range(steps):
            x, t = data(i)
            opt.zero_grad()
            out = call(x, t)
            out.backward()
            got.append((out.detach(), [p.grad for p in m.parameters()]))
            opt.step()
        runs.append((got, [p.detach() for p in m.parameters()]))
    torch.testing.assert_close(runs[1], runs[0], **TOL)
    return c


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_entropy_inside_compiled_function(backend: str) -> None:
    """An MLP classifier with F.cross_entropy in the compiled function: 3 SGD steps equal
    eager's, with no fallback of any kind (nll_loss_forward decomposes to prims)."""
    c = _train_loss(_mlp, backend, F.cross_entropy)
    rep = er.explain(c)
    assert not rep.fallbacks, str(rep)
    if backend == "inductor":
        assert any("its backward as" in n for n in rep.notes), rep.notes


def _ignored(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, t = _data(step)
    t[::3] = -100  # eager's default ignore_index
    return x, t


_CLASS_WEIGHT = torch.tensor([0.5, 2.0, 1.0, 0.25])
CE_VARIANTS: dict[str, tuple[Callable[..., torch.Tensor], Callable[[int], Any]]] = {
    "ignore_index": (F.cross_entropy, _ignored),
    "weight_mean": (lambda y, t: F.cross_entropy(y, t, weight=_CLASS_WEIGHT), _ignored),
    "sum": (lambda y, t: F.cross_entropy(y, t, reduction="sum", ignore_index=2), _data),
    "none": (lambda y, t: (F.cross_entropy(y, t, reduction="none") ** 2).mean(), _ignored),
    "label_smoothing": (lambda y, t: F.cross_entropy(y, t, label_smoothing=0.1,
                                                     weight=_CLASS_WEIGHT), _data),
    "nll_log_softmax": (lambda y, t: F.nll_loss(F.log_softmax(y, 1), t), _data),
}


@pytest.mark.parametrize("name", sorted(CE_VARIANTS))
def test_cross_entropy_variants(name: str) -> None:
    loss, data = CE_VARIANTS[name]
    c = _train_loss(_mlp, "inductor", loss, steps=2, data=data)
    assert not er.explain(c).fallbacks, str(er.explain(c))


class _Seg(nn.Module):
    """A per-pixel classifier: cross entropy on [N, C, H, W] is aten.nll_loss2d_forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _pixels(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    t = torch.randint(0, 4, (2, 5, 5), generator=g)
    t[0, 0] = -100
    return torch.randn(2, 3, 5, 5, generator=g), t


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_spatial_cross_entropy(backend: str) -> None:
    c = _train_loss(_Seg, backend, lambda y, t: F.cross_entropy(y, t, label_smoothing=0.05),
                    steps=2, data=_pixels)
    assert not er.explain(c).fallbacks, str(er.explain(c))


# ---- what a compiled training step keeps alive ------------------------------------------------


def _peak_step_bytes(step: Callable[[], Any]) -> int:
    """The most torch CPU allocator bytes live during `step()` above those live at its start
    (the profiler's memory events, as benchmarks/training.py measures)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    assert prof.profiler is not None
    live = peak = 0
    for _, n in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                       if e.name() == "[memory]"):
        live += n
        peak = max(peak, live)
    return peak


def test_training_step_peak_memory_is_eagers() -> None:
    """Saved weights are not copied (min-cut saves W, not W^T), weight gradients are not
    transposed copies, and the compiled backward frees each saved activation after its last use
    (boxed inputs): the step's peak is eager's, which holds the gradients plus one activation."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                        nn.Linear(256, 10))
    model = copy.deepcopy(ref)
    x, t = torch.randn(128, 64), torch.randint(0, 10, (128,))
    peaks = []
    for m, fn in ((ref, lambda: F.cross_entropy(ref(x), t)),
                  (model, er.compile(lambda: F.cross_entropy(model(x), t), backend="inductor"))):
        def step(m: nn.Module = m, fn: Callable[[], torch.Tensor] = fn) -> None:
            fn().backward()
            for p in m.parameters():
                p.grad = None
        for _ in range(2):
            step()
        peaks.append(_peak_step_bytes(step))
    eager, ember = peaks
    assert ember <= eager * 1.02, (ember, eager)


def test_warm_training_compile_comes_from_the_cache(tmp_path: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A new compiled object for the same graph reads the plan and both compiled graphs from
    the training compile cache: no decomposition, joint graph, partition or pipeline runs."""
    import importlib

    from ember.inductor import cache

    compile_mod = importlib.import_module("ember.runtime.compile")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    calls = {"plan": 0, "pipeline": 0}
    plan, pipeline = compile_mod.plan_training, compile_mod.CompiledFunction._run_pipeline

    def counted_plan(*a: Any, **k: Any) -> Any:
        calls["plan"] += 1
        return plan(*a, **k)

    def counted_pipeline(self: Any, m: Any) -> Any:
        calls["pipeline"] += 1
        return pipeline(self, m)

    monkeypatch.setattr(compile_mod, "plan_training", counted_plan)
    monkeypatch.setattr(compile_mod.CompiledFunction, "_run_pipeline", counted_pipeline)
    torch.manual_seed(0)
    model = _mlp()
    x, _ = _data(0)
    grads = []
    for _ in range(2):
        cache.forget_loaded()  # as a new process would: the C++ comes from the kernel cache
        c = er.compile(lambda x: model(x).square().mean(), backend="inductor")
        model.zero_grad()
        c(x).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        notes = er.explain(c).notes
    assert calls == {"plan": 1, "pipeline": 2}, calls  # the first compile only
    assert any("from the training compile cache" in n for n in notes), notes
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    ref = [g.clone() for g in grads[0]]
    model.zero_grad()
    model(x).square().mean().backward()
    torch.testing.assert_close(ref, [p.grad for p in model.parameters()], **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_op_on_a_compiled_result_as_in_eager(backend: str) -> None:
    # the inductor reuses a dead buffer (layer norm's) for the residual add's result: returned
    # as a view of it, autograd refused `out += 1` on an autograd.Function's output
    torch.manual_seed(0)
    ln, fc1, fc2 = nn.LayerNorm(16), nn.Linear(16, 32), nn.Linear(32, 16)

    def block(x: torch.Tensor) -> torch.Tensor:
        return x + fc2(F.gelu(fc1(ln(x))))

    x = torch.randn(8, 16, requires_grad=True)
    want = block(x)
    want += 1
    want.square().sum().backward()
    want_grads = [x.grad, fc1.weight.grad]
    x.grad = fc1.weight.grad = None
    got = er.compile(block, backend=backend)(x)
    got += 1
    got.square().sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close([x.grad, fc1.weight.grad], want_grads)
