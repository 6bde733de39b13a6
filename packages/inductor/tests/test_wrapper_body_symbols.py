"""A loop body left to the reference interpreter reads the call's size symbols (wrapper.py).

On the H200 a generate() whose prefill recompiled with a symbolic sequence length (s0) failed
with "OpTypeError: prims.add in @forward_k66: symbol s0 is not bound": a kernel the Triton
tables did not take stayed a `loop.pointwise` run by the interpreter's reference, whose body
adds the length to the cache position (`prims.add(%v, s0)`), a size that none of the body's
buffers carries. The generated call bound s0 for its own shapes but never handed it to the
body. It now binds the symbols its bodies use and passes them (`_interp.env`), as the
interpreter does when it runs the whole graph.
"""

from __future__ import annotations

import torch

import ember.inductor  # noqa: F401  (the loop ops)
from ember.inductor.wrapper import generate
from ember.ir import Interpreter, parse

TEXT = """ember.ir 1.1

symbol s0 hint=8 min=2

graph @main(%x: f32[s0, 4], %c: i64[]) -> (i64[], f32[s0]) {
  %y = loop.pointwise(@k, %c, ranges=[]) : i64[]
  %r = loop.reduction(@r, %x, ranges=[s0], reduce_ranges=[4], reduction="sum") : f32[s0]
  return (%y, %r)
}

graph @k(%c: i64[]) -> (i64[]) {
  %v = loop.load(%c, index=[]) : i64[]
  %w = prims.add(%v, s0) : i64[]
  return (%w)
}

graph @r(%x: f32[s0, 4]) -> (f32[]) domain(i0 < s0, r0 < 4) {
  %v = loop.load(%x, index=[i0, r0]) : f32[]
  %n = prims.mul(%v, s0) : f32[]
  return (%n)
}
"""


def test_a_body_on_the_interpreter_sees_the_calls_sizes() -> None:
    m = parse(TEXT)
    w = generate(m, "main")
    assert "_interp.env = {'s0': s0}" in w.source
    for n in (2, 5, 9):  # one generated call for every length
        ins = [torch.randn(n, 4), torch.tensor(3)]
        want = Interpreter(m).run(ins, "main").outputs
        got = w.call(list(ins)).outputs
        assert int(got[0]) == 3 + n == int(want[0])
        torch.testing.assert_close(got[1], ins[0].sum(1) * n)
        torch.testing.assert_close(got[1], want[1])
