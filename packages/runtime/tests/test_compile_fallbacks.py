"""Constructs capture does not cover: a graph break (or, where the frame cannot be split, the
whole frame runs eagerly) with the same results, printed output and state as eager; the reason
and the user's source line are recorded, and fullgraph=True turns them into an error naming
both."""

from __future__ import annotations

import inspect
import linecache
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ember.runtime as er
from ember.runtime.testing import check_against_eager


def line_of(fn: Callable[..., Any], marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return start + i
    raise AssertionError(f"no {marker!r} in {fn.__name__}")


def prints(x):
    y = x * 2
    print("y has shape", tuple(y.shape))  # HERE
    return y + 1


def item(x):
    s = x.sum().item()  # HERE
    return x * s


def data_branch(x):
    if x.sum() > 0:  # HERE
        return x * 2
    return x - 2


def append_to_argument(x, out):
    out.append(x * 2)  # HERE
    return x


COUNTER = 0


def writes_global(x):
    global COUNTER
    COUNTER = x.shape[0]  # HERE
    return x * COUNTER


def boolean_mask(x):
    # (x[x > 0] is a graph now: its length is an unbacked symbol, test_dynamic_unbacked.py)
    return x.masked_select(x > 0)  # HERE


def inner_helper(x):
    return x.tolist()  # HERE


def nested_call(x):
    y = x + 1
    return inner_helper(y)


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # HERE
        return self.lin(x)


def raises(x):
    if x.shape[0] == 3:
        raise ValueError("three rows")  # HERE
    return x


# Each of these is a graph break now (capture part 3): the graph so far, the construct in
# plain Python, a resume function captured in turn (tests: test_graph_breaks.py).
BREAKS = [
    (prints, lambda: (torch.randn(2, 2),), "print()"),
    (item, lambda: (torch.randn(3),), "needs a tensor's data"),
    (data_branch, lambda: (torch.randn(3),), "branch on a tensor's value"),
    (boolean_mask, lambda: (torch.randn(5),), "DynamicOutputShapeException"),
    (nested_call, lambda: (torch.randn(3),), "tolist"),
]
# ... and these are Python side effects, replayed after one graph (test_side_effects.py).
SIDE_EFFECTS = [
    (append_to_argument, lambda: (torch.randn(3), [])),
    (writes_global, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make,reason", BREAKS, ids=[f[0].__name__ for f in BREAKS])
def test_break_matches_eager_and_is_explained(fn: Callable[..., Any], make: Any, reason: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    args = make()
    h = check_against_eager(fn, *args, expect_graphs=None, calls=2)
    printed = capsys.readouterr().out
    if fn is prints:  # eager printed twice, the compiled function twice (once per call)
        assert printed.count("y has shape (2, 2)") == 4
    assert not h.fallbacks
    target = inner_helper if fn is nested_call else fn
    b = h.breaks[0]
    assert reason in b.reason
    assert b.line == line_of(target, "# HERE"), b
    assert b.file == inspect.getsourcefile(target)


@pytest.mark.parametrize("fn,make", SIDE_EFFECTS, ids=[f[0].__name__ for f in SIDE_EFFECTS])
def test_side_effect_is_replayed_in_one_graph(fn: Callable[..., Any], make: Any) -> None:
    global COUNTER
    COUNTER = 0
    h = check_against_eager(fn, *make(), calls=2)
    assert not h.breaks and not h.fallbacks


def test_break_inside_inlined_call_reports_the_stack() -> None:
    h = check_against_eager(nested_call, torch.randn(3), expect_graphs=None)
    stack = h.breaks[0].stack
    assert len(stack) == 2 and "nested_call" in stack[0] and "inner_helper" in stack[1]


def test_module_state_side_effect_is_replayed() -> None:
    m = Counting()
    h = check_against_eager(m, torch.randn(2, 3), calls=3, expect_graphs=None)
    assert not h.fallbacks and not h.breaks
    # the counter is a Python int, read as a constant: each new value recompiles
    assert len(h.graphs) == 3 and "self.calls" in h.recompilations[0]
    c = er.compile(Counting(), backend="eager")
    for _ in range(3):
        c(torch.randn(2, 3))
    assert c.calls == 3  # replayed once per call, on the module itself


def test_user_exception_propagates_as_in_eager() -> None:
    c = er.compile(raises, backend="eager")
    with pytest.raises(ValueError, match="three rows"):
        c(torch.randn(3))
    assert c(torch.randn(2)).shape == (2,)
    h = c.history
    assert "raises ValueError" in h.fallbacks[0].reason
    assert h.fallbacks[0].line == line_of(raises, "# HERE")
    assert len(h.graphs) == 1  # the 2-row call captured a graph


def test_submodule_hooks_break_the_graph() -> None:
    # the compiled module's own hooks run around its compiled forward (test_distributed.py);
    # a submodule's are not inlined by capture: a graph break there, with its reason
    m = nn.Linear(3, 3)
    seen = []
    m.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    model = nn.Sequential(nn.ReLU(), m)
    x = torch.randn(2, 3)
    want = model(x)
    c = er.compile(model)
    torch.testing.assert_close(c(x), want)
    assert seen == [(2, 3), (2, 3)]  # eager's, and the compiled copy's (run eagerly)
    h = er.explain(c)
    assert any("hooks on module Linear" in b.reason for b in h.breaks), str(h)


def test_break_in_torch_code_reports_torchs_own_line() -> None:
    # AdaptiveLogSoftmaxWithLoss.forward (torch's code, no user frame around it) picks each
    # cluster's rows with nonzero(), whose size depends on the data: a genuine break
    m = nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4]).eval()
    h = check_against_eager(m, torch.randn(6, 8), torch.randint(0, 10, (6,)),
                            expect_graphs=None)
    where = (h.breaks or h.fallbacks)[0]
    assert where.file == inspect.getsourcefile(nn.AdaptiveLogSoftmaxWithLoss)
    assert "nonzero" in linecache.getline(where.file, where.line), where


@pytest.mark.parametrize("fn,make,reason", BREAKS[:3], ids=[f[0].__name__ for f in BREAKS[:3]])
def test_fullgraph_raises_naming_construct_and_line(fn: Callable[..., Any], make: Any,
                                                    reason: str) -> None:
    c = er.compile(fn, backend="eager", fullgraph=True)
    with pytest.raises(er.CaptureError) as info:
        c(*make())
    msg = str(info.value)
    assert reason in msg
    assert f":{line_of(fn, '# HERE')}" in msg
    assert info.value.unhandled.line == line_of(fn, "# HERE")


def test_fullgraph_passes_when_everything_is_captured() -> None:
    def f(x):
        return torch.relu(x) * 2

    c = er.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(c(x), f(x))
    assert len(c.history.graphs) == 1 and not c.history.fallbacks
