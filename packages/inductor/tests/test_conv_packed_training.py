"""`loop.conv2d_packed` under training (targets/cpu/packed.py): a weight that changes before
every call (an optimizer step between steps) stops being packed after CHANGING calls in a row
(each pack would serve one call), and is packed again once it stops changing."""

from __future__ import annotations

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.targets.cpu import packed
from ember.ir import Interpreter, Module

INTERP = Interpreter(Module())  # _run does not read it

KW = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "scale": True,
      "bias": True, "relu": True}


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="packing needs mkldnn")
def test_a_weight_changed_before_every_call_runs_unpacked_then_packed_again() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, 3)
    w = torch.nn.Parameter(torch.randn(4, 3, 3, 3))
    a, b = torch.rand(4) + 0.5, torch.randn(4)

    def want() -> torch.Tensor:
        y = torch.convolution(x.permute(0, 3, 1, 2), w.detach() * a[:, None, None, None], b,
                              [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return torch.relu(y).permute(0, 2, 3, 1)

    for step in range(packed.CHANGING + 3):
        with torch.no_grad():
            w.sub_(0.01 * torch.ones_like(w))  # an SGD step: a new version
        torch.testing.assert_close(packed._run(INTERP, [x, w, a, b], KW), want())
        # packed while the streak is short, plain (nothing cached) once it is long
        assert packed.is_cached(w) == (step <= packed.CHANGING), step
    torch.testing.assert_close(packed._run(INTERP, [x, w, a, b], KW), want())  # unchanged now
    assert packed.is_cached(w)
    first = packed.packed_weight(w, a, [2, 3, 5, 6], KW)
    assert packed.packed_weight(w, a, [2, 3, 5, 6], KW) is first  # reused again
