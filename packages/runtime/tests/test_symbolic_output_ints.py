"""A size symbol that leaves the graph as a Python int (a side effect or a returned value).

transformers 5.17's static cache records its batch size in the prefill (`self.batch_size,
self.num_heads = key_states.shape[:2]`). With the batch dim symbolic (a batch-8 generate()
after a batch-1 one) the generated output code returned the bare name `s0`, bound only
inside the guard function: "NameError: name 's0' is not defined" (H200, 05:51 run). The
output code now reads each symbol it returns from the input that binds it in the guards.
"""

from __future__ import annotations

from typing import Any

import torch

import ember.runtime as er


class Holder:
    n: Any = None
    m: Any = None


def record_sizes(x: torch.Tensor, h: Holder) -> tuple[torch.Tensor, int]:
    h.n, h.m = x.shape[:2]  # (a side effect: attributes set to sizes)
    return x * 2, x.shape[0] * x.shape[1] + 1


def test_sizes_set_as_attributes_and_returned_follow_each_call() -> None:
    c = er.compile(record_sizes, dynamic=True)
    for b, t in ((3, 4), (5, 2), (8, 7)):
        h = Holder()
        x = torch.randn(b, t)
        y, k = c(x, h)
        torch.testing.assert_close(y, x * 2)
        assert (h.n, h.m, k) == (b, t, b * t + 1)
        assert type(h.n) is int and type(k) is int
    assert er.explain(c).graph_count == 1  # one symbolic graph for every size
