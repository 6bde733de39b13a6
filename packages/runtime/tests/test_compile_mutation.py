"""Functionalization corpus: programs that write inputs, views of inputs, buffers and
intermediates, compiled with backend="eager" and compared with eager on outputs, every argument
afterwards, module state and aliasing (`out._base`, `is`, data_ptr). Each must capture one
graph with no fallback; a representative subset also runs through "prims" and "inductor"."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import ember.runtime as er
from ember.ir import parse
from ember.runtime import cli
from ember.runtime.compile import compiled_function_of
from ember.runtime.testing import check_against_eager

CASES: list[tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]], dict[str, Any]]] = []


def case(*make: Callable[[], Any], **kw: Any) -> Callable[[Callable[..., Any]], Any]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        CASES.append((fn.__name__, fn, lambda: tuple(m() for m in make), kw))
        return fn
    return deco


def t(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape)


@case(t(3, 4))
def add_input(x):
    x.add_(1)
    return x


@case(t(3, 4))
def mul_row(x):
    x[0].mul_(2)
    return x.sum()


@case(t(4, 4), t(4, 4))
def transposed_add(x, y):
    x.t().add_(y)
    return x * 2


@case(t(4, 4))
def view_assign_then_read(x):
    v = x.view(2, -1)
    v[1] = 0
    return x + 1


@case(t(4, 5), lambda: torch.rand(4, 5) > 0.5)
def mask_assign(x, m):
    x[m] = 0
    return x.sum()


@case(t(6, 3), t(2, 3))
def slice_copy(x, y):
    x[1:3].copy_(y)
    x[::2, 1] += 1
    return x.mean()


@case(t(4, 4))
def diagonal_fill(x):
    x.diagonal().fill_(0)
    return x


@case(t(2, 3, 4))
def permute_mul(x):
    x.permute(2, 0, 1).mul_(3)
    return x.sum(0)


@case(t(6))
def unsqueeze_squeeze(x):
    x.unsqueeze(0)[0, 1:].zero_()
    x.view(2, 3).squeeze().clamp_(max=0.5)
    return x


@case(t(4, 6))
def unbind_split_chunk(x):
    a, b, c, d = x.unbind(0)
    a.add_(1)
    p, q = x.split(3, dim=1)
    q.mul_(-1)
    r, s = x.chunk(2)
    s.sub_(b)  # b was made before the writes: it sees them
    return x, b.clone()


@case(t(4, 4))
def unbind_of_size_one_returned(x):
    # one result: still a select of the view, not the operator (which returns a list)
    (v,) = x.unsqueeze(0).unbind(0)
    (w,) = x.split(4, dim=1)
    return v, w


@case(t(4, 4))
def other_views_see_writes(x):
    row = x[1]
    col = x[:, 2]
    whole = x.view(-1)
    row.fill_(7)  # col, whole see it
    return col * 1, whole.sum(), row + col[1]


@case(t(3, 4))
def intermediate_with_views(x):
    y = x * 2
    v = y[0]
    y.add_(1)  # v sees it
    v.mul_(10)  # y sees it
    return y, v + 0


@case(t(3, 4))
def as_strided_write(x):
    x.as_strided((2, 2), (4, 1), 1).add_(100)
    return x


@case(t(8))
def as_strided_intermediate(x):
    y = x.clone()
    y.as_strided((3,), (2,)).mul_(-1)
    return y


@case(t(3, 4), t(3, 4))
def out_variant(x, y):
    z = torch.empty(3, 4)
    torch.add(x, y, out=z)
    torch.mul(x, 2, out=y)
    return z


@case(t(4), t(4))
def optimizer_step(p, g):
    with torch.no_grad():
        p.add_(g, alpha=-0.1)
        p.mul_(0.99)


@case(lambda: [nn.Parameter(torch.randn(3, 2)), nn.Parameter(torch.randn(2))],
      lambda: [torch.randn(3, 2), torch.randn(2)])
def sgd_parameters(params, grads):
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.mul_(0.9).add_(g, alpha=-0.1)
        return params[0] * 1


@case(t(5), lambda: torch.tensor(2.0))
def returns_input_and_view(x, s):
    x.mul_(s)
    return x, x[1:], x.view(5, 1)


@case(t(3, 4))
def returns_views_only(x):
    return x.view(-1), x[0], x.t(), x.detach()


@case(t(3, 4))
def views_of_intermediate_returned(x):
    y = x + 1
    return y, y[0], y.t()


@case(t(3, 4))
def transposed_output(x):
    return (x * 2).t(), x.t() + 1


@case(t(4, 4), t(4))
def chain_of_views(x, y):
    x[1:][:, 2:][0].add_(y[:2])
    x.t()[0][1:3].mul_(2)
    return x


@case(t(2, 4), t(2, 4))
def f16_cast_inplace(x, y):
    z = x.half()
    z.add_(y)  # a float32 operand: the result is cast back to half
    return z


def _bn_model() -> nn.Module:
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.BatchNorm2d(4, momentum=0.3))
    return m.train()


CASES.append(("batchnorm_train", _bn_model(), lambda: (torch.randn(2, 3, 6, 6),), {"calls": 2}))
CASES.append(("batchnorm1d_train", nn.BatchNorm1d(5).train(), lambda: (torch.randn(8, 5),), {}))


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.count.add_(1)
        self.steps += 1  # in place, then STORE_ATTR of the same tensor: no side effect to replay
        with torch.no_grad():
            self.ema.mul_(0.9).add_(x.mean(0) * 0.1)
        return self.lin(x) + self.ema


CASES.append(("module_buffers", Counter(), lambda: (torch.randn(3, 4),), {"calls": 2}))


@pytest.mark.parametrize("name, fn, make, kw", CASES, ids=[c[0] for c in CASES])
def test_mutation_matches_eager(name: str, fn: Any, make: Callable[[], tuple[Any, ...]],
                                kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    h = check_against_eager(fn, *make(), **kw)
    assert len(h.graphs) == 1


def _graph_text(compiled: Any) -> str:
    c = compiled_function_of(compiled)
    assert c is not None and c.history.graphs, c.history.fallbacks if c else None
    return c.history.graphs[0].ir


def test_writes_become_input_updates() -> None:
    c = er.compile(mul_row, backend="eager")
    x = torch.randn(3, 4)
    ptr, obj = x.data_ptr(), x
    expect = x.clone()
    expect[0] *= 2
    c(x)
    assert x is obj and x.data_ptr() == ptr
    torch.testing.assert_close(x, expect)
    g = parse(_graph_text(c)).graph()
    assert g.input_updates == [(0, len(g.outputs) - 1)]
    assert any(n.op == "aten.select_scatter.default" for n in g.nodes)


def test_aliasing_relations_match_eager() -> None:
    x = torch.randn(5)
    s = torch.tensor(2.0)
    c = er.compile(returns_input_and_view, backend="eager")
    a, b, v = c(x, s)
    assert a is x and b._base is x and v._base is x
    assert b.data_ptr() == x.data_ptr() + 4 and v.data_ptr() == x.data_ptr()
    x2 = torch.randn(3, 4)
    c2 = er.compile(returns_views_only, backend="eager")
    outs = c2(x2)
    eager = returns_views_only(x2)
    for o, e in zip(outs, eager, strict=True):
        assert (o._base is x2) == (e._base is x2)  # detach() has no _base, in eager too
        assert o.stride() == e.stride() and o.data_ptr() == e.data_ptr()
    c3 = er.compile(views_of_intermediate_returned, backend="eager")
    y, y0, yt = c3(torch.randn(3, 4))
    assert y0._base is y and yt._base is y and yt.stride() == (1, 4)


def test_cache_hit_writes_again() -> None:
    c = er.compile(add_input, backend="eager")
    x = torch.zeros(2)
    for _ in range(3):
        assert c(x) is x
    torch.testing.assert_close(x, torch.full((2,), 3.0))
    cf = compiled_function_of(c)
    assert cf is not None and cf.history.cache_hits == 2


def test_aliased_inputs_are_not_reused_silently() -> None:
    def f(a, b):
        a.add_(1)
        return b * 2

    c = er.compile(f, backend="eager")
    x, y = torch.zeros(4), torch.zeros(4)
    c(x, y)
    base = torch.zeros(8)
    e = base.clone()
    out = c(base[:4], base[2:6])  # b overlaps a: eager reads the updated values
    exp = f(e[:4], e[2:6])
    torch.testing.assert_close(out, exp)
    torch.testing.assert_close(base, e)
    x = torch.zeros(4)
    out = c(x, x)  # the same tensor twice
    torch.testing.assert_close(out, torch.full((4,), 2.0))


def test_batchnorm_train_graph_is_functional() -> None:
    m = nn.BatchNorm2d(3).train()
    c = er.compile(m, backend="eager")
    c(torch.randn(2, 3, 4, 4))
    text = _graph_text(c)
    assert "_native_batch_norm_legit_functional" in text and "input_updates" in text
    g = parse(text).graph()
    names = {g.params[p].name for p, _ in g.input_updates}
    assert names == {"l_self_running_mean", "l_self_running_var",
                     "l_self_num_batches_tracked"}


def test_grad_through_inplace_on_intermediates() -> None:
    def f(x, w):
        y = x @ w
        y[:, 0].mul_(3)
        y.relu_()
        return y.sum()

    check_against_eager(f, torch.randn(3, 4), torch.randn(4, 5, requires_grad=True), grad=True)


def test_nonleaf_input_written_with_grad() -> None:
    def f(x, y):
        x.mul_(y)
        return x.sum()

    w = torch.randn(4, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    y = torch.randn(4)
    c = er.compile(f, backend="eager")
    xc, xe = w * 1, we * 1
    c(xc, y).backward()
    f(xe, y).backward()
    assert xc.requires_grad and xc.grad_fn is not None
    torch.testing.assert_close(w.grad, we.grad)


SUBSET = ["add_input", "mul_row", "transposed_add", "view_assign_then_read", "unbind_split_chunk",
          "as_strided_write", "mask_assign", "slice_copy", "module_buffers",
          "returns_input_and_view", "transposed_output", "out_variant", "batchnorm1d_train"]


@pytest.mark.parametrize("backend", ["prims", "inductor"])
def test_other_backends_write_back(backend: str) -> None:
    torch.manual_seed(0)
    for name, fn, make, kw in CASES:
        if name not in SUBSET or (backend == "inductor" and name not in (
                "mul_row", "returns_input_and_view", "transposed_output", "batchnorm1d_train")):
            continue
        check_against_eager(fn, *make(), backend=backend, **kw)


def test_transposed_output_strides_on_inductor() -> None:
    c = er.compile(transposed_output, backend="inductor")
    x = torch.randn(3, 4)
    a, b = c(x.clone())
    ea, eb = transposed_output(x)
    assert a.stride() == ea.stride() and b.stride() == eb.stride()
    assert a._base is not None  # a view of the (hidden) result, as in eager



def test_inductor_batchnorm_train_without_grad() -> None:
    """Running statistics updated by compiled C++ kernels (no_grad: an inference graph)."""
    m = nn.BatchNorm2d(3).train()
    ref = copy.deepcopy(m)
    c = er.compile(m)
    x = torch.randn(4, 3, 5, 5)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(c(x), ref(x))
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(m.state_dict()[k], v, msg=k)
    notes = " ".join(c.compiled.history.notes)
    assert "compiled it to" in notes, notes


@pytest.mark.parametrize("backend", ["reference", "prims", "inductor"])
def test_dumped_graph_replays_updates_from_the_shell(
        backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    m = Counter()
    c = er.compile(m, backend="eager")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    c(torch.randn(3, 4))
    (ir,) = tmp_path.glob("*.ir")
    stem = str(ir)[:-3]
    out = tmp_path / "replay.safetensors"
    rc = cli.main(["run", str(ir), "--inputs", stem + ".inputs.safetensors", "--out", str(out),
                   "--backend", backend])
    capsys.readouterr()
    assert rc == 0
    live, replay = load_file(stem + ".outputs.safetensors"), load_file(str(out))
    assert set(live) == set(replay) == {"out0", "l_self_count", "l_self_steps", "l_self_ema"}
    for k in live:
        torch.testing.assert_close(replay[k], live[k], msg=k)
    torch.testing.assert_close(replay["l_self_count"], before["count"] + 1)
    torch.testing.assert_close(replay["l_self_ema"], m.ema)


def test_inductor_dump_replays_the_compiled_kernels_bitwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """EMBER_DUMP with the inductor backend also writes NAME.kernels.ir (the compiled kernels.*
    module, C++ in kernel blocks); `ember run --allow-kernels` replays it with the dumped inputs
    and gives the live call's outputs and updates bitwise."""
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    m = Counter()
    c = er.compile(m)
    with torch.no_grad():
        c(torch.randn(3, 4))
    (compiled,) = tmp_path.glob("*.kernels.ir")
    text = compiled.read_text()
    assert "kernels.call" in text and "kernel @" in text, text[:400]
    stem = str(compiled).removesuffix(".kernels.ir")
    out = tmp_path / "replay.safetensors"
    rc = cli.main(["run", str(compiled), "--inputs", stem + ".inputs.safetensors", "--out",
                   str(out), "--allow-kernels"])
    capsys.readouterr()
    assert rc == 0
    live, replay = load_file(stem + ".outputs.safetensors"), load_file(str(out))
    assert set(live) == set(replay)
    for k in live:
        assert torch.equal(replay[k], live[k]), k


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_as_strided_of_a_view_reads_from_the_views_storage_offset(backend: str) -> None:
    # as_strided without storage_offset starts at its argument's offset (x[1] starts at 4),
    # though capture records it on the storage's root: the node and the returned view say so
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = x[1].as_strided((2, 2), (1, 2))
        return v, v * 2

    c = er.compile(f, backend=backend)
    x = torch.randn(3, 4)
    got, want = c(x), f(x)
    torch.testing.assert_close(got, want)
    assert got[0].storage_offset() == want[0].storage_offset() == 4
