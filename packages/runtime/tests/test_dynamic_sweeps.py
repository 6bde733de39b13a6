"""Issue 17's "Done when" shape sweeps, one table: every case gives eager's results at every
size, with at most 2 captures under `dynamic=None` (the first call specializes, the first change
makes the changing dims symbolic) and exactly 1 under `dynamic=True`, plus one per extra side of
a branch on a size; every graph compiled by the inductor (no fallback, no eager note)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from ember.runtime.compile import compile, compiled_function_of
from ember.runtime.explain import explain

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    return s.softmax(-1) @ v


def reduce_dynamic_dim(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) * 2 + x.amax(0) - x.mean(0)


def reshape_from_sizes(x: torch.Tensor) -> torch.Tensor:
    b, s, d = x.shape
    return x.reshape(b * s, d).sum(-1).view(b, s) + x.view(b, -1)[:, :1]


def branch(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] > 8:
        return x * 2
    return x - 1


def int_argument(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.sum(-1, keepdim=True) * n + torch.arange(n) / n


def cat_cache(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return torch.cat([cache, new], dim=1) * 2


def decode_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    keys = torch.cat([cache_k, k], dim=2)
    values = torch.cat([cache_v, v], dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(q, keys, values)
    return out, keys, values


@dataclass
class Sweep:
    fn: Callable[..., Any]
    make: Callable[[int], tuple[Any, ...]]
    sizes: list[int]
    branches: Callable[[int], Any] = lambda n: 0  # which side of a branch a size takes


# the sizes avoid the static sizes of each case (2, 3, 8, 16: duck sizing would share a symbol)
CASES: dict[str, Sweep] = {
    "batch": Sweep(MLP, lambda n: (torch.randn(n, 16),), [4, 5, 6, 7, 9, 13]),
    "sequence": Sweep(attention, lambda n: tuple(torch.randn(2, n, 8) for _ in range(3)),
                      [4, 5, 6, 7, 9, 13]),
    "reduce-dynamic-dim": Sweep(reduce_dynamic_dim, lambda n: (torch.randn(n, 8),),
                                [4, 5, 6, 7, 9, 13]),
    "reshape-from-sizes": Sweep(reshape_from_sizes, lambda n: (torch.randn(2, n, 8),),
                                [4, 5, 6, 7, 9, 13]),
    "branch": Sweep(branch, lambda n: (torch.randn(n, 3),), [4, 5, 6, 9, 12, 13],
                    lambda n: n > 8),
    "int-argument": Sweep(int_argument, lambda n: (torch.randn(3, 8), n), [4, 5, 6, 7, 9, 13]),
    "cat-cache": Sweep(cat_cache, lambda n: (torch.randn(2, n, 8), torch.randn(2, 1, 8)),
                       [4, 5, 6, 7, 9, 13]),
    "kv-cache-attention": Sweep(decode_attention, lambda n: (
        torch.randn(2, 3, 1, 8), torch.randn(2, 3, n, 8), torch.randn(2, 3, n, 8),
        torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)), [4, 5, 6, 7, 9, 13]),
}


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", list(CASES))
def test_done_when_sweep(name: str, dynamic: bool | None) -> None:
    case = CASES[name]
    cf = compile(case.fn, dynamic=dynamic)
    with torch.no_grad():
        for n in case.sizes:
            args = case.make(n)
            torch.testing.assert_close(cf(*args), case.fn(*args), atol=1e-4, rtol=1e-4)
    rep = explain(cf)
    extra = len({case.branches(n) for n in case.sizes}) - 1
    want = (2 if dynamic is None else 1) + extra
    assert rep.graph_count <= want if dynamic is None else rep.graph_count == want, \
        rep.recompilations
    assert rep.fallbacks == [] and rep.breaks == [], str(rep)
    h = compiled_function_of(cf)
    assert h is not None
    notes = h.history.notes
    assert not [n for n in notes if "eager" in n], notes
    compiled = [n for n in notes if "the inductor backend compiled it to" in n]
    assert compiled and not [n for n in notes if "interpreter" in n], notes
    assert "symbol s0" in rep.graphs[-1].ir  # the last graph is size-generic


def slice_by_other(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x[:y.shape[0]] * 2


@pytest.mark.parametrize("dynamic", [False, None, True])
def test_a_size_read_from_an_input_the_graph_does_not_take(dynamic: bool | None) -> None:
    """y is pruned from the graph (only its size is read) but keeps its guard, and the slice
    the probe sizes clamp to x's static length is not taken for a symbolic one."""
    cf = compile(slice_by_other, dynamic=dynamic, backend="eager")
    x = torch.randn(10, 3)
    for n in (3, 4, 5, 12):
        y = torch.randn(n)
        torch.testing.assert_close(cf(x, y), slice_by_other(x, y))


CONV_BN = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
                              torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 4, 3, padding=1)).eval()


def test_a_symbolic_batch_keeps_the_convolutions_fast_path() -> None:
    """The size-generic graph compiles to the specialized one's kernels (channels-last oneDNN
    convolutions with BatchNorm and ReLU folded), not to the plain convolution."""
    notes = {}
    for dynamic in (False, True):
        cf = compile(CONV_BN, dynamic=dynamic)
        with torch.no_grad():
            for n in (5, 9):
                x = torch.randn(n, 3, 12, 12)
                torch.testing.assert_close(cf(x), CONV_BN(x), atol=1e-4, rtol=1e-4)
        h = compiled_function_of(cf)
        assert h is not None and explain(cf).fallbacks == []
        notes[dynamic] = [n for n in h.history.notes if "compiled it to" in n]
    assert "symbol s0" in explain(cf).graphs[-1].ir
    assert notes[True][-1] == notes[False][-1], notes
