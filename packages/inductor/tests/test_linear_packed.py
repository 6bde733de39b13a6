"""`loop.linear_packed` (targets/cpu/linear.py): `x @ w.T` for a parameter `w` on oneDNN's packed
weight, cached on the weight and repacked when it changes; small products (by the thread
count), training and other matmuls stay torch.mm. The bound call's fast path (its last call's
pack, remembered) still follows weight updates, grad mode and the thread count."""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import linear, packed
from ember.ir import parse
from ember.runtime.bench import ember_status
from ember.runtime.compile import compile as ember_compile

needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="oneDNN's packed weights need mkldnn")


@pytest.fixture
def threads() -> Iterator[None]:
    """The test may set the thread count: restored after it."""
    before = torch.get_num_threads()
    yield None
    torch.set_num_threads(before)

MATMULS = """ember.ir 1.0

graph @f(%x: f32[64, 32], %w: f32[48, 32], %v: f32[32, 48]) -> (f32[64, 48], f32[64, 48], f32[64, 48]) {
  %wt = prims.permute(%w, dims=[1, 0]) : f32[32, 48]
  %a = prims.matmul(%x, %wt) : f32[64, 48]
  %b = prims.matmul(%x, %v) : f32[64, 48]
  %w2 = prims.mul(%w, 2.0) : f32[48, 32]
  %w2t = prims.permute(%w2, dims=[1, 0]) : f32[32, 48]
  %c = prims.matmul(%x, %w2t) : f32[64, 48]
  return (%a, %b, %c)
}
"""


def test_only_a_graph_input_weight_is_a_packed_linear() -> None:
    """x @ w.T on the input w: the packed extern; x @ v on the input v: the packed extern with
    kn=true; x @ (2w).T (a computed weight, new every call): the plain matmul extern. All
    match torch."""
    compiled = compile_module(parse(MATMULS))
    ops = [(n.kwargs["op"], n.kwargs.get("kn")) for n in compiled.graph().nodes
           if n.op == "kernels.extern" and n.kwargs["op"] in ("prims.matmul", linear.LINEAR_OP)]
    assert ops == [(linear.LINEAR_OP, None), (linear.LINEAR_OP, True), ("prims.matmul", None)]
    g = torch.Generator().manual_seed(0)
    x, w, v = (torch.randn(s, generator=g) for s in ([64, 32], [48, 32], [32, 48]))
    got = compiled_runner(compiled)(None, [x, w, v]).outputs
    for a, b in zip(got, [x @ w.T, x @ v, x @ (2 * w).T], strict=True):
        torch.testing.assert_close(a, b)


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    # 256x256x512 and 256x512x128 multiply-adds: packed; 256x128x4 (0.13M): below SMALL_LINEAR
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 4)).eval()


@needs_mkldnn
def test_compiled_linears_match_eager_and_follow_weight_updates() -> None:
    """Inference: the large products run on packed weights (cached), the small one on
    torch.mm (not cached); an in-place update and a `.data` reassignment between calls are
    picked up."""
    net = _mlp()
    x = torch.randn(4, 64, 256)
    f = ember_compile(net)
    big, mid, small = net[0], net[2], net[4]
    assert isinstance(big, torch.nn.Linear) and isinstance(mid, torch.nn.Linear) \
        and isinstance(small, torch.nn.Linear)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        status = ember_status(f)
        assert status["compiled_graphs"] == 1 and not status["fallbacks"], status["status"]
        assert [packed.is_cached(m.weight) for m in (big, mid, small)] == [True, True, False]
        first = packed.cached_pack(big.weight, (linear.LINEAR_OP,), lambda: torch.empty(0))
        big.weight.mul_(-0.5)  # an optimizer-like in-place step: repacked
        torch.testing.assert_close(f(x), net(x))
        assert packed.cached_pack(big.weight, (linear.LINEAR_OP,),
                                  lambda: torch.empty(0)) is not first
        mid.weight.data = torch.randn(128, 512)  # a new storage, same version counter
        torch.testing.assert_close(f(x), net(x))


class Conv1D(torch.nn.Module):
    """GPT-2's linear: x @ w + b on an [in, out] weight (transformers' pytorch_utils.Conv1D)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_in, n_out) * 0.05)
        self.bias = torch.nn.Parameter(torch.randn(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.reshape(*x.shape[:-1], -1)


@needs_mkldnn
def test_an_untransposed_weight_is_packed_from_its_transpose() -> None:
    """Conv1D's x @ w: packed (kn=true), matches eager, an in-place update is picked up."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(Conv1D(256, 384), torch.nn.GELU(), Conv1D(384, 256)).eval()
    x = torch.randn(2, 64, 256)
    f = ember_compile(net)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        status = ember_status(f)
        assert status["compiled_graphs"] == 1 and not status["fallbacks"], status["status"]
        assert all(packed.is_cached(m.weight) for m in net if isinstance(m, Conv1D))
        w = net[0].weight
        assert isinstance(w, torch.nn.Parameter)
        w.mul_(-2)
        torch.testing.assert_close(f(x), net(x))


@needs_mkldnn
def test_training_runs_torch_mm_and_its_gradients_match_eager() -> None:
    """A training forward (the joint graph's @forward) keeps the plain matmul extern: nothing
    packed, and the gradients are eager's, step after step."""
    net = _mlp().train()
    ref = _mlp().train()
    x = torch.randn(4, 64, 256)
    f = ember_compile(net)
    for _ in range(2):
        for m in (net, ref):
            m.zero_grad()
        f(x).square().sum().backward()
        ref(x).square().sum().backward()
        assert not any(packed.is_cached(p) for p in net.parameters())
        for p, q in zip(net.parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3)
        with torch.no_grad():
            for p, q in zip(net.parameters(), ref.parameters(), strict=True):
                assert p.grad is not None and q.grad is not None
                p.sub_(0.1 * p.grad)
                q.sub_(0.1 * q.grad)


@needs_mkldnn
def test_the_call_picks_onednn_by_size_and_operands(threads: None) -> None:
    """`linear.linear`: oneDNN (a cached pack) only for a large f32 product on a contiguous x
    with a Parameter weight; every path is x @ w.T."""
    w = torch.nn.Parameter(torch.randn(256, 128), requires_grad=False)
    torch.set_num_threads(1)  # (the size rule at 1 thread)
    cases = [(torch.randn(64, 128), w, True),  # 2M multiply-adds
             (torch.randn(8, 128), w, False),  # 0.26M: torch.mm
             (torch.randn(128, 64).t(), w, False),  # not contiguous
             (torch.randn(64, 128), w.detach().clone(), False)]  # not a Parameter
    for x, wt, fast in cases:
        packed._PACKS.pop(id(wt), None)
        torch.testing.assert_close(linear.linear(x, wt), x @ wt.T)
        assert packed.is_cached(wt) == fast


# rows of the 16-core Xeon's table (linear.py's PACKED_K comment; oneDNN packed vs addmm, us, at
# 16 threads): (M, K, N, bias, oneDNN the faster)
TABLE_16 = [(32, 256, 256, False, False),  # levit: 27.4 vs 11.9
            (256, 256, 256, False, False),  # llama: 46.8 vs 39.0
            (256, 256, 256, True, True),  # bert (addmm's bias pass): 57.0 vs 66.1
            (2, 768, 1000, True, False),  # swin's head: 28.3 vs 18.4
            (98, 512, 256, False, True),  # levit: 43.9 vs 48.3
            (256, 1024, 256, False, True),  # llama: 119.6 vs 200.0
            (394, 3072, 768, True, True)]  # vit_b_16: 1546 vs 2106


def test_the_size_rule_picks_the_faster_of_the_16_thread_table() -> None:
    assert [linear.use_packed(m, k, n, b, 16) for m, k, n, b, _ in TABLE_16] \
        == [want for *_, want in TABLE_16]


@given(m=st.integers(1, 4096), k=st.integers(1, 4096), n=st.integers(1, 4096),
       bias=st.booleans(), threads=st.sampled_from([1, 2]))
def test_at_one_or_two_threads_the_rule_is_small_linear(m: int, k: int, n: int, bias: bool,
                                                         threads: int) -> None:
    """The 2-core measurements (SMALL_LINEAR's comment) keep their rule."""
    assert linear.use_packed(m, k, n, bias, threads) == (m * k * n >= linear.SMALL_LINEAR)


@needs_mkldnn
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 700), n=st.integers(1, 200),
       bias=st.booleans(), kn=st.booleans(), act=st.sampled_from([None, "gelu"]),
       nthreads=st.sampled_from([1, 2, 3, 4, 8]), seed=st.integers(0, 99))
def test_the_call_matches_f_linear_at_any_thread_count(m: int, k: int, n: int, bias: bool,
                                                       kn: bool, act: str | None, nthreads: int,
                                                       seed: int) -> None:
    """Three calls (the pack made, found, then the fast path's), each eager's F.linear (and
    GELU) within tolerance; the weight is packed exactly where `use_packed` says."""
    before = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(m, k, generator=g)
        w = torch.randn(n, k, generator=g) / math.sqrt(k)
        b = torch.randn(n, generator=g) if bias else None
        wk = torch.nn.Parameter(w.t().contiguous() if kn else w, requires_grad=False)
        call = linear.bind({**({"kn": True} if kn else {}), **({"bias": True} if bias else {}),
                            **({"act": act} if act else {})})
        want = F.linear(x, w, b)
        want = F.gelu(want) if act else want
        for _ in range(3):
            got = call(x, wk) if b is None else call(x, wk, b)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert packed.is_cached(wk) == linear.use_packed(m, k, n, bias, nthreads)
        packed._PACKS.pop(id(wk), None)
    finally:
        torch.set_num_threads(before)


class _Counted:
    """A counting stand-in for one of linear.py's module-level callables."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.fn(*args)


@needs_mkldnn
def test_the_fast_path_follows_updates_grad_mode_and_threads(
        monkeypatch: pytest.MonkeyPatch, threads: None) -> None:
    """Once the call remembers its pack it skips the pack cache, yet an in-place update, a
    `.data` reassignment, a non-contiguous x, grad mode and another thread count are each
    followed: every result is eager's."""
    torch.set_num_threads(1)
    lookups = _Counted(linear.cached_pack)
    onednn = _Counted(linear._LINEAR_FN)
    monkeypatch.setattr(linear, "cached_pack", lookups)
    monkeypatch.setattr(linear, "_LINEAR_FN", onednn)
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 128, generator=g) * 0.1, requires_grad=False)
    x, b = torch.randn(64, 128, generator=g), torch.randn(256, generator=g)  # 2M: oneDNN
    call = linear.bind({"bias": True})
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(call(x, w, b), F.linear(x, w, b))
        assert (lookups.calls, onednn.calls) == (2, 4)  # made, found, then remembered
        w.mul_(-0.5)  # an optimizer-like in-place step: repacked
        torch.testing.assert_close(call(x, w, b), F.linear(x, w, b))
        assert lookups.calls == 3
        w.data = torch.randn(256, 128, generator=g)  # a new storage, the same version
        for _ in range(2):
            torch.testing.assert_close(call(x, w, b), F.linear(x, w, b))
        assert lookups.calls == 5  # made, found: remembered again
        xt = torch.randn(128, 64, generator=g).t()  # not contiguous: addmm
        before = onednn.calls
        torch.testing.assert_close(call(xt, w, b), F.linear(xt, w, b))
        assert onednn.calls == before
        torch.set_num_threads(8)  # 2M at 8 threads: addmm, without the cache
        before = (lookups.calls, onednn.calls)
        for _ in range(2):
            torch.testing.assert_close(call(x, w, b), F.linear(x, w, b))
        assert (lookups.calls, onednn.calls) == before
        torch.set_num_threads(1)
    for _ in range(2):
        call(x, w, b)
    w.requires_grad_(True)  # grad mode on, the weight requires grad: autograd's product
    call(x, w, b).sum().backward()
    assert w.grad is not None
    torch.testing.assert_close(w.grad, x.sum(0).expand(256, 128))


@needs_mkldnn
def test_the_remembered_pack_dies_with_its_weight(threads: None) -> None:
    """The call holds its last pack only while the weight lives."""
    torch.set_num_threads(1)
    w = torch.nn.Parameter(torch.randn(256, 128), requires_grad=False)
    x = torch.randn(64, 128)
    call = linear.bind({})
    for _ in range(3):
        call(x, w)  # made, found: remembered
    pack = weakref.ref(packed.cached_pack(w, (linear.LINEAR_OP,), lambda: torch.empty(0)))
    assert pack() is not None
    del w
    gc.collect()
    assert pack() is None


class _SwitchingParam(torch.nn.Parameter):
    """A parameter whose next detach() first runs `during` once: what another Python thread
    may do there (torch's detach releases the GIL), made deterministic."""

    during: Any = None

    def detach(self) -> torch.Tensor:  # type: ignore[override]
        hook, type(self).during = type(self).during, None
        if hook is not None:
            hook()
        return super().detach()


@needs_mkldnn
def test_a_call_between_two_remembers_one_weight_with_its_own_pack(threads: None) -> None:
    """The bound call remembers its last weight and that weight's pack as one state: a call
    with another weight landing while it is being remembered (another thread, in w.detach())
    leaves either call's state, never one weight with the other's pack (wrong results)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    w1, w2 = (_SwitchingParam(torch.randn(256, 128, generator=g), requires_grad=False)
              for _ in range(2))
    x = torch.randn(64, 128, generator=g)  # 2M: oneDNN
    call = linear.bind({})
    with torch.no_grad():
        for w in (w2, w2, w1):  # both packs made (w1's made by this call: not remembered)
            call(x, w)
        _SwitchingParam.during = lambda: call(x, w2)  # lands while w1's pack is remembered
        torch.testing.assert_close(call(x, w1), F.linear(x, w1))
        assert _SwitchingParam.during is None
        for w in (w1, w1, w2, w1):  # the remembered state serves each weight its own pack
            torch.testing.assert_close(call(x, w), F.linear(x, w))
