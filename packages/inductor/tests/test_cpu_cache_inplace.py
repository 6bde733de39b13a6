"""`cache-inplace` on the C++ CPU target (first in `inductor-cpu`): a static KV cache's new rows
are written into the cache tensor by one `index_copy_` extern, where the runtime says the
result replaces the input (`replaced_inputs`) and nothing else reads the old value. Before, a
decode step cloned each cache whole for the scatter and the runtime copied the result back.
Checked against eager: values, the caches after each call (bitwise), generate()'s tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.runtime as er
from ember.inductor.backend import compiled_runner
from ember.inductor.targets.cpu import CACHE_ROWS
from ember.inductor.targets.cuda import inplace
from ember.ir.passes import expand_pipeline, run_pipeline
from ember.runtime.writeback import REPLACED_INPUTS, backend_module
from packages.inductor.tests.decode_steps import (
    S,
    cache_inputs,
    cache_step,
    cache_step_reading_old,
    captured,
    externs,
)


def test_the_cpu_pipeline_writes_the_rows_in_place(inplace_runs: list[bool]) -> None:
    assert CACHE_ROWS == inplace.OP
    assert expand_pipeline("inductor-cpu").startswith("cache-inplace,dce,")
    args = cache_inputs()
    bm = backend_module(captured(cache_step, args))
    assert bm.graph().attrs[REPLACED_INPUTS] == [[0, 1]]
    m = run_pipeline(bm, "inductor")
    ops = externs(m)
    assert ops.count(inplace.OP) == 1 and "prims.scatter" not in ops, ops
    want_cache = args[0].clone()
    want = cache_step(want_cache, args[1], args[2])
    cache = args[0].clone()
    got = compiled_runner(m)(None, [cache, args[1], args[2]]).outputs
    assert got[1] is cache  # the graph returns the input itself: no write-back to do
    assert inplace_runs == [True]
    assert torch.equal(cache, want_cache)
    torch.testing.assert_close(got[0], want)


def test_kept_where_the_old_value_is_read() -> None:
    args = cache_inputs()
    m = run_pipeline(backend_module(captured(cache_step_reading_old, args)), "inductor")
    assert inplace.OP not in externs(m)
    want_cache = args[0].clone()
    want = cache_step_reading_old(want_cache, args[1], args[2])
    cache = args[0].clone()
    got = compiled_runner(m)(None, [cache, args[1], args[2]]).outputs
    assert torch.equal(cache, args[0])  # pure: the runtime writes back
    assert torch.equal(got[1], want_cache)
    torch.testing.assert_close(got[0], want)


def test_a_graph_without_replaced_inputs_is_left_alone() -> None:
    c = captured(cache_step, cache_inputs())
    m = c.module.clone()  # input_updates: no promise that the result replaces the input
    assert run_pipeline(m, "cache-inplace") is m


def test_compile_updates_the_callers_cache_each_call(inplace_runs: list[bool]) -> None:
    cf = er.compile(cache_step)
    cache, want_cache = cache_inputs()[0], cache_inputs()[0].clone()
    for at in range(S):
        _, k, pos = cache_inputs(at)
        with torch.no_grad():
            got = cf(cache, k, pos)
        want = cache_step(want_cache, k, pos)
        torch.testing.assert_close(got, want)
        assert torch.equal(cache, want_cache)
    assert len(inplace_runs) == S and all(inplace_runs), inplace_runs
    assert er.explain(cf).fallbacks == []


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_static_cache_generate_matches_eager_tokens(name: str,
                                                   inplace_runs: list[bool]) -> None:
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
    runs = inplace_runs
    assert runs and len(runs) % 4 == 0 and all(runs), runs  # 2 layers x (keys, values) per step
    assert er.explain(cf).fallbacks == []
