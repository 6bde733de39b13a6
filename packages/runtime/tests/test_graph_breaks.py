"""Graph breaks with resume functions (capture part 3): at a construct capture does not cover,
the graph so far runs, the construct runs in plain Python, and a resume function (new bytecode)
continues, captured in turn. Every program is compared with eager on outputs, printed output and
state; explain() reports the graphs and breaks."""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.runtime.compile import compiled_function_of


def line_of(fn: Callable[..., Any], marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, t in enumerate(lines) if marker in t)


def same(fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]],
         capsys: pytest.CaptureFixture[str], calls: int = 2) -> Any:
    """Run `fn` eagerly and compiled (backend eager) on equal arguments `calls` times: the same
    outputs, arguments afterwards and printed output. Returns the compiled function's history."""
    c = er.compile(fn, backend="eager")
    for _ in range(calls):
        torch.manual_seed(0)
        args = make()
        e_args, c_args = copy.deepcopy(args), copy.deepcopy(args)
        capsys.readouterr()
        expected = fn(*e_args)
        printed = capsys.readouterr().out
        actual = c(*c_args)
        assert capsys.readouterr().out == printed
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(c_args, e_args)
    cf = compiled_function_of(c)
    assert cf is not None
    return cf.history


# -- the constructs -------------------------------------------------------------------------
def prints(x):
    y = x * 2
    print("y is", y.shape, y.dtype)  # HERE
    return y + 1


def item_used(x):
    s = x.abs().sum().item()  # HERE
    return x * s + (1 if s > 0 else 2)


def branch(x):
    y = x.sin()
    if y.sum() > 0:  # HERE
        y = y * 2
    else:
        y = y - 2
    return y.cos()


def bool_of_tensor(x):
    if bool((x > 0).any()):  # HERE
        return x + 1
    return x - 1


def tolist(x):
    vals = (x * 10).round().tolist()  # HERE
    return x + sum(vals), len(vals)


def unknown_c_function(x):
    y = x + 1
    pid = os.getpid()  # HERE
    return y * (pid > 0)


def helper(y):
    print("helper sees", tuple(y.shape))  # HERE
    return y.exp()


def inlined(x):
    y = x + 1
    z = helper(y)
    return z * 2


def deeper(y):
    return helper(y) + 1


def twice_inlined(x):
    return deeper(x * 3).sum()


def in_loop(x):
    acc = x
    for i in range(3):
        acc = acc * 2
        print("step", i)  # HERE
        acc = acc + i
    return acc


def loop_over_tensors(xs):
    total = xs[0] * 0
    for t in xs:
        if t.sum() > 0:  # HERE
            total = total + t
    return total


def in_no_grad(x):
    y = x * 2
    with torch.no_grad():
        z = y * 3
        print("grad enabled:", torch.is_grad_enabled())  # HERE
        z = z + y
    return y + 1, z


def several(x):
    a = x + 1
    print("one")
    b = a * a.sum().item()
    print("two", b.shape)
    if b.mean() > 0:
        b = b + 1
    print("three")
    return b


CORPUS: list[tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = [
    (prints, lambda: (torch.randn(2, 3),)),
    (item_used, lambda: (torch.randn(4),)),
    (branch, lambda: (torch.randn(5),)),
    (branch, lambda: (-torch.ones(5) * 2,)),
    (bool_of_tensor, lambda: (torch.randn(4),)),
    (tolist, lambda: (torch.randn(3),)),
    (unknown_c_function, lambda: (torch.randn(3),)),
    (inlined, lambda: (torch.randn(3),)),
    (twice_inlined, lambda: (torch.randn(2, 2),)),
    (in_loop, lambda: (torch.randn(3),)),
    (loop_over_tensors, lambda: ([torch.randn(3) for _ in range(3)],)),
    (in_no_grad, lambda: (torch.randn(3, requires_grad=True),)),
    (several, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make", CORPUS, ids=[f"{f.__name__}{i}" for i, (f, _) in
                                                  enumerate(CORPUS)])
def test_break_program_matches_eager(fn: Callable[..., Any], make: Any,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    h = same(fn, make, capsys)
    assert h.breaks and not h.fallbacks, (h.breaks, h.fallbacks)
    assert len(h.graphs) >= 1
    assert h.cache_hits >= 1  # the second call reused the entries (no recapture)


def test_break_reports_construct_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    for fn, reason in [(prints, "print()"), (item_used, "item"), (branch, "branch"),
                       (tolist, "tolist"), (unknown_c_function, "getpid")]:
        h = same(fn, lambda: (torch.randn(3),), capsys, calls=1)
        b = h.breaks[0]
        assert reason in b.reason and b.line == line_of(fn, "# HERE"), b
        assert b.file == inspect.getsourcefile(fn)


def test_no_grad_block_is_reentered_by_the_resume_function(
        capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(3, requires_grad=True)
    c = er.compile(in_no_grad, backend="eager")
    y, z = c(x)
    assert capsys.readouterr().out == "grad enabled: False\n"
    assert y.requires_grad and not z.requires_grad and torch.is_grad_enabled()
    ey, ez = in_no_grad(x)
    torch.testing.assert_close((y, z), (ey, ez))


def test_explain_counts_graphs_and_breaks(capsys: pytest.CaptureFixture[str]) -> None:
    rep = er.explain(several, torch.randn(3))
    # graphs: a+1 | a.sum() | a*s | b.mean()>0 | b+1 (the last resume returns b: no graph);
    # breaks: print, .item(), print, the branch, print
    assert rep.break_count == 5 and not rep.fallbacks
    assert rep.graph_count == 5
    assert [b.line for b in rep.breaks] == [line_of(several, 'print("one")'),
                                            line_of(several, ".item()"),
                                            line_of(several, 'print("two"'),
                                            line_of(several, "b.mean() > 0"),
                                            line_of(several, 'print("three")')]
    text = str(rep)
    assert "5 graph break(s)" in text and "graph breaks:" in text


def test_inlined_break_compiles_the_callee_on_its_own(
        capsys: pytest.CaptureFixture[str]) -> None:
    h = same(inlined, lambda: (torch.randn(3),), capsys, calls=1)
    # inlined: x+1 | call helper through the wrapper | z*2; helper: print | exp
    names = [g.name for g in h.graphs]
    assert "inlined" in names
    assert any(n.startswith("__resume_helper") for n in names), names
    stacks = [b.stack for b in h.breaks]
    assert any(len(s) == 2 and "inlined" in s[0] and "helper" in s[1] for s in stacks)


def test_fullgraph_turns_a_break_into_an_error() -> None:
    c = er.compile(branch, backend="eager", fullgraph=True)
    with pytest.raises(er.CaptureError) as info:
        c(torch.randn(3))
    assert "branch on a tensor" in str(info.value)
    assert f":{line_of(branch, '# HERE')}" in str(info.value)


def test_resume_function_recompiles_on_guard_failure(capsys: pytest.CaptureFixture[str]) -> None:
    c = er.compile(prints, backend="eager")
    for n in (3, 3, 5):
        x = torch.randn(n)
        torch.testing.assert_close(c(x), prints(x))
    h = compiled_function_of(c).history  # type: ignore[union-attr]
    # both the first graph and the resume function's were captured again for the new shape
    assert len(h.recompilations) == 2
    assert all("shape [5], expected [3]" in r for r in h.recompilations), h.recompilations
    assert len(h.graphs) == 4 and len(h.breaks) == 2


class BreakingModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.mean() > 0.1:  # HERE
            h = h * 2
        return self.b(h)


def test_module_forward_breaks_and_gradients_match(capsys: pytest.CaptureFixture[str]) -> None:
    m = BreakingModule()
    c = er.compile(copy.deepcopy(m), backend="eager")
    x = torch.randn(3, 4)
    out, ref = c(x), m(x)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    for p, q in zip(c.parameters(), m.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    h = compiled_function_of(c).history  # type: ignore[union-attr]
    assert len(h.breaks) == 1 and h.breaks[0].line == line_of(BreakingModule.forward, "# HERE")


def test_break_inside_try_falls_back_to_eager(capsys: pytest.CaptureFixture[str]) -> None:
    def f(x):
        try:
            print("inside try")
            return x + 1
        except RuntimeError:
            return x

    h = same(f, lambda: (torch.randn(2),), capsys)
    assert not h.breaks and "print()" in h.fallbacks[0].reason
    assert "try/except" in h.fallbacks[0].reason


# -- random straight-line programs ----------------------------------------------------------
STEPS = ("add", "mul", "sin", "print", "item_branch", "append", "print_list")


def make_program(steps: list[tuple[str, float]]) -> Callable[..., Any]:
    """Straight-line source for `steps` (the program text is ours, built from a fixed
    vocabulary; no user text is compiled)."""
    body = {
        "add": "x = x + {c}", "mul": "x = x * {c}", "sin": "x = torch.sin(x)",
        "print": "print('x0 =', round(float(x[0]), 3))",
        "item_branch": "if x.sum().item() > {c}:\n        x = x - 1\n    else:\n        x = x + 1",
        "append": "out.append(x * {c})", "print_list": "print('out has', len(out))",
    }
    lines = ["def prog(x, out):"] + ["    " + body[op].format(c=repr(c)) for op, c in steps]
    lines.append("    return x")
    ns: dict[str, Any] = {"torch": torch}
    exec(compile("\n".join(lines) + "\n", "<ember test program>", "exec"), ns)  # noqa: S102
    return ns["prog"]  # type: ignore[no-any-return]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(STEPS),
                          st.sampled_from([-1.0, -0.5, 0.0, 0.5, 2.0])), min_size=1,
                max_size=8),
       st.integers(0, 2**16))
def test_random_programs_match_eager_including_stdout(steps: list[tuple[str, float]],
                                                      seed: int) -> None:
    import contextlib
    import io

    prog = make_program(steps)
    x = torch.randn(4, generator=torch.Generator().manual_seed(seed))
    e_out: list[Any] = []
    c_out: list[Any] = []
    e_buf, c_buf = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(e_buf):
        expected = prog(x, e_out)
    c = er.compile(prog, backend="eager")
    with contextlib.redirect_stdout(c_buf):
        actual = c(x, c_out)
    assert c_buf.getvalue() == e_buf.getvalue()
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(c_out, e_out)
    h = compiled_function_of(c).history  # type: ignore[union-attr]
    assert not h.fallbacks, h.fallbacks
