"""ember <-> torch's compiler stack (ember.runtime.interop_torch, docs/interop.md).

- `torch.compile(m, backend="ember")`: Dynamo's FX graph captured and compiled by ember; each
  case checks the result against eager and that ember's compiled code ran (no fallback).
- `ember.runtime.compile(m, backend="torch-inductor")`: ember's capture, torch's inductor; each
  case checks against eager and that torch's inductor compiled the graph.
- `to_fx`: the exported FX graph is the IR graph node for node.

torch's inductor and Dynamo cold-compile in seconds per graph on CPU, so the models are tiny and
the cases few. Everything runs under no_grad: ember's inductor does not build backward graphs
yet (the training case checks that this falls back to ember's eager backend with a warning).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.runtime as er
from ember.capture import Captured, capture
from ember.runtime.interop_torch import inductor as ti
from ember.runtime.interop_torch.dynamo import EmberGraph, compiled_graphs, ember_backend
from ember.runtime.interop_torch.fx_export import ExportError, to_fx
from ember.runtime.testing import check_against_eager, clone_tree, tiny_hf_model
from ember.runtime.writeback import backend_module

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _convbn() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 5))
    m[1].running_mean.uniform_(-0.5, 0.5)  # eval BatchNorm with non-trivial statistics
    m[1].running_var.uniform_(0.5, 2.0)
    return m.eval()


def _mutate(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(y)
    x[0].mul_(3)  # a write through a view
    return x * 2


SMALL: dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]] = {
    "mlp": lambda: (_mlp(), (torch.randn(3, 8),)),
    "convbn": lambda: (_convbn(), (torch.randn(2, 3, 6, 6),)),
    "mutation": lambda: (_mutate, (torch.randn(2, 3), torch.randn(2, 3))),
}


def _ember_warnings(w: list[warnings.WarningMessage]) -> list[str]:
    return [str(x.message) for x in w if str(x.message).startswith("ember")]


# -- torch.compile(backend="ember") --------------------------------------------------------------

def test_ember_is_a_listed_dynamo_backend() -> None:
    assert "ember" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("ember") is ember_backend


def _through_dynamo(fn: Any, args: tuple[Any, ...], **kw: Any) -> tuple[Any, Any, EmberGraph]:
    """(eager result, result of torch.compile(backend="ember"), the graph ember compiled); the
    arguments of each run are separate copies and must end up equal too (mutation)."""
    e_args, c_args = clone_tree(args), clone_tree(args)
    want = fn(*e_args)
    got = torch.compile(fn, backend="ember", **kw)(*c_args)
    torch.testing.assert_close(c_args, e_args)
    graphs = compiled_graphs()
    assert len(graphs) >= 1
    return want, got, graphs[-1]


@pytest.mark.parametrize("case", SMALL)
def test_torch_compile_ember_backend(case: str) -> None:
    fn, args = SMALL[case]()
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        want, got, g = _through_dynamo(fn, args)
    torch.testing.assert_close(got, want)
    assert _ember_warnings(w) == []
    assert g.ran_compiled, g.eager_reasons
    assert any("the inductor backend compiled it" in n for n in g.compiled.history.notes)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_torch_compile_ember_backend_hf(name: str) -> None:
    pytest.importorskip("transformers")
    m, kw = tiny_hf_model(name)
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        want = m(ids, **kw)
        got = torch.compile(m, backend="ember")(ids, **kw)
    torch.testing.assert_close(got[0], want[0])
    assert _ember_warnings(w) == []
    graphs = compiled_graphs()
    assert graphs and all(g.ran_compiled for g in graphs), [g.eager_reasons for g in graphs]


def test_ember_backend_new_shapes() -> None:
    """Dynamo's second graph takes the size as a SymInt input; ember specializes and recompiles
    per shape, and a repeated shape hits ember's cache."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).relu().sum(0)

    cf = torch.compile(f, backend="ember")
    with torch.no_grad():
        for n in (3, 5, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(cf(x), f(x))
    g = compiled_graphs()[-1]
    assert g.ran_compiled, g.eager_reasons
    assert g.compiled.history.cache_hits == 1


def test_ember_backend_falls_back_with_a_warning() -> None:
    """A graph capture cannot take (Dynamo's raw grad-mode switch) runs eagerly, and says so."""
    def f(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = x * 2
        return y + x

    x = torch.randn(4, requires_grad=True)
    with pytest.warns(UserWarning, match=r"ember backend: .*the FX graph runs eagerly"):
        want, got, g = _through_dynamo(f, (x,))
    torch.testing.assert_close(got, want)
    assert not g.ran_compiled and g.fallback is not None
    assert "_set_grad_enabled" in g.fallback
    # counted as an eager run, once per graph, in the summary explain() gives
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the graph runs eagerly from now on, without warning
        g(x.detach().clone().requires_grad_())
    rep = er.explain(g.compiled)
    assert rep.fallback_kinds == {"capture": 1}, str(rep)
    assert "1 fallback(s): 1 capture" in str(rep) and "_set_grad_enabled" in str(rep)


def test_ember_backend_trains_compiled() -> None:
    """Gradients needed: ember compiles the forward and the backward (ember.autograd); the
    gradients are eager's and no fallback warning is given."""
    m = _mlp()
    x = torch.randn(3, 8)
    want_m = _mlp()
    want_m.load_state_dict(m.state_dict())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        want, got, g = _through_dynamo(m, (x,))
    torch.testing.assert_close(got, want)
    assert _ember_warnings(w) == []
    got.sum().backward()
    want_m(x).sum().backward()
    for p, q in zip(m.parameters(), want_m.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad)
    assert g.ran_compiled, g.eager_reasons


def test_ember_backend_options() -> None:
    m = _mlp()
    x = torch.randn(3, 8)
    with torch.no_grad():
        want, got, g = _through_dynamo(m, (x,), options={"backend": "eager"})
    torch.testing.assert_close(got, want)
    assert g.compiled.backend_name == "eager" and g.compiled.history.graphs
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown option.*'fast'.*known: backend, cache_limit"):
        torch.compile(m, backend="ember", options={"fast": True})(x)


# -- ember.runtime.compile(backend="torch-inductor") ----------------------------------------------

@pytest.fixture
def inductor_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The graphs torch's inductor compiled (a miss here would mean something else ran)."""
    seen: list[str] = []
    real = ti.compile_graph

    def counting(module: Any, graph: str | None, inputs: Any) -> Any:
        seen.append(module.graph(graph).name)
        return real(module, graph, inputs)

    monkeypatch.setattr(ti, "compile_graph", counting)
    return seen


def test_torch_inductor_is_an_ember_backend() -> None:
    from ember.ir.backends import default_backends
    assert default_backends().get("torch-inductor") is ti.TORCH_INDUCTOR


@pytest.mark.parametrize("case", SMALL)
def test_ember_compile_torch_inductor(case: str, inductor_compiles: list[str]) -> None:
    fn, args = SMALL[case]()
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        check_against_eager(fn, *args, backend="torch-inductor", calls=2)
    assert _ember_warnings(w) == []
    assert len(inductor_compiles) == 1  # the second call reused torch's compiled code


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_ember_compile_torch_inductor_hf(name: str, inductor_compiles: list[str]) -> None:
    pytest.importorskip("transformers")
    m, kw = tiny_hf_model(name)
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        want = m(ids, **kw)
        c = er.compile(m, backend="torch-inductor")
        got = c(ids, **kw)
    torch.testing.assert_close(got[0], want[0])
    assert _ember_warnings(w) == []
    h = c.compiled.history
    assert len(h.graphs) == 1 and not h.fallbacks and not h.breaks
    assert len(inductor_compiles) == 1


# -- the exporter ---------------------------------------------------------------------------------

def test_to_fx_is_the_ir_graph_node_for_node() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = torch.split(x.relu(), 2)  # a list result
        return torch.nn.functional.batch_norm(a, torch.zeros(3), torch.ones(3)), b.sum()

    x = torch.randn(4, 3)
    cap = capture(f, (x,), {})
    module = backend_module(cap)
    gm = to_fx(module)
    calls = [n.target for n in gm.graph.nodes
             if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    assert [f"{t._schema.name.replace('::', '.')}.{t._overloadname}" for t in calls] == \
        [n.op for n in module.graph().nodes]
    torch.testing.assert_close(list(gm(x)), module_runner(module)(x))


def module_runner(module: Any) -> Callable[..., list[torch.Tensor]]:
    """The reference interpreter on `module` (what the exported graph must agree with)."""
    from ember.ir import Interpreter
    interp = Interpreter(module, check_types=False)
    return lambda *xs: interp.run(list(xs)).outputs


def test_to_fx_refuses_lowered_graphs() -> None:
    from ember.ir import parse
    m = parse('ember.ir 1.0\n\ngraph @g(%x: f32[2]) -> (f32[2]) {\n'
              '  %y = prims.neg(%x) : f32[2]\n  return (%y)\n}\n')
    with pytest.raises(ExportError, match="prims.neg is not a torch operator"):
        to_fx(m)


STEPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "relu": lambda c, o: c.relu(),
    "add": lambda c, o: c + o,
    "mul_": lambda c, o: c.mul_(2),  # in place: on the input, an input update
    "chunk": lambda c, o: torch.cat(list(reversed(torch.chunk(c, 2, dim=1))), dim=1),
    "max": lambda c, o: (lambda r: c - r.values + r.indices)(c.max(dim=1, keepdim=True)),
    "t": lambda c, o: c.t().contiguous().t(),
    "softmax": lambda c, o: c.softmax(-1),
    "where": lambda c, o: torch.where(c > o, c, o * 0.5),
}


@settings(max_examples=25)
@given(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5))
def test_to_fx_agrees_with_the_interpreter(steps: list[str]) -> None:
    """Any captured aten graph (list and multi-result ops, input updates) exports to an FX
    graph that computes what ember's reference interpreter computes."""
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = x
        for s in steps:
            c = STEPS[s](c, y)
        return c

    x, y = torch.randn(4, 6), torch.randn(4, 6)
    cap = capture(f, (x.clone(), y), {})
    assert isinstance(cap, Captured), cap
    module = backend_module(cap)
    inputs = cap.input_examples  # the graph's parameters (unused arguments are not among them)
    torch.testing.assert_close(list(to_fx(module)(*clone_tree(inputs))),
                               module_runner(module)(*clone_tree(inputs)))
