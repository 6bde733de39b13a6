"""`.item()` results as unbacked symbols (issue 17 #2): a value read from a tensor that only
feeds shapes is a size symbol `u0` the graph binds at run time (`graph.bind_symbol`, ir-v1.2),
not a graph break. One capture serves every value (0 and the largest included), on the CPU
inductor (size-generic C++) and the reference interpreter; what capture assumed of the value is
asserted at run time (a broken assertion runs that call eagerly); a value that decides control
flow breaks the graph with the reason; dumps replay with `ember run` at any value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import ember.runtime as er
from ember.runtime import cli
from ember.runtime.compile import compiled_function_of


def prefix(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = int(mask.sum().item())
    return x[:n] * 2, x[n:].sum(0), x[n:] + 1


def new_sizes(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = t.item()
    y = x.new_zeros(n * 4) + x.sum()
    return torch.arange(n) * 2 + x.sum(), y.view(n, 4).cumsum(0), y.view(-1, 2).amax(-1)


def branch(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    if t.item() > 3:
        return x * 2
    return x - 1


def as_float(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return x * (t.item() / 2)


_COMPILED: dict[tuple[str, str], Any] = {}


def _compiled(fn: Callable[..., Any], backend: str) -> Any:
    """One compiled function per (case, backend) for all examples: one capture for them all."""
    key = (fn.__name__, backend)
    if key not in _COMPILED:
        _COMPILED[key] = er.compile(fn, backend=backend, dynamic=True)
    return _COMPILED[key]


def _check_one_graph(cf: Any) -> None:
    rep = er.explain(cf)
    assert rep.graph_count == 1, rep.recompilations
    assert rep.breaks == [] and rep.fallbacks == [], str(rep)
    assert "graph.bind_symbol" in rep.graphs[0].ir and "symbol u0" in rep.graphs[0].ir
    h = compiled_function_of(cf)
    assert h is not None and not [n for n in h.history.notes if "eager" in n], h.history.notes


@pytest.mark.parametrize("backend", ["inductor", "reference"])
@settings(max_examples=20, deadline=None)
@given(rows=st.integers(2, 12), data=st.data())
def test_a_slice_by_an_item_matches_eager_at_every_value(backend: str, rows: int,
                                                         data: st.DataObject) -> None:
    k = data.draw(st.integers(0, rows), label="true entries")  # 0 and all of them included
    x, mask = torch.randn(rows, 3), torch.randperm(rows) < k
    cf = _compiled(prefix, backend)
    torch.testing.assert_close(cf(x, mask), prefix(x, mask))
    _check_one_graph(cf)


@pytest.mark.parametrize("backend", ["inductor", "reference"])
@settings(max_examples=20, deadline=None)
@given(n=st.integers(0, 64))
def test_new_tensors_sized_by_an_item_match_eager(backend: str, n: int) -> None:
    x, t = torch.randn(3), torch.tensor(n)
    cf = _compiled(new_sizes, backend)
    torch.testing.assert_close(cf(x, t), new_sizes(x, t))
    _check_one_graph(cf)


def nonzero_rows(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    idx = torch.nonzero(x > 0)
    return idx * 2, x[idx[:, 0], idx[:, 1]] + 1


@pytest.mark.parametrize("backend", ["inductor", "reference"])
@settings(max_examples=15, deadline=None)
@given(rows=st.integers(2, 9), data=st.data())
def test_nonzero_rows_are_an_unbacked_symbol(backend: str, rows: int,
                                            data: st.DataObject) -> None:
    """torch.nonzero's row count is data: an unbacked symbol bound from `(x != 0).sum()`,
    one capture for every count, none and all included (the inductor keeps nonzero an extern
    call and compiles the rest)."""
    k = data.draw(st.integers(0, rows * 3), label="positive entries")
    x = -torch.rand(rows, 3)
    x.view(-1)[torch.randperm(rows * 3)[:k]] *= -1
    cf = _compiled(nonzero_rows, backend)
    torch.testing.assert_close(cf(x), nonzero_rows(x))
    _check_one_graph(cf)


def mask_index(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    m = x > 0
    return x[m] * 2, y[:, m[:, 0]].sum(0)


@pytest.mark.parametrize("backend", ["inductor", "reference"])
@settings(max_examples=15, deadline=None)
@given(rows=st.integers(2, 9), data=st.data())
def test_boolean_mask_indexing_is_nonzero_then_gather(backend: str, rows: int,
                                                      data: st.DataObject) -> None:
    """`x[mask]` is `x[nonzero(mask) columns]`: one capture for every count, none and all
    included."""
    k = data.draw(st.integers(0, rows * 3), label="positive entries")
    x = -torch.rand(rows, 3)
    x.view(-1)[torch.randperm(rows * 3)[:k]] *= -1
    y = torch.randn(4, rows)
    cf = _compiled(mask_index, backend)
    torch.testing.assert_close(cf(x, y), mask_index(x, y))
    _check_one_graph(cf)


def test_the_inductor_runs_it_as_size_generic_cpp() -> None:
    cf = er.compile(new_sizes, dynamic=True)
    for n in (0, 1, 7):
        cf(torch.randn(3), torch.tensor(n))
    h = compiled_function_of(cf)
    assert h is not None
    notes = [n for n in h.history.notes if "the inductor backend compiled it to" in n]
    assert notes and "C++ kernel" in notes[-1] and "interpreter" not in notes[-1], notes


def test_automatic_dynamic_captures_it_on_the_first_call() -> None:
    """dynamic=None: the value is a symbol from the first call (no input shape changed);
    a slice bounded by it asserts `u0 <= 10`, and a value above that runs eagerly (eager's
    clamped slice) without a new capture."""
    def f(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x[:t.item()] * 2

    cf = er.compile(f)
    for v in (2, 0, 10, 12, 5):
        x, t = torch.randn(10, 3), torch.tensor(v)
        torch.testing.assert_close(cf(x, t), f(x, t))
    rep = er.explain(cf)
    assert rep.graph_count == 1 and rep.breaks == [] and rep.fallbacks == [], str(rep)
    assert "le=[10]" in rep.graphs[0].ir
    h = compiled_function_of(cf)
    assert h is not None and [n for n in h.history.notes if "u0 = 12" in n and "eager" in n]


def test_a_value_eager_refuses_gives_eagers_error() -> None:
    def f(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(t.item()) + 1

    cf = er.compile(f, dynamic=True)
    cf(torch.randn(3), torch.tensor(2))
    with pytest.raises(RuntimeError, match="negative dimension"):
        cf(torch.randn(3), torch.tensor(-1))


@pytest.mark.parametrize("fn, why", [(branch, "a branch on u0 > 3"),
                                     (as_float, "a size used as a float")])
def test_a_value_deciding_control_flow_breaks_the_graph_with_the_reason(
        fn: Callable[..., Any], why: str) -> None:
    cf = er.compile(fn, backend="eager")
    for v in (1, 5):
        x, t = torch.randn(3), torch.tensor(v)
        torch.testing.assert_close(cf(x, t), fn(x, t))
    (brk, *_) = er.explain(cf).breaks
    assert ".item()" in brk.reason and why in brk.reason, brk.reason


def test_float_item_still_breaks() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item()

    cf = er.compile(f, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(cf(x), f(x))
    assert er.explain(cf).breaks


@pytest.mark.parametrize("backend", ["reference", "eager", "inductor"])
def test_the_dump_replays_with_ember_run_at_any_value(tmp_path: Path, backend: str,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    d = tmp_path / "d"
    cf = er.compile(prefix, dynamic=True, backend="eager", options={"dump_dir": str(d)})
    cf(torch.randn(6, 3), torch.arange(6) < 2)
    (ir,) = [p for p in d.glob("*.ir") if not p.name.endswith(".kernels.ir")]
    text = ir.read_text()
    assert text.startswith("ember.ir 1.2") and "graph.bind_symbol(" in text
    for rows, k in ((5, 0), (9, 4), (7, 7)):
        x, mask = torch.randn(rows, 3), torch.arange(rows) < k
        ins, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
        save_file({"l_x": x, "l_mask": mask}, str(ins))
        rc = cli.main(["run", str(ir), "--inputs", str(ins), "--backend", backend, "--out",
                       str(out)])
        capsys.readouterr()
        assert rc == 0
        got = load_file(str(out))
        for i, want in enumerate(prefix(x, mask)):
            torch.testing.assert_close(got[f"out{i}"], want)


def int_branch(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    n = int(t.item())  # int() keeps the symbol: the branch below is still seen
    return x * 2 if n > 3 else x - 1


def int_size_branch(x: torch.Tensor) -> torch.Tensor:
    n = int(x.shape[0])  # (a backed size: the branch is a guard)
    return x * 2 if n > 8 else x - 1


@pytest.mark.parametrize("fn, make", [
    (int_branch, lambda v: (torch.randn(3), torch.tensor(v))),
    (int_size_branch, lambda v: (torch.randn(v, 2),))])
def test_int_of_a_size_is_still_the_size(fn: Callable[..., Any],
                                         make: Callable[[int], tuple[Any, ...]]) -> None:
    cf = er.compile(fn, backend="eager", dynamic=True)
    for v in (5, 2, 12, 4):
        args = make(v)
        torch.testing.assert_close(cf(*args), fn(*args))


def test_a_graph_recording_gradients_keeps_the_break() -> None:
    """Training graphs are split into forward and backward, and only the forward would bind
    the symbol: with an input that requires grad the `.item()` stays a graph break, and the
    gradients are eager's."""
    def f(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (x[:int(mask.sum().item())] * 2).sum()

    cf = er.compile(f, backend="eager", dynamic=True)
    for rows, k in ((6, 2), (7, 0)):
        x, mask = torch.randn(rows, 3, requires_grad=True), torch.arange(rows) < k
        cf(x, mask).backward()
        x2 = x.detach().clone().requires_grad_()
        f(x2, mask).backward()
        torch.testing.assert_close(x.grad, x2.grad)
    assert "records gradients" in er.explain(cf).breaks[0].reason


@pytest.mark.parametrize("backend", ["reference", "inductor"])
def test_a_nonzero_dump_replays_with_ember_run(tmp_path: Path, backend: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "d"
    cf = er.compile(nonzero_rows, dynamic=True, backend="eager", options={"dump_dir": str(d)})
    cf(torch.randn(5, 3))
    (ir,) = [p for p in d.glob("*.ir") if not p.name.endswith(".kernels.ir")]
    for x in (-torch.rand(4, 3), torch.rand(6, 3), torch.randn(7, 3)):
        ins, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
        save_file({"l_x": x}, str(ins))
        rc = cli.main(["run", str(ir), "--inputs", str(ins), "--backend", backend, "--out",
                       str(out)])
        capsys.readouterr()
        assert rc == 0
        got = load_file(str(out))
        for i, want in enumerate(nonzero_rows(x)):
            torch.testing.assert_close(got[f"out{i}"], want)
