"""Issue 19 #5: a compiled call stays valid only while the Python definitions it inlined do.

Patching a class method after the first call, shadowing a method with an instance attribute,
replacing a class property, and assigning a function's `__defaults__`, `__kwdefaults__` or
`__code__` each make the next compiled call return what eager returns (a recompilation, with a
readable reason), on the "eager" and "inductor" backends. Each test builds its own classes and
functions, since the mutations are global.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.runtime.compile import CompiledFunction

BACKENDS = ["eager", "inductor"]


def history(c: Any) -> Any:
    cf = c.compiled if isinstance(c, er.CompiledModule) else c
    assert isinstance(cf, CompiledFunction)
    return cf.history


def same(eager: Callable[..., Any], compiled: Callable[..., Any], *args: Any) -> None:
    want, got = eager(*args), compiled(*args)
    # float32 tolerance: the inductor's C++ may contract `x * a + b` into one fma (a stale
    # graph is off by far more)
    torch.testing.assert_close(got, want)


def make_module() -> tuple[type[nn.Module], nn.Module]:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def f(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

        @property
        def k(self) -> float:
            return 2.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.f(self.lin(x)) * self.k

    return M, M()


def make_helper() -> tuple[Callable[..., Any], Callable[..., Any]]:
    def helper(x: torch.Tensor, a: float = 1.0, *, b: float = 2.0) -> torch.Tensor:
        return x * a + b

    def fn(x: torch.Tensor) -> torch.Tensor:
        return helper(x) - 1

    return helper, fn


def _other_code(x: torch.Tensor, a: float = 1.0, *, b: float = 2.0) -> torch.Tensor:
    return x - a * b


@pytest.mark.parametrize("backend", BACKENDS)
def test_class_method_patched_after_first_call(backend: str) -> None:
    M, m = make_module()
    c = er.compile(m, backend=backend)
    x = torch.randn(2, 3)
    with torch.no_grad():
        same(m, c, x)
        M.f = lambda self, x: x * 10  # type: ignore[method-assign,assignment]
        same(m, c, x)
        same(m, c, x)  # and the new graph is reused
    h = history(c)
    assert len(h.recompilations) == 1 and "M.f is now" in h.recompilations[0], h.recompilations


@pytest.mark.parametrize("backend", BACKENDS)
def test_instance_attribute_shadows_a_method(backend: str) -> None:
    _, m = make_module()
    c = er.compile(m, backend=backend)
    x = torch.randn(2, 3)
    with torch.no_grad():
        same(m, c, x)
        m.f = lambda x: x - 5  # type: ignore[method-assign,assignment]
        same(m, c, x)
        del m.f
        same(m, c, x)  # the class's method again
    assert any("shadowing" in r for r in history(c).recompilations), history(c).recompilations


@pytest.mark.parametrize("backend", BACKENDS)
def test_class_property_replaced(backend: str) -> None:
    M, m = make_module()
    c = er.compile(m, backend=backend)
    x = torch.randn(2, 3)
    with torch.no_grad():
        same(m, c, x)
        M.k = property(lambda self: -3.0)  # type: ignore[method-assign,assignment]
        same(m, c, x)
    assert "M.k is now <property" in history(c).recompilations[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change", ["defaults", "kwdefaults", "kwdefaults_in_place", "code"])
def test_inlined_function_changed(backend: str, change: str) -> None:
    helper, fn = make_helper()
    c = er.compile(fn, backend=backend)
    x = torch.randn(4)
    same(fn, c, x)
    if change == "defaults":
        helper.__defaults__ = (7.0,)
    elif change == "kwdefaults":
        helper.__kwdefaults__ = {"b": -4.0}
    elif change == "kwdefaults_in_place":
        helper.__kwdefaults__["b"] = 9.0
    else:
        helper.__code__ = _other_code.__code__
    same(fn, c, x)
    same(fn, c, x)
    assert len(history(c).recompilations) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_function_itself_changed(backend: str) -> None:
    """The compiled function's own defaults and code are guarded like an inlined one's."""
    def f(x: torch.Tensor, a: float = 1.0) -> torch.Tensor:
        return x + a

    c = er.compile(f, backend=backend)
    x = torch.randn(3)
    same(f, c, x)
    f.__defaults__ = (5.0,)
    same(f, c, x)
    f.__code__ = (lambda x, a=1.0: x * a).__code__
    same(f, c, x)


def test_method_patched_on_a_base_class_and_bases_reassigned() -> None:
    class Base(nn.Module):
        def g(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    class Other(nn.Module):
        def g(self, x: torch.Tensor) -> torch.Tensor:
            return x * 3

    class M(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.g(x)

    m = M()
    c = er.compile(m, backend="eager")
    x = torch.randn(3)
    same(m, c, x)
    Base.g = lambda self, x: x - 2  # type: ignore[method-assign,assignment]
    same(m, c, x)
    M.g = lambda self, x: x * 0  # type: ignore[attr-defined]  # now found earlier in the MRO
    same(m, c, x)
    del M.g  # type: ignore[attr-defined]
    M.__bases__ = (Other,)
    same(m, c, x)


def test_forward_patched_on_the_instance_and_the_class() -> None:
    M, m = make_module()
    c = er.compile(m, backend="eager")
    x = torch.randn(2, 3)
    with torch.no_grad():
        same(m, c, x)
        m.forward = lambda x: x.sum()  # type: ignore[method-assign]
        same(m, c, x)
        del m.forward
        M.forward = lambda self, x: x * 2  # type: ignore[method-assign]
        same(m, c, x)
        # a child module's forward replaced on the instance (LoRA-style patching)
        M.forward = lambda self, x: self.lin(x)  # type: ignore[method-assign]
        same(m, c, x)
        m.lin.forward = lambda x: x + 100  # type: ignore[method-assign]
        same(m, c, x)


def test_method_of_a_class_reached_through_the_class() -> None:
    class Ops:
        @staticmethod
        def scale(x: torch.Tensor) -> torch.Tensor:
            return x * 2

    def fn(x: torch.Tensor) -> torch.Tensor:
        return Ops.scale(x)

    c = er.compile(fn, backend="eager")
    x = torch.randn(3)
    same(fn, c, x)
    Ops.scale = staticmethod(lambda x: x - 1)  # type: ignore[method-assign,assignment]
    same(fn, c, x)


def test_guards_print_readably_in_explain() -> None:
    M, m = make_module()
    text = str(er.explain(m, torch.randn(2, 3)))
    assert "M.f resolves to M.__dict__['f']" in text
    assert "'f' not in self.__dict__" in text
    assert "M.k resolves to M.__dict__['k'], <property" in text
    assert "M.forward.__code__ is <code M.forward at" in text
    helper, fn = make_helper()
    text = str(er.explain(fn, torch.randn(3)))
    assert "helper.__defaults__ is (1.0,)" in text
    assert "helper.__kwdefaults__['b'] == 2.0" in text


# -- hypothesis: random sequences of mutations and calls ------------------------------------

MUTATIONS = ["method", "shadow", "unshadow", "property", "defaults", "kwdefaults", "code",
             "call"]


def _apply(kind: str, k: float, M: type, m: nn.Module, helper: Any) -> None:
    if kind == "method":
        M.f = lambda self, x: x * k  # type: ignore[attr-defined]
    elif kind == "shadow":
        m.f = lambda x: x + k  # type: ignore[method-assign,assignment]
    elif kind == "unshadow":
        m.__dict__.pop("f", None)
    elif kind == "property":
        M.k = property(lambda self: k)  # type: ignore[attr-defined]
    elif kind == "defaults":
        helper.__defaults__ = (k,)
    elif kind == "kwdefaults":
        helper.__kwdefaults__ = {"b": k}
    elif kind == "code":
        helper.__code__ = (_other_code if k > 0 else _bodies[0]).__code__


def _body0(x: torch.Tensor, a: float = 1.0, *, b: float = 2.0) -> torch.Tensor:
    return x * b - a


_bodies = [_body0]


@settings(max_examples=12, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(MUTATIONS),
                                st.sampled_from([-2.0, 0.5, 3.0])), min_size=1, max_size=6))
def test_random_mutation_sequences_match_eager(steps: list[tuple[str, float]]) -> None:
    helper, _ = make_helper()

    class M(nn.Module):
        def f(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

        @property
        def k(self) -> float:
            return 2.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return helper(self.f(x)) * self.k

    m = M()
    c = er.compile(m, backend="eager", options={"cache_limit": 64})
    x = torch.arange(3.0)
    same(m, c, x)
    for kind, k in steps:
        _apply(kind, k, M, m, helper)
        same(m, c, x)


def test_partial_held_by_a_module_is_guarded() -> None:
    """A partial's keywords dict can change in place: its values are guarded."""
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(x)

    m = M()
    c = er.compile(m, backend="eager")
    x = torch.randn(5)
    same(m, c, x)
    m.act.keywords["negative_slope"] = 0.7
    same(m, c, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_closure_cell_of_an_inlined_function_changed(backend: str) -> None:
    k = 2.0
    act = torch.relu

    def helper(x: torch.Tensor) -> torch.Tensor:
        return act(x) * k

    def fn(x: torch.Tensor) -> torch.Tensor:
        return helper(x) + 1

    c = er.compile(fn, backend=backend)
    x = torch.randn(4)
    same(fn, c, x)
    k = -3.0  # the cell's contents, read by helper
    same(fn, c, x)
    act = torch.tanh
    same(fn, c, x)
    assert len(history(c).recompilations) == 2
