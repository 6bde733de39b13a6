"""Kernel calls that read only graph inputs (BatchNorm's folded scale and shift) are computed once
and reused while their inputs are unchanged (inductor/paramcache.py): results equal eager after
every kind of in-place update, a result that is also a graph output is never kept, and
concurrent calls stay correct."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the CPU target)
import ember.inductor.backend as backend
from ember.inductor import paramcache
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.wrapper import generate
from ember.ir import parse
from ember.runtime.compile import compile as ember_compile


class Net(torch.nn.Module):
    """conv -> BN2d -> ReLU -> linear -> BN1d: both BatchNorms' scale and shift are kernels
    on parameters and buffers alone."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 36, 16)
        self.bn1 = torch.nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x))).flatten(1)
        out: torch.Tensor = self.bn1(self.fc(y))
        return out


def _net() -> Net:
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        for bn in (net.bn, net.bn1):
            assert bn.running_var is not None and bn.running_mean is not None
            bn.running_var.uniform_(0.5, 2)
            bn.running_mean.uniform_(-1, 1)
    return net


def _compiled(net: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    sources: list[str] = []
    orig = backend.generate

    def gen(module: Any, graph: Any = None, interp: Any = None) -> Any:
        w = orig(module, graph, interp)
        sources.append(w.source)
        return w
    monkeypatch.setattr(backend, "generate", gen)
    return ember_compile(net), sources


def _bn_bufs(bn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    var, mean = bn.running_var, bn.running_mean
    assert isinstance(var, torch.Tensor) and isinstance(mean, torch.Tensor)
    return var, mean


def _update(net: Net, how: str) -> None:
    var, mean = _bn_bufs(net.bn)
    with torch.no_grad():
        if how == "running_var.add_":
            var.add_(1)
        elif how == "running_mean[0] =":
            mean[0] = 3.0
        elif how == "weight.copy_":
            net.bn1.weight.copy_(torch.randn(16))
        elif how == "bias.mul_":
            net.bn.bias.mul_(-2)
        elif how == "load_state_dict":
            sd = {k: v * 1.5 if v.is_floating_point() else v
                  for k, v in net.state_dict().items()}
            net.load_state_dict(sd)
        elif how == "data =":  # the same tensor on new storage, its version counter kept
            net.bn.weight.data = net.bn.weight.data * 2
            net.bn.weight.data = net.bn.weight.data * 1.5
        else:
            raise AssertionError(how)


UPDATES = ["running_var.add_", "running_mean[0] =", "weight.copy_", "bias.mul_",
           "load_state_dict", "data ="]


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(UPDATES), min_size=1, max_size=4))
def test_results_follow_in_place_updates_of_parameters_and_buffers(hows: list[str]) -> None:
    net = _net()
    f = ember_compile(net)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        torch.testing.assert_close(f(x), net(x))
        for how in hows:
            _update(net, how)
            torch.testing.assert_close(f(x), net(x))
            torch.testing.assert_close(f(x), net(x))


def test_the_scale_and_shift_kernels_are_cached_and_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The BN kernels are wrapped; a write to a Parameter the version counter does not see
    (through `.data`, outside the contract) shows that the second call reused the first call's
    scale."""
    net = _net()
    f, sources = _compiled(net, monkeypatch)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        want = net(x)
        torch.testing.assert_close(f(x), want)
        assert sources and "_store(" in sources[0]
        net.bn.weight.data.add_(5)  # (a Parameter's new version counter: invisible)
        torch.testing.assert_close(f(x), want)  # the kept scale: the old weight
        net.bn.weight.add_(0)  # a tracked write: recomputed
        torch.testing.assert_close(f(x), net(x))


@pytest.mark.parametrize("how", ["eager train forward", "buffer .data write"])
def test_buffers_are_compared_by_value(how: str) -> None:
    """torch's batch norm in training mode updates running_mean/var without bumping their
    version counters (an eager train-mode forward: swa_utils.update_bn, BN recalibration): a
    kept scale over a buffer must still follow its values (failed before the comparison)."""
    net = _net()
    f = ember_compile(net)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        var, _ = _bn_bufs(net.bn)
        v = var._version
        if how == "eager train forward":
            net.train()
            net(x * 3 + 1)
            net.eval()
            assert var._version == v  # (what makes the version key blind to it)
        else:
            var.data.add_(5)
        torch.testing.assert_close(f(x), net(x))
        torch.testing.assert_close(f(x), net(x))


def test_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paramcache.ENV, "0")
    net = _net()
    f, sources = _compiled(net, monkeypatch)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
    assert sources and "_store(" not in sources[0]


# the scale s (inputs alone) feeds a matrix product (an extern): a kernel of its own
OUTPUT = """ember.ir 1.0

graph @f(%x: f32[4, 8], %v: f32[8, 8], %g: f32[8, 8]) -> (f32[4, 8]{outs}) {{
  %e = aten.add.Tensor(%v, 1e-05) : f32[8, 8]
  %r = aten.rsqrt.default(%e) : f32[8, 8]
  %s = aten.mul.Tensor(%r, %g) : f32[8, 8]
  %y = aten.mm.default(%x, %s) : f32[4, 8]
  %z = aten.sin.default(%y) : f32[4, 8]
  return (%z{ret})
}}
"""


def _want(x: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.sin(x @ (torch.rsqrt(v + 1e-5) * g))


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=g), torch.rand(8, 8, generator=g) + 0.5, \
        torch.randn(8, 8, generator=g)


@pytest.mark.parametrize("as_output", [False, True])
def test_a_result_that_is_a_graph_output_is_not_kept(as_output: bool) -> None:
    """The scale kernel reads inputs alone; returned to the caller, who may write it, it is
    computed on every call (the caller's write below would otherwise come back)."""
    text = OUTPUT.format(outs=", f32[8, 8]" if as_output else "",
                         ret=", %s" if as_output else "")
    compiled = compile_module(parse(text))
    assert ("_store(" in generate(compiled).source) is not as_output
    run = compiled_runner(compiled)
    x, v, w = _inputs(0)
    s = torch.rsqrt(v + 1e-5) * w
    for _ in range(3):
        out = run(None, [x, v, w]).outputs
        torch.testing.assert_close(out[0], _want(x, v, w))
        if as_output:
            torch.testing.assert_close(out[1], s)
            out[1].add_(100)  # the caller owns its outputs
    v.mul_(2)  # a plain input updated in place: recomputed
    torch.testing.assert_close(run(None, [x, v, w]).outputs[0], _want(x, v, w))
    v2 = v.clone()  # another tensor, equal values
    torch.testing.assert_close(run(None, [x, v2, w]).outputs[0], _want(x, v, w))


def test_new_input_tensors_each_call_stop_being_kept() -> None:
    """A kernel on a graph input that is a new tensor every call (a user's input) misses every
    time: after paramcache.MISSES its entry holds nothing and stores no more."""
    compiled = compile_module(parse(OUTPUT.format(outs="", ret="")))
    w = generate(compiled)
    run = w.call
    slots = [v for v in w.call.__globals__.values()
             if isinstance(v, list) and len(v) == 1 and isinstance(v[0], tuple)
             and len(v[0]) == len(paramcache.empty(0))]
    assert len(slots) == 1
    for k in range(paramcache.MISSES + 2):
        x, v, g = _inputs(k)
        torch.testing.assert_close(run([x, v, g]).outputs[0], _want(x, v, g))
    assert slots[0][0][0] is None and slots[0][0][2] == () and slots[0][0][4] == ()


def test_concurrent_calls_with_updates_stay_correct() -> None:
    """Two threads call one compiled graph on their own inputs, updating them between calls:
    each result matches eager on that thread's values (an entry is replaced whole)."""
    compiled = compile_module(parse(OUTPUT.format(outs="", ret="")))
    run = compiled_runner(compiled)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            x, v, w = _inputs(seed)
            for k in range(200):
                if k % 7 == 0:
                    v.add_(0.25)
                torch.testing.assert_close(run(None, [x, v, w]).outputs[0], _want(x, v, w))
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_inference_mode_tensors_are_not_kept() -> None:
    """Inference-mode tensors have no version counter: computed on every call, never kept
    (a model built and updated under inference_mode still matches eager)."""
    compiled = compile_module(parse(OUTPUT.format(outs="", ret="")))
    run = compiled_runner(compiled)
    x, v, w = _inputs(0)
    with torch.inference_mode():
        v, w = v.clone(), w.clone()
        for _ in range(3):
            torch.testing.assert_close(run(None, [x, v, w]).outputs[0], _want(x, v, w))
            v.add_(1)
    torch.testing.assert_close(run(None, [x, v, w]).outputs[0], _want(x, v, w))


class Scaled(torch.nn.Module):
    """A weight computed from parameters alone (gain * tanh(v)), then a linear: in training
    the computed weight is saved for the backward (an output of the forward graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.v = torch.nn.Parameter(torch.randn(8, 8))
        self.gain = torch.nn.Parameter(torch.rand(8, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x @ (self.gain * torch.tanh(self.v)))


def test_training_steps_match_eager() -> None:
    """Forward, backward and an SGD step, repeated: the parameters change every step, the
    compiled losses and gradients follow eager's."""
    torch.manual_seed(0)
    net = Scaled()
    ref = Scaled()
    ref.load_state_dict(net.state_dict())
    f = ember_compile(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for _ in range(4):
        for o, fn in ((opt, f), (ref_opt, ref)):
            o.zero_grad()
            fn(x).square().sum().backward()
            o.step()
        for p, q in zip(net.parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad)
            torch.testing.assert_close(p, q)
    with torch.no_grad():  # then inference: the kept weight follows the trained parameters
        torch.testing.assert_close(f(x), ref(x))
        net.v.mul_(0.5)
        ref.v.mul_(0.5)
        torch.testing.assert_close(f(x), ref(x))


def test_a_large_caller_input_is_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel turning the caller's image channels-last reads a graph input alone: kept, a
    benchmark passing the same tensor each call would skip it, and every call would compare
    the whole image. Inputs over COMPARED_BYTES that are not Parameters are never kept; the
    BatchNorm scale and shift still are."""
    from ember.inductor import paramcache
    seen: list[tuple[tuple[torch.Tensor, ...], Any]] = []
    orig = paramcache.store

    def store(old: Any, k: Any, ins: tuple[torch.Tensor, ...], outs: Any) -> Any:
        e = orig(old, k, ins, outs)
        seen.append((ins, e))
        return e
    monkeypatch.setattr(paramcache, "store", store)
    net = _net()
    f = ember_compile(net)
    x = torch.randn(200, 3, 6, 6)  # 86 KB
    assert x.numel() * 4 > paramcache.COMPARED_BYTES
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), net(x))
    with_x = [e for ins, e in seen if any(i is x for i in ins)]
    others = [e for ins, e in seen if not any(i is x for i in ins)]
    assert others and all(e[2] for e in others)  # the BN kernels: kept
    assert all(e[2] == () for e in with_x)  # the image's kernel: never


# the scale s (inputs alone) is computed after a matrix product: its hit test moves up
AFTER_EXTERN = """ember.ir 1.0

graph @f(%x: f32[4, 8], %v: f32[8, 8], %g: f32[8, 8]) -> (f32[4, 8]) {
  %y = aten.mm.default(%x, %g) : f32[4, 8]
  %e = aten.add.Tensor(%v, 1e-05) : f32[8, 8]
  %r = aten.rsqrt.default(%e) : f32[8, 8]
  %s = aten.mul.Tensor(%r, %g) : f32[8, 8]
  %z = aten.mm.default(%y, %s) : f32[4, 8]
  return (%z)
}
"""


def test_hit_tests_run_before_the_first_node() -> None:
    """A kept call's hit test (its inputs' identities, versions and values) runs with the
    other tests before the first node's lines, not between an extern and the next kernel,
    where it read cold objects and buffers (levit_128s: ~1 ms of a 35 ms call at 1 thread);
    the kernel still runs at its place on a miss. Results follow updates by version and by
    value (a buffer written through `.data`)."""
    compiled = compile_module(parse(AFTER_EXTERN))
    lines = generate(compiled).source.splitlines()
    tests = [k for k, s in enumerate(lines) if "_same(" in s]
    nodes = [k for k, s in enumerate(lines) if "_bad('result of kernels.extern'" in s]
    assert len(tests) == 1 and len(nodes) == 2 and tests[-1] < nodes[0]
    run = compiled_runner(compiled)
    x, v, g = _inputs(0)

    def want() -> torch.Tensor:
        return (x @ g) @ (torch.rsqrt(v + 1e-5) * g)
    for k in range(6):
        torch.testing.assert_close(run(None, [x, v, g]).outputs[0], want())
        if k == 1:
            v.add_(1)  # (a version bump)
        elif k == 3:
            v.data.mul_(2)  # (no version bump: the value comparison)


class Counting(torch.nn.Module):
    """A buffer read by a kernel on inputs alone, then updated in place in the forward and
    read again: the early hit test sees the buffer as the call got it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("s", torch.rand(8) + 0.5)
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x @ (torch.rsqrt(self.s) * self.w)
        self.s.add_(1)
        return a @ (torch.rsqrt(self.s) * self.w)


def test_a_buffer_updated_in_the_forward_matches_eager() -> None:
    torch.manual_seed(0)
    net, ref = Counting(), Counting()
    ref.load_state_dict(net.state_dict())
    f = ember_compile(net)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(f(x), ref(x))
            torch.testing.assert_close(net.s, ref.s)
