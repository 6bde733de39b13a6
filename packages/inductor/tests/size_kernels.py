"""The kernels that read a size none of their buffers carries, shared by the body-symbol tests
of both targets (test_cpp_body_symbols.py, test_triton_body_symbols.py; issue 20): s0 is the
first dim of the graph's %x, which no kernel reads; @k loads %t at an offset of s0 and scales
by it, @j makes an index over it a value, @v adds it to a 0-d position (a static cache's
`cumulative_length + s1`). Each test's module text is its @main, these, and its own kernels."""

from __future__ import annotations

from functools import cache

from ember.inductor.launch import load_module
from ember.ir import Module, parse
from ember.ir.passes import run_pipeline

SIZE_KERNELS = """graph @k(%t: f32[64]) -> (f32[]) {
  %v = loop.load(%t, index=[i0 + s0]) : f32[]
  %w = prims.mul(%v, s0) : f32[]
  return (%w)
}

graph @j() -> (i64[]) {
  %v = loop.index(index=i0 * s0 + 3) : i64[]
  return (%v)
}

graph @v(%c: i64[]) -> (i64[]) {
  %v = loop.load(%c, index=[]) : i64[]
  %w = prims.add(%v, s0) : i64[]
  return (%w)
}
"""


@cache
def compiled(text: str, pipeline: str) -> tuple[Module, Module]:
    """(the parsed module, it through `pipeline` with its kernels loaded), once a session."""
    src = parse(text)
    m = run_pipeline(src, pipeline)
    load_module(m)
    return src, m
