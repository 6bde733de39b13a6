"""`cache-inplace` on the C++ CPU target (first in `inductor-cpu`): a static KV cache's new rows
are written into the cache tensor by one `index_copy_` extern, where the runtime says the
result replaces the input (`replaced_inputs`) and nothing else reads the old value. Before, a
decode step cloned each cache whole for the scatter and the runtime copied the result back.
Checked against eager: values, the caches after each call (bitwise), generate()'s tokens."""

from __future__ import annotations

import pytest

from ember.inductor.targets.cpu import CACHE_ROWS
from ember.inductor.targets.cuda import inplace
from ember.ir.passes import expand_pipeline, run_pipeline
from ember.runtime.writeback import REPLACED_INPUTS, backend_module
from packages.inductor.tests.decode_steps import (
    cache_inputs,
    cache_step,
    cache_step_reading_old,
    captured,
    check_cache_step,
    check_compiled_cache_calls,
    check_static_generate,
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
    check_cache_step(m, cache_step, args, in_place=True)
    assert inplace_runs == [True]


def test_kept_where_the_old_value_is_read() -> None:
    args = cache_inputs()
    m = run_pipeline(backend_module(captured(cache_step_reading_old, args)), "inductor")
    assert inplace.OP not in externs(m)
    check_cache_step(m, cache_step_reading_old, args, in_place=False)


def test_a_graph_without_replaced_inputs_is_left_alone() -> None:
    c = captured(cache_step, cache_inputs())
    m = c.module.clone()  # input_updates: no promise that the result replaces the input
    assert run_pipeline(m, "cache-inplace") is m


def test_compile_updates_the_callers_cache_each_call(inplace_runs: list[bool]) -> None:
    check_compiled_cache_calls(inplace_runs)


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_static_cache_generate_matches_eager_tokens(name: str,
                                                   inplace_runs: list[bool]) -> None:
    """A tiny model's greedy generate() with a static cache through the compiled forward:
    eager's tokens, every decode step writing each layer's key and value rows in place."""
    check_static_generate(name, 6, inplace_runs)
