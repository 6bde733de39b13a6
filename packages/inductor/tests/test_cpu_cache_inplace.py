"""`cache-inplace` on the C++ CPU target (first in `inductor-cpu`): a static KV cache's new rows
are written into the cache tensor by one `index_copy_` extern, where the runtime says the
result replaces the input (`replaced_inputs`) and nothing else reads the old value. Before, a
decode step cloned each cache whole for the scatter and the runtime copied the result back.
Checked against eager: values, the caches after each call (bitwise), generate()'s tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.capture import Captured, capture
from ember.inductor.backend import compiled_runner
from ember.inductor.targets.cpu import CACHE_ROWS
from ember.inductor.targets.cuda import inplace
from ember.ir import Module
from ember.ir.passes import expand_pipeline, run_pipeline
from ember.ir.registry import default_registry
from ember.runtime.writeback import REPLACED_INPUTS, backend_module

B, H, S, E = 2, 3, 6, 4


@pytest.fixture
def spy() -> Iterator[list[bool]]:
    """Per run of the in-place op: whether its result was its input tensor itself."""
    reg = default_registry()
    real = reg.lookup(inplace.OP)
    assert real is not None
    seen: list[bool] = []

    def run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
        out = real.reference(interp, args, kw)
        seen.append(out is args[0])
        return out
    reg.unregister(inplace.OP)
    reg.register(dataclasses.replace(real, reference=run))
    try:
        yield seen
    finally:
        reg.unregister(inplace.OP)
        reg.register(real)


def step(cache: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A static cache's update (StaticCache: index_copy_ along the length dim), then reads of
    the updated cache."""
    cache.index_copy_(2, pos, k)
    return torch.softmax(cache.sum(-1) * 0.5, -1)


def step_reading_old(cache: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    old = cache.sum(-1)  # the old value is read: the rows cannot be written in place
    cache.index_copy_(2, pos, k)
    return cache.sum(-1) - old


def inputs(at: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(at)
    return (torch.randn(B, H, S, E, generator=g), torch.randn(B, H, 1, E, generator=g),
            torch.tensor([at]))


def captured(fn: Any, args: tuple[Any, ...]) -> Captured:
    with torch.no_grad():
        c = capture(fn, args, {})
    assert isinstance(c, Captured) and c.updates, c
    return c


def externs(m: Module) -> list[str]:
    return [str(n.kwargs.get("op")) for g in m.graphs.values() for n in g.nodes
            if n.op == "kernels.extern"]


def test_the_cpu_pipeline_writes_the_rows_in_place(spy: list[bool]) -> None:
    assert CACHE_ROWS == inplace.OP
    assert expand_pipeline("inductor-cpu").startswith("cache-inplace,dce,")
    args = inputs()
    bm = backend_module(captured(step, args))
    assert bm.graph().attrs[REPLACED_INPUTS] == [[0, 1]]
    m = run_pipeline(bm, "inductor")
    ops = externs(m)
    assert ops.count(inplace.OP) == 1 and "prims.scatter" not in ops, ops
    want_cache = args[0].clone()
    want = step(want_cache, args[1], args[2])
    cache = args[0].clone()
    got = compiled_runner(m)(None, [cache, args[1], args[2]]).outputs
    assert got[1] is cache  # the graph returns the input itself: no write-back to do
    assert spy == [True]
    assert torch.equal(cache, want_cache)
    torch.testing.assert_close(got[0], want)


def test_kept_where_the_old_value_is_read() -> None:
    args = inputs()
    m = run_pipeline(backend_module(captured(step_reading_old, args)), "inductor")
    assert inplace.OP not in externs(m)
    want_cache = args[0].clone()
    want = step_reading_old(want_cache, args[1], args[2])
    cache = args[0].clone()
    got = compiled_runner(m)(None, [cache, args[1], args[2]]).outputs
    assert torch.equal(cache, args[0])  # pure: the runtime writes back
    assert torch.equal(got[1], want_cache)
    torch.testing.assert_close(got[0], want)


def test_a_graph_without_replaced_inputs_is_left_alone() -> None:
    c = captured(step, inputs())
    m = c.module.clone()  # input_updates: no promise that the result replaces the input
    assert run_pipeline(m, "cache-inplace") is m


def test_compile_updates_the_callers_cache_each_call(spy: list[bool]) -> None:
    cf = er.compile(step)
    cache, want_cache = inputs()[0], inputs()[0].clone()
    for at in range(S):
        _, k, pos = inputs(at)
        with torch.no_grad():
            got = cf(cache, k, pos)
        want = step(want_cache, k, pos)
        torch.testing.assert_close(got, want)
        assert torch.equal(cache, want_cache)
    assert len(spy) == S and all(spy), spy
    assert er.explain(cf).fallbacks == []


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_static_cache_generate_matches_eager_tokens(name: str, spy: list[bool]) -> None:
    """A tiny model's greedy generate() with a static cache through the compiled forward:
    eager's tokens, every decode step writing each layer's key and value rows in place."""
    pytest.importorskip("transformers")
    from ember.runtime.testing import generate_with, tiny_hf_model
    model: Any = tiny_hf_model(name)[0]
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    cf = er.compile(model.forward)
    want, got = generate_with(model, cf, ids, max_new_tokens=6, do_sample=False, pad_token_id=0,
                              cache_implementation="static")
    assert torch.equal(got, want)
    assert spy and len(spy) % 4 == 0 and all(spy), spy  # 2 layers x (keys, values) per step
    assert er.explain(cf).fallbacks == []
