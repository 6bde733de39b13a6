"""Python side effects during capture (capture part 3): writes to lists, dicts, attributes,
module attributes and globals are tracked, not performed, while the function is captured;
later reads see the written values; after the graph runs they are applied once, in order, and
interleaved correctly with prints and graph breaks. Compared with eager on outputs, state and
printed output."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import ember.runtime as er
from ember.capture import Captured, capture
from ember.runtime.compile import compiled_function_of
from ember.runtime.history import History


def history(c: Any) -> History:
    cf = compiled_function_of(c)
    assert cf is not None
    return cf.history


def append_and_read(x, out):
    out.append(x * 2)
    out.append(len(out))  # a read after the write sees it
    return x + out[-2]


def dict_updates(x, d):
    d["double"] = x * 2
    d.update(n=len(d))
    d.pop("drop")
    return d["double"] + 1


class Obj:
    def __init__(self) -> None:
        self.count = 0
        self.last: Any = None


def attribute_writes(x, o):
    o.count += 1
    o.count += 1  # reads its own write
    o.last = x.relu()
    return x * o.count


TOTAL = 0


def global_write(x):
    global TOTAL
    TOTAL = TOTAL + 1
    TOTAL = TOTAL * 10  # reads its own write
    return x + TOTAL


@pytest.mark.parametrize("fn,make", [
    (append_and_read, lambda: (torch.randn(3), [torch.ones(1)])),
    (dict_updates, lambda: (torch.randn(3), {"drop": 1, "keep": 3})),
    (attribute_writes, lambda: (torch.randn(3), Obj())),
])
def test_writes_to_arguments_match_eager(fn: Any, make: Any) -> None:
    c = er.compile(fn, backend="eager")
    for _ in range(2):
        args = make()
        e_args, c_args = copy.deepcopy(args), copy.deepcopy(args)
        torch.testing.assert_close(c(*c_args), fn(*e_args))
        if isinstance(args[1], Obj):
            assert c_args[1].count == e_args[1].count == 2
            torch.testing.assert_close(c_args[1].last, e_args[1].last)
        else:
            torch.testing.assert_close(c_args[1], e_args[1])
    h = history(c)
    assert len(h.graphs) == 1 and not h.breaks and not h.fallbacks and h.cache_hits == 1


def test_capture_records_but_does_not_perform_writes() -> None:
    out: list[Any] = []
    o = Obj()
    r = capture(attribute_writes, (torch.randn(2), o), {})
    r2 = capture(append_and_read, (torch.randn(2), out), {})
    assert isinstance(r, Captured) and isinstance(r2, Captured)
    assert o.count == 0 and o.last is None and out == []
    assert [(e.kind, e.name) for e in r.effects] == [("attr", "count"), ("attr", "last")]


def test_global_write_applied_once_per_call() -> None:
    global TOTAL
    TOTAL = 0
    c = er.compile(global_write, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(c(x), x + 10)
    assert TOTAL == 10
    torch.testing.assert_close(c(x), x + 110)  # a new value of the global: recaptured
    assert TOTAL == 110


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0
        self.log: list[Any] = []
        self.seen: dict[str, Any] = {}

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        self.log.append(y.sum())
        self.seen["last"] = y
        return y * self.calls


def test_module_attribute_and_container_writes(capsys: pytest.CaptureFixture[str]) -> None:
    m = Counter()
    ref = copy.deepcopy(m)
    c = er.compile(m, backend="eager")
    for _ in range(2):
        x = torch.randn(2, 3)
        torch.testing.assert_close(c(x), ref(x))
    assert m.calls == ref.calls == 2 and len(m.log) == len(ref.log) == 2
    torch.testing.assert_close(m.log, ref.log)
    torch.testing.assert_close(m.seen["last"], ref.seen["last"])


def effects_around_breaks(x, out):
    out.append(1)
    print("after one append:", len(out))  # a break: the append is applied before it
    out.append(x.sum())
    global TOTAL
    TOTAL = len(out)
    if x.sum() > 0:  # a break on a tensor value
        out.append("positive")
    print("total", TOTAL, "items", len(out))
    return x * TOTAL


def test_side_effects_interleave_with_prints_and_breaks(
        capsys: pytest.CaptureFixture[str]) -> None:
    global TOTAL
    c = er.compile(effects_around_breaks, backend="eager")
    for x in (torch.ones(3), -torch.ones(3)):
        TOTAL = 0
        e_out: list[Any] = []
        expected = effects_around_breaks(x, e_out)
        e_total, e_printed = TOTAL, capsys.readouterr().out
        TOTAL = 0
        c_out: list[Any] = []
        actual = c(x, c_out)
        assert capsys.readouterr().out == e_printed
        assert TOTAL == e_total
        torch.testing.assert_close(actual, expected)
        assert len(c_out) == len(e_out) and c_out[0] == 1 and c_out[-1] == e_out[-1]
        torch.testing.assert_close(c_out[1], e_out[1])
    h = history(c)
    assert len(h.breaks) >= 3 and not h.fallbacks


def test_side_effects_happen_once_with_a_break_inside_a_callee(
        capsys: pytest.CaptureFixture[str]) -> None:
    def record(out, x):
        out.append("enter")
        print("inside", len(out))
        out.append("exit")
        return x * 2

    def f(x, out):
        out.append("start")
        y = record(out, x + 1)
        out.append("end")
        return y

    c = er.compile(f, backend="eager")
    out: list[Any] = []
    e_out: list[Any] = []
    torch.testing.assert_close(c(torch.ones(2), out), f(torch.ones(2), e_out))
    assert out == e_out == ["start", "enter", "exit", "end"]
    printed = capsys.readouterr().out
    assert printed == "inside 2\ninside 2\n"
