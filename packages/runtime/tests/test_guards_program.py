"""The fast guard check run as a C program (runtime/guardvm.py): on random guard functions and
random values it passes, fails (at the same `if`) and raises exactly where the Python function
does; a compiled model's check is the program, and every change still recompiles with the full
check's reason."""

from __future__ import annotations

import math
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.runtime import guardvm
from ember.runtime.testing import assert_same
from packages.runtime.tests.guard_checks import compiled_eager

pytestmark = pytest.mark.skipif(guardvm.machine() is None, reason="no C++ compiler")

_NAN = float("nan")
_POOL: list[Any] = [0, 1, -1, 2, 2.5, _NAN, True, False, None, "a", "b", "", (), (1, 2),
                    [1], {"a": 1}, {}, int, str, dict]
_KEYS = ["a", "b", 0, 1]


class Obj:
    pass


def _cell(v: Any) -> Any:
    def f() -> Any:
        return v
    assert f.__closure__ is not None
    return f.__closure__[0]


def _empty_cell() -> Any:
    return types.CellType()


class _Gen:
    """Random guard functions in fastguards.py's form, over S, A, K and held objects."""

    def __init__(self, draw: Any):
        self.draw = draw
        self.locals: list[str] = []

    def leaf(self) -> str:
        opts = ["S", "A", "K", "OD", "Cell.cell_contents", "EC.cell_contents",
                *self.locals, *[f"P{i}" for i in range(len(_POOL))]]
        return str(self.draw(st.sampled_from(opts)))

    def expr(self, depth: int = 0) -> str:
        if depth >= 2 or self.draw(st.integers(0, 2)) == 0:
            return self.leaf()
        x = self.expr(depth + 1)
        key = self.draw(st.sampled_from(_KEYS))
        form = self.draw(st.integers(0, 6))
        return str([f"{x}.a", f"{x}[{key!r}]", f"_ga({x}, 'a')", f"type({x})", f"len({x})",
                f"{x}.get({key!r})", f"tuple({x})"][form])

    def cond(self, depth: int = 0) -> str:
        form = self.draw(st.integers(0, 5 if depth < 2 else 2))
        if form == 0:
            op = self.draw(st.sampled_from(["is", "is not", "==", "!=", "<", ">="]))
            return f"{self.expr()} {op} {self.expr()}"
        if form == 1:
            op = self.draw(st.sampled_from(["in", "not in"]))
            return f"{self.draw(st.sampled_from(_KEYS))!r} {op} {self.expr()}"
        if form == 2:
            return self.expr()
        if form == 3:
            return f"not ({self.cond(depth + 1)})"
        op = " and " if form == 4 else " or "
        return op.join(f"({self.cond(depth + 1)})" for _ in range(self.draw(st.integers(2, 3))))

    def function(self) -> str:
        body = []
        for _ in range(self.draw(st.integers(1, 8))):
            if self.draw(st.booleans()):
                var = f"v{len(self.locals)}"
                body.append(f"        {var} = {self.expr()}")
                self.locals.append(var)
            else:
                body += [f"        if not ({self.cond()}):", "            return _full(S, A, K)"]
        if self.draw(st.booleans()):  # the tensor check's shape
            body += [f"        if {self.expr()} or not {self.expr()}:",
                     "            return _full(S, A, K)"]
        outs = [self.expr() for _ in range(self.draw(st.integers(0, 3)))]
        return "\n".join(["def guard(S, A, K):", "    try:", *body,
                          f"        return [{', '.join(outs)}]", "    except Exception:",
                          "        return _full(S, A, K)", ""])


def _reference(src: str, ns: dict[str, Any]) -> Any:
    """The Python function, returning the ordinal of its failing `if` (-2: an exception)."""
    lines, k = [], 0
    for line in src.splitlines():
        if line == "            return _full(S, A, K)":
            line, k = f"            return {k}", k + 1
        lines.append(line)
    text = "\n".join(lines).replace("    except Exception:\n        return _full(S, A, K)",
                                    "    except Exception:\n        return -2")
    g = dict(ns)
    exec(compile(text, "<reference>", "exec"), g)  # noqa: S102  (the test's own source)
    return g["guard"]


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a is b or a == b


def _world(draw: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    pick = st.sampled_from(_POOL)
    S = draw(st.sampled_from([None, 1, "a", Obj()]))
    if isinstance(S, Obj):
        for name in draw(st.lists(st.sampled_from(["a", "b"]), max_size=2)):
            setattr(S, name, draw(pick))
    A = tuple(draw(st.lists(pick, max_size=3)))
    K = {k: draw(pick) for k in draw(st.lists(st.sampled_from(["a", "b"]), max_size=2))}
    return S, A, K


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_program_agrees_with_python(data: Any) -> None:
    draw = data.draw
    src = _Gen(draw).function()
    OD: dict[Any, Any] = {}
    ns: dict[str, Any] = {"OD": OD, "Cell": _cell(draw(st.sampled_from(_POOL))),
                          "EC": _empty_cell(), "_ga": object.__getattribute__,
                          **{f"P{i}": v for i, v in enumerate(_POOL)}}
    ref = _reference(src, ns)
    prog = guardvm.program(src, ns, lambda S, A, K: "full")
    assert prog is not None, src
    for _ in range(4):  # the same program over changing values
        OD.clear()
        OD.update({k: draw(st.sampled_from(_POOL)) for k in
                   draw(st.lists(st.sampled_from(_KEYS), max_size=3))})
        S, A, K = _world(draw)
        want = ref(S, A, K)
        got = prog(S, A, K)
        if isinstance(want, list):
            assert _same(got, want) and prog.failed == -1, (src, S, A, K)
        else:
            assert got == "full" and prog.failed == want, (src, S, A, K, got, prog.failed)


def test_other_exceptions_propagate() -> None:
    class Stop:
        @property
        def a(self) -> Any:
            raise KeyboardInterrupt

    src = "\n".join(["def guard(S, A, K):", "    try:", "        if not (S.a is None):",
                     "            return _full(S, A, K)", "        return []",
                     "    except Exception:", "        return _full(S, A, K)", ""])
    prog = guardvm.program(src, {}, lambda S, A, K: "full")
    with pytest.raises(KeyboardInterrupt):
        prog(Stop(), (), {})
    assert prog(Obj(), (), {}) == "full" and prog.failed == -2
    o = Obj()
    o.a = None  # type: ignore[attr-defined]
    assert prog(o, (), {}) == []


def test_unsupported_shapes_stay_python() -> None:
    for cond in ("(n := A[0]) >= 2", "0 < A[0] < 3", "A[0] if S else A[1]"):
        src = "\n".join(["def guard(S, A, K):", "    try:", f"        if not ({cond}):",
                         "            return _full(S, A, K)", "        return []",
                         "    except Exception:", "        return _full(S, A, K)", ""])
        assert guardvm.program(src, {}, lambda S, A, K: "full") is None, cond


class Config:
    def __init__(self) -> None:
        self.mode = "sum"
        self.eps = 1e-5
        self.layers = [1, 2]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = Config()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.config.mode == "sum":
            y = y + x
        if len(self.config.layers) == 2:
            y = y * 2
        out: torch.Tensor = y + self.config.eps
        return out


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    with torch.no_grad():
        yield


@pytest.mark.parametrize("change, reason", [
    (lambda m: setattr(m.config, "mode", "none"), "self.config.mode is 'none'"),
    (lambda m: setattr(m.config, "eps", 1e-6), "self.config.eps is 1e-06"),
    (lambda m: m.config.layers.append(3), "len(self.config.layers) is 3, expected 2"),
    (lambda m: setattr(m, "lin", nn.Linear(3, 3)), "self.lin is"),
    (lambda m: m.lin.register_forward_hook(lambda *a: None), "self.lin has no forward"),
    (lambda m: torch.set_grad_enabled(True), "torch.is_grad_enabled() is False"),
])
def test_compiled_check_is_the_program_and_recompiles(change: Any, reason: str) -> None:
    m = Net()
    c, cf, x = compiled_eager(m, 2, 3)
    code = cf.entries[0].code
    assert type(code.guard) is guardvm.machine().Program
    change(m)
    assert_same(m(x), c(x))
    report = er.explain(c)
    assert len(cf.history.graphs) == 2, report
    assert len(report.recompilations) == 1 and reason in report.recompilations[0], report


def test_without_the_machine_the_check_stays_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guardvm, "machine", lambda: None)
    m = Net()
    c, cf, x = compiled_eager(m, 2, 3)
    code = cf.entries[0].code
    assert isinstance(code.guard, types.FunctionType) and code.guard is not code.full
    m.config.mode = "none"
    assert_same(m(x), c(x))
    assert "self.config.mode is 'none'" in er.explain(c).recompilations[0]


def test_prefetch_of_stale_addresses_is_harmless() -> None:
    """A program prefetches the cache lines its recorded runs read (objects freed since
    included): results are those of Python on every run, fresh objects each time."""
    src = "\n".join([
        "def guard(S, A, K):", "    try:",
        "        v0 = A[0]",
        "        if not (type(v0) is D and v0['a'][0] == 1 and 'b' not in v0):",
        "            return _full(S, A, K)",
        "        return [v0['a'], K.get('k')]",
        "    except Exception:", "        return _full(S, A, K)", ""])
    prog = guardvm.program(src, {"D": dict}, lambda S, A, K: "full")
    assert prog is not None and prog.prefetched == 0
    for i in range(300):
        d: dict[str, Any] = {f"x{j}": [j] * j for j in range(i % 50)}
        d["a"] = [1 if i % 7 else 2]
        if i % 11 == 0:
            d["b"] = 0
        want = "full" if i % 7 == 0 or i % 11 == 0 else [d["a"], i]
        got = prog(None, (d,), {"k": i})
        assert got == want, (i, got)
        if i == 0:
            assert prog.prefetched > 0  # the first run recorded what it read
        del d
    # recording (a sort of the lines) is paid on runs 0, 1, 64, 4096, ... only
    assert prog.recorded == 3
