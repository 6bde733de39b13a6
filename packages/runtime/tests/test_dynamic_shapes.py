"""Dynamic shapes (issue 17): one symbolic graph for a sweep of sizes, guards on size relations,
sizes flowing into Python ints, the automatic/True/False modes and mark_dynamic/mark_static.

The backend is "eager" (the captured graph's aten ops, symbols bound from the inputs) so the
sweeps stay fast; what is asserted is the capture: how many recompiles, the symbols and guards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.runtime.compile import compile, compiled_function_of
from ember.runtime.dynamic import mark_dynamic, mark_static

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def layer_norm_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],)).softmax(-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    return s.softmax(-1) @ v


def branch(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] > 8:
        return x * 2
    return x - 1


def flatten_rows(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], -1).sum(-1)


def _history(cf: Any) -> Any:
    f = compiled_function_of(cf)
    assert f is not None
    return f.history


def _sweep(fn: Callable[..., Any], make: Callable[[int], tuple[torch.Tensor, ...]],
           sizes: list[int], dynamic: bool | None) -> Any:
    cf = compile(fn, dynamic=dynamic, backend="eager")
    with torch.no_grad():
        for n in sizes:
            args = make(n)
            torch.testing.assert_close(cf(*args), fn(*args), atol=1e-5, rtol=1e-5)
    return _history(cf)


CASES = {
    "mlp": (MLP, lambda n: (torch.randn(n, 16),)),
    "layernorm-softmax": (layer_norm_softmax, lambda n: (torch.randn(n, 8),)),
    "attention-seq": (attention, lambda n: tuple(torch.randn(2, n, 8) for _ in range(3))),
    "view-size": (flatten_rows, lambda n: (torch.randn(n, 3, 4),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_automatic_dynamic_recompiles_once_over_a_sweep(name: str) -> None:
    fn, make = CASES[name]
    h = _sweep(fn, make, list(range(2, 21)), None)
    # the first call specializes; the second (a new size) captures once with a symbol
    assert len(h.recompilations) == 1, h.recompilations
    assert "symbol s0" in h.graphs[-1].ir


@pytest.mark.parametrize("name", ["mlp", "layernorm-softmax", "view-size"])
def test_dynamic_true_never_recompiles_over_a_sweep(name: str) -> None:
    fn, make = CASES[name]
    h = _sweep(fn, make, list(range(2, 21)), True)
    assert h.recompilations == []
    assert len(h.graphs) == 1


def test_dynamic_false_recompiles_per_shape() -> None:
    fn, make = CASES["layernorm-softmax"]
    h = _sweep(fn, make, [2, 3, 4], False)
    assert len(h.recompilations) == 2
    assert "symbol" not in h.graphs[-1].ir


def test_sizes_zero_and_one_stay_static() -> None:
    fn, make = CASES["layernorm-softmax"]
    h = _sweep(fn, make, [1, 5, 6, 7], True)
    assert len(h.recompilations) == 1  # size 1 is specialized, then one symbolic graph
    assert "x: tensor float32[s0, s1]" in " ".join(h.graphs[-1].guards)


def test_a_branch_on_a_size_is_a_guard_and_recompiles_only_when_it_flips() -> None:
    h = _sweep(branch, lambda n: (torch.randn(n, 3),), list(range(2, 21)), None)
    # specialize at 2; symbolic at 3 (the branch taken for sizes <= 8); 9 flips the branch
    assert len(h.recompilations) == 2, h.recompilations
    assert "s0" in h.recompilations[-1] and "[2, 8]" in h.recompilations[-1]
    assert "sizes: s0 > 8" in h.graphs[-1].guards


def test_view_with_a_size_from_python_is_symbolic() -> None:
    h = _sweep(flatten_rows, lambda n: (torch.randn(n, 3, 4),), [5, 6, 7], True)
    assert "aten.view.default(%l_x, [s0, -1]" in h.graphs[0].ir or \
        "aten.view.default(%l_x, [s0, s1 * s2]" in h.graphs[0].ir, h.graphs[0].ir


def test_guards_and_symbols_read_well() -> None:
    h = _sweep(layer_norm_softmax, lambda n: (torch.randn(n, 8),), [4, 5], None)
    text = " ".join(h.graphs[-1].guards)
    assert "x: tensor float32[s0, 8] stride=[8, 1] on cpu, s0 in [2, inf]" in text
    assert "symbol s0 hint=5 min=2" in h.graphs[-1].ir


def test_mark_dynamic_with_a_range_and_mark_static() -> None:
    cf = compile(layer_norm_softmax, dynamic=False, backend="eager")
    with torch.no_grad():
        for n in (3, 4, 5, 6):
            x = torch.randn(n, 8)
            mark_dynamic(x, 0, min=2, max=5)
            torch.testing.assert_close(cf(x), layer_norm_softmax(x))
    h = _history(cf)
    assert h.recompilations == [] or "symbol" not in h.graphs[0].ir  # False: never symbolic
    cf = compile(layer_norm_softmax, backend="eager")
    with torch.no_grad():
        for n in (3, 4, 5, 6):
            x = torch.randn(n, 8)
            mark_dynamic(x, 0, min=2, max=5)
            torch.testing.assert_close(cf(x), layer_norm_softmax(x))
    h = _history(cf)
    assert "symbol s0 hint=3 min=2 max=5" in h.graphs[0].ir
    assert len(h.recompilations) == 1  # 6 is outside [2, 5]
    cf = compile(layer_norm_softmax, dynamic=True, backend="eager")
    with torch.no_grad():
        for n in (3, 4):
            x = torch.randn(n, 8)
            mark_static(x, 0)
            cf(x)
    assert len(_history(cf).recompilations) == 1
    with pytest.raises(ValueError, match="min <= max"):
        mark_dynamic(torch.randn(3), 0, min=5, max=2)
    with pytest.raises(IndexError, match="out of range"):
        mark_static(torch.randn(3), 2)


FUNCS: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[torch.Tensor, ...]]]] = {
    "layernorm-softmax": CASES["layernorm-softmax"],
    "branch": (branch, lambda n: (torch.randn(n, 3),)),
    "rows": (lambda x: x.sum(-1) * x.shape[0], lambda n: (torch.randn(n, 5),)),
}


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(sorted(FUNCS)), sizes=st.lists(st.integers(1, 14), min_size=1,
                                                              max_size=8))
def test_random_size_sequences_match_eager(name: str, sizes: list[int]) -> None:
    fn, make = FUNCS[name]
    h = _sweep(fn, make, sizes, None)
    # one entry per static-ness class (1, or >= 2 on each side of the branch), plus the
    # first specialized capture of the >= 2 class
    classes = {n if n < 2 else (name == "branch" and n > 8) for n in sizes}
    assert len(h.recompilations) <= len(classes) + (name == "branch")


# ---- the inductor backend on symbolic graphs (issue 17 #3) ----------------------------------
# One symbolic graph compiles to C++ kernels that take the sizes as arguments: a sweep runs the
# compiled kernels at every size (no fallback, no interpreter) and builds no library after the
# first symbolic compile. Sizes 1023 and 4097 leave SIMD tails and cross a float sum's block.

CONV = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                           torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten(),
                           torch.nn.Linear(4 * 6 * 6, 5))


def layernorm_gelu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.shape[-1],)))


def reduce_dynamic_dim(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) * 2 + x.amax(0) - x.mean()


INDUCTOR_CASES: dict[str, tuple[Any, Callable[[int], tuple[torch.Tensor, ...]], list[int]]] = {
    "mlp": (MLP, lambda n: (torch.randn(n, 16),), [1023, 4097]),
    "softmax": (lambda x: x.softmax(-1), lambda n: (torch.randn(n, 33),), [1023, 4097]),
    "layernorm-gelu": (layernorm_gelu, lambda n: (torch.randn(n, 24),), [1023, 4097]),
    "reduce-dynamic-dim": (reduce_dynamic_dim, lambda n: (torch.randn(n, 8),), [1023, 4097]),
    "attention-seq": (attention, lambda n: tuple(torch.randn(2, n, 8) for _ in range(3)),
                      [1023]),
    "convnet-batch": (CONV, lambda n: (torch.randn(n, 3, 8, 8),), [33]),
}


def _libraries() -> int:
    from ember.inductor.targets.cpu import cache
    return cache.STATS.builds + len(cache._LOADED)


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("name", list(INDUCTOR_CASES))
def test_inductor_sweep_runs_compiled_cpp_at_every_size(name: str, dynamic: bool | None) -> None:
    from ember.runtime.explain import explain
    fn, make, large = INDUCTOR_CASES[name]
    cf = compile(fn, dynamic=dynamic)
    sizes = list(range(2, 21)) + (large if dynamic else [])
    libs: list[int] = []
    with torch.no_grad():
        for n in sizes:
            args = make(n)
            torch.testing.assert_close(cf(*args), fn(*args), atol=1e-4, rtol=1e-4)
            libs.append(_libraries())
    h = _history(cf)
    report = explain(cf)
    assert report.fallbacks == [], report.fallback_summary
    compiled = [n for n in h.notes if "the inductor backend compiled it to" in n]
    assert compiled and all("C++ kernel(s)" in n and "reference interpreter" not in n
                            for n in compiled), compiled
    # automatic dynamic: one specialized graph, then the symbolic one (attention: also its
    # first size, 2, equals the batch size and is captured as the same symbol)
    want = 1 if dynamic is None or name == "attention-seq" else 0
    assert len(h.recompilations) == want, h.recompilations
    assert len(set(libs[want:])) == 1, libs  # the symbolic graph's library serves every size
