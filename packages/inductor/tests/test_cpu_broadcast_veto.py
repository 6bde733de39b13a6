"""A squeeze-excitation block on the CPU target (targets/cpu/broadcast.py, conv.py): the gate
sigmoid(s) of [N, C, 1, 1], read by the channels-last [N, H, W, C] scale along its contiguous
channels, is written once by its own kernel instead of recomputed (an exp) at every pixel; a
gate over an NCHW image (hoisted by the C++ compiler) still fuses. The SiLU read by both the
pool and the scale runs once, in place inside the convolution's extern. Outputs as eager's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.targets.cpu.broadcast import BROADCAST, COSTLY
from ember.runtime.compile import compile as ember_compile

needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="the channels-last convolution needs mkldnn")


class SE(torch.nn.Module):
    def __init__(self, conv: bool) -> None:
        super().__init__()
        self.conv = conv
        self.c0 = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.bn = torch.nn.BatchNorm2d(16)
        self.c1 = torch.nn.Conv2d(16, 4, 1)
        self.c2 = torch.nn.Conv2d(4, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv:  # channels-last from here on
            x = torch.nn.functional.silu(self.bn(self.c0(x)))
        g = x.mean((2, 3), keepdim=True)
        g = torch.sigmoid(self.c2(torch.relu(self.c1(g))))
        return x * g


def _run(conv: bool, tmp: Path) -> tuple[str, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = SE(conv).eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 16, 12, 12)
    x[0, 3, 4, 5] = float("nan")
    f = ember_compile(m, options={"dump_dir": str(tmp)})
    with torch.no_grad():
        got, want = f(x), m(x)
    text = next(tmp.glob("*.kernels.ir")).read_text()
    return text, got, want


@needs_mkldnn
def test_a_channels_last_gate_is_written_once(tmp_path: Path) -> None:
    text, got, want = _run(True, tmp_path)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-5)
    # the gate's own kernel, [N, C, 1, 1]; the scale kernel reads it
    assert re.search(r"kernels\.call\(@\w+, %\S+, out_dtypes=\[f32\], "
                     r"out_shapes=\[\[2, 16, 1, 1\]\]", text), text
    # the SiLU read by the pool and the scale runs once, inside the depthwise convolution
    assert re.search(r'op="loop\.conv2d_packed".*groups=16, silu=true', text), text


def test_an_nchw_gate_still_fuses(tmp_path: Path) -> None:
    text, got, want = _run(False, tmp_path)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-5)
    assert "out_shapes=[[2, 16, 1, 1]]" not in text, text  # inlined into the scale


def test_the_veto_names_costly_ops_and_a_ratio() -> None:
    assert "prims.exp" in COSTLY and "prims.add" not in COSTLY and BROADCAST > 1
