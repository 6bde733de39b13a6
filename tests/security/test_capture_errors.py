"""Issue 19 #9, #10, #15: capture paths that used to fail with internal errors or noise.

#9: a `functools.partial` from outside the frame (a global, an argument, a module attribute) is
called as its func with its args and keywords, guarded; no bare `AssertionError`.
#10: `op(..., out=t)` writes `t` as eager does when `t` is an argument (written back in place,
same data_ptr), a local, a view of an argument, a buffer or a parameter; an `out=` of another
shape is resized by eager's own op (a graph break), with eager's warning.
#15: an operator that fails on fake tensors during capture gives ember's (eager's) error and
prints no torch ERROR log or traceback.
"""

from __future__ import annotations

import copy
import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.runtime.compile import CompiledFunction


def history(c: Any) -> Any:
    cf = c.compiled if isinstance(c, er.CompiledModule) else c
    assert isinstance(cf, CompiledFunction)
    return cf.history


# -- #9: functools.partial from outside the frame --------------------------------------------

def base(x: torch.Tensor, a: float, b: float = 1.0, *, c: float = 0.0) -> torch.Tensor:
    return x * a + b - c


P_KW = functools.partial(base, a=3.0)
P_ARGS = functools.partial(base, torch.ones(3), 2.0)
P_BOTH = functools.partial(base, a=2.0, c=0.5)
P_TORCH = functools.partial(torch.clamp, min=-0.5, max=0.5)


def via_global_kw(x: torch.Tensor) -> torch.Tensor:
    return P_KW(x)


def via_global_args(x: torch.Tensor) -> torch.Tensor:
    return P_ARGS(b=x.sum())


def via_global_both(x: torch.Tensor) -> torch.Tensor:
    return P_BOTH(x, b=4.0) + P_TORCH(x)


def via_argument(p: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return p(x) * 2


class WithPartial(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = functools.partial(nn.functional.leaky_relu, negative_slope=0.2)
        self.mix = functools.partial(base, a=0.5, c=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(self.act(self.lin(x)))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("fn", [via_global_kw, via_global_args, via_global_both])
def test_partial_from_a_global(backend: str, fn: Callable[..., Any]) -> None:
    x = torch.randn(3)
    c = er.compile(fn, backend=backend, fullgraph=True)
    torch.testing.assert_close(c(x), fn(x))
    torch.testing.assert_close(c(x), fn(x))


def test_partial_as_an_argument_is_guarded_on_its_contents() -> None:
    c = er.compile(via_argument, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for p in [functools.partial(base, a=2.0), functools.partial(base, a=2.0),
              functools.partial(base, a=5.0), functools.partial(base, a=5.0, b=3.0),
              functools.partial(base, 1.0, 2.0), functools.partial(torch.mul, 3.0)]:
        torch.testing.assert_close(c(p, x), via_argument(p, x))
    assert len(history(c).graphs) == 5  # the second partial equal to the first: a cache hit


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_partial_held_by_a_module(backend: str) -> None:
    m = WithPartial()
    c = er.compile(m, backend=backend, fullgraph=True)
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        m.mix = functools.partial(base, a=-1.0)
        torch.testing.assert_close(c(x), m(x))


def call_rest(p: Callable[..., torch.Tensor], *rest: Any) -> torch.Tensor:
    return p(*rest) * 2


@settings(max_examples=20, deadline=None)
@given(npos=st.integers(0, 2), a=st.floats(-3, 3, width=32),
       kw=st.dictionaries(st.sampled_from(["b", "c"]), st.floats(-3, 3, width=32), max_size=2))
def test_random_partials_match_eager(npos: int, a: float, kw: dict[str, float]) -> None:
    """Some of base's positional arguments (a tensor, a float) bound by the partial, the rest
    given at the call; keywords bound at random."""
    full: list[Any] = [torch.arange(3.0), a]
    p = functools.partial(base, *full[:npos], **kw)
    c = er.compile(call_rest, backend="eager", fullgraph=True)
    torch.testing.assert_close(c(p, *full[npos:]), call_rest(p, *full[npos:]))


def test_partial_subclass_is_a_clear_graph_break() -> None:
    class MyPartial(functools.partial):  # type: ignore[type-arg]
        pass

    p = MyPartial(base, a=2.0)
    x = torch.randn(3)
    c = er.compile(via_argument, backend="eager")
    torch.testing.assert_close(c(p, x), via_argument(p, x))
    with pytest.raises(er.CaptureError, match="MyPartial"):
        er.compile(via_argument, backend="eager", fullgraph=True)(p, x)


# -- #10: out= ---------------------------------------------------------------------------------

def out_arg(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.add(a, b, out=c)
    return a * 2


def out_returned(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.mul(a, b, out=c)


def out_local(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    t = torch.empty(3)
    torch.sub(a, b, out=t)
    return t + c


def out_view(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.add(a, b, out=c[1:])
    return c.sum()


def out_read_after(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.add(a, b, out=c)
    return c * 3


def out_is_input(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.add(a, b, out=a)
    return b


def out_promoting(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.add(a, b, out=c)  # f32 + f32 into f64
    return c


def _args(fn: Callable[..., Any]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, generator=g), torch.randn(3, generator=g)
    if fn is out_view:
        return a, b, torch.zeros(4)[:4]
    if fn is out_promoting:
        return a, b, torch.zeros(3, dtype=torch.float64)
    return a, b, torch.zeros(3)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("fn", [out_arg, out_returned, out_local, out_view, out_read_after,
                                out_is_input, out_promoting])
def test_out_writes_like_eager(backend: str, fn: Callable[..., Any]) -> None:
    want_args = _args(fn)
    want = fn(*want_args)
    args = _args(fn)
    ptrs = [t.data_ptr() for t in args]
    c = er.compile(fn, backend=backend)
    for _ in range(2):  # capture, then the cached graph
        args = tuple(t.zero_() if i == 2 else t for i, t in enumerate(args)) \
            if fn is not out_is_input else _args(fn)
        ptrs = [t.data_ptr() for t in args]
        got = c(*args)
        torch.testing.assert_close(got, want)
        for x, y in zip(args, want_args, strict=True):
            torch.testing.assert_close(x, y)
        assert [t.data_ptr() for t in args] == ptrs  # written in place
    if fn is out_returned:
        assert got is args[2]  # torch returns the out tensor itself


def test_out_into_buffer_and_parameter() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3))
            self.register_buffer("buf", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch.add(x, 1, out=self.buf)
            with torch.no_grad():
                torch.mul(x, 2, out=self.w)
            return x + self.buf

    m1 = M()
    m2 = copy.deepcopy(m1)
    c = er.compile(m2, backend="eager")
    ptrs = (m2.w.data_ptr(), m2.buf.data_ptr())
    for i in range(2):
        x = torch.randn(3) + i
        torch.testing.assert_close(c(x), m1(x))
        torch.testing.assert_close(m2.buf, m1.buf)
        torch.testing.assert_close(m2.w.detach(), m1.w.detach())
        assert (m2.w.data_ptr(), m2.buf.data_ptr()) == ptrs


def test_out_into_a_parameter_needing_grad_is_eagers_error() -> None:
    w = nn.Parameter(torch.zeros(3))

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.add(x, 1, out=w)

    with pytest.raises(RuntimeError) as eager_err:
        f(torch.randn(3))
    with pytest.raises(RuntimeError) as ember_err:
        er.compile(f, backend="eager")(torch.randn(3))
    assert str(ember_err.value) == str(eager_err.value)


@pytest.mark.parametrize("size", [5, 0])
def test_out_of_another_shape_is_resized_as_eager_does(size: int) -> None:
    """Eager resizes a mismatched out= (warning unless it is empty); ember leaves that op to
    eager (a graph break, reason named) and warns exactly as often."""
    a, b = torch.randn(3), torch.randn(3)
    c_eager, c_ember = torch.zeros(size), torch.zeros(size)
    with warnings.catch_warnings(record=True) as w_eager:
        warnings.simplefilter("always")
        want = out_arg(a, b, c_eager)
    c = er.compile(out_arg, backend="eager")
    with warnings.catch_warnings(record=True) as w_ember:
        warnings.simplefilter("always")
        got = c(a, b, c_ember)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(c_ember, c_eager)
    assert [str(w.message) for w in w_ember] == [str(w.message) for w in w_eager]
    assert any("resizes its output tensor" in br.reason for br in history(c).breaks)
    with pytest.raises(er.CaptureError, match="resizes its output tensor"):
        er.compile(out_arg, backend="eager", fullgraph=True)(a, b, torch.zeros(size))


@settings(max_examples=15, deadline=None)
@given(op=st.sampled_from([torch.add, torch.sub, torch.mul, torch.maximum]),
       where=st.sampled_from(["arg", "view", "local"]),
       n=st.integers(1, 4))
def test_random_out_targets_match_eager(op: Any, where: str, n: int) -> None:
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        if where == "arg":
            op(a, b, out=c)
        elif where == "view":
            op(a, b, out=c[:, 0])
        else:
            t = torch.empty(n)
            op(a, b, out=t)
            return t * c.sum()
        return a + 1

    def make() -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(n)
        c = torch.zeros(n) if where != "view" else torch.zeros(n, 2)
        return torch.randn(n, generator=g), torch.randn(n, generator=g), c

    want_args, args = make(), make()
    ptr = args[2].data_ptr()
    want = f(*want_args)
    got = er.compile(f, backend="eager")(*args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(args[2], want_args[2])
    assert args[2].data_ptr() == ptr


# -- #15: no torch ERROR log for a failure capture handles -------------------------------------

def bad_broadcast(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def bad_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def bad_view(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.view(7) + b.sum()


def bad_index(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[torch.tensor([9])] + b.sum()


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("fn", [bad_broadcast, bad_matmul, bad_view, bad_index])
def test_failing_op_prints_no_torch_traceback(backend: str, fn: Callable[..., Any],
                                              capfd: pytest.CaptureFixture[str],
                                              caplog: pytest.LogCaptureFixture) -> None:
    a, b = torch.ones(2, 3), torch.ones(4, 5)
    with pytest.raises(Exception) as eager_err:
        fn(a, b)
    capfd.readouterr()
    caplog.clear()
    with caplog.at_level(logging.DEBUG), pytest.raises(type(eager_err.value)) as ember_err:
        er.compile(fn, backend=backend)(a, b)
    assert str(ember_err.value) == str(eager_err.value)
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, err
    assert "failed while attempting to run meta" not in err
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records


def test_data_dependent_op_breaks_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(a) + a.sum().item()

    a = torch.tensor([0.0, 1.0, 2.0])
    capfd.readouterr()
    c = er.compile(f, backend="eager")
    torch.testing.assert_close(c(a), f(a))
    _, err = capfd.readouterr()
    assert "Traceback" not in err and " E" not in err[:3], err
    assert history(c).breaks or history(c).fallbacks  # the reason is ember's record


def test_torch_logging_outside_capture_is_untouched(caplog: pytest.LogCaptureFixture) -> None:
    """The filter is scoped to capture: torch's fake-tensor ERROR records still reach their
    handlers outside it."""
    with pytest.raises(RuntimeError):
        er.compile(bad_broadcast, backend="eager")(torch.ones(2), torch.ones(3))
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="torch._subclasses.fake_tensor"):
        logging.getLogger("torch._subclasses.fake_tensor").error("outside capture")
    assert [r.getMessage() for r in caplog.records] == ["outside capture"]
