"""The default mode records CUDA graphs too: inference graphs of static shapes on one CUDA
device (runtime/cudagraphs.py `auto_graph_reason`; option cudagraphs=False turns it off).

On the H200 the zoo's small decoders are launch-bound under the default mode (~70 launches of
a few microseconds of GPU work each; benchmarks/cuda_model_profile.py): a replay of the
recorded call is what removes that. On the CPU, with test_cudagraphs.py's stand-in recorder
and the device kind the default mode records on set to cpu.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import ember.runtime as er
import ember.runtime.cudagraphs as cg
from ember.runtime.cudagraphs import CudaGraphs
from packages.runtime.tests.test_cudagraphs import ReplayingRecorder, mlp

compile_mod = importlib.import_module("ember.runtime.compile")


@pytest.fixture
def cpu_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cg, "AUTO_DEVICE", "cpu")
    monkeypatch.setattr(compile_mod, "CudaGraphs",
                        lambda: CudaGraphs(ReplayingRecorder(), device_type="cpu"))


def layers(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    for _ in range(8):  # 16 launches of little work: a replay saves more than it costs
        x = torch.tanh(x @ w)
    return x


def test_default_mode_records_static_inference_graphs(cpu_recorded: None) -> None:
    c = er.compile(layers, dynamic=False)
    w = torch.randn(8, 8) / 4
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 8)
            torch.testing.assert_close(c(x, w), layers(x, w))
    (g,) = er.explain(c).cuda_graphs
    assert (g.warmups, g.recordings, g.replays, g.plain) == (1, 1, 3, 0), g.text()


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_one_kernel_with_a_large_output_is_not_recorded(cpu_recorded: None) -> None:
    """One launch saves ~4 us; a replay and the clone of its 4 MB result cost more."""
    c = er.compile(double, dynamic=False)
    x = torch.randn(1 << 20)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(c(x), x * 2)
    assert er.explain(c).cuda_graphs == []


def test_default_mode_leaves_symbolic_opted_out_and_small_graphs_alone(cpu_recorded: None
                                                                      ) -> None:
    w = torch.randn(8, 8) / 4
    off = er.compile(layers, dynamic=False, options={"cudagraphs": False})
    dyn = er.compile(layers, dynamic=True)
    small = er.compile(mlp, dynamic=False)  # two launches: not worth a recording
    with torch.no_grad():
        for n in (2, 3, 4):
            x = torch.randn(n, 8)
            torch.testing.assert_close(off(x, w), layers(x, w))
            torch.testing.assert_close(dyn(x, w), layers(x, w))
            torch.testing.assert_close(small(x, w), mlp(x, w))
    assert er.explain(small).cuda_graphs == []
    assert er.explain(off).cuda_graphs == [] and er.explain(dyn).cuda_graphs == []
    with pytest.raises(ValueError, match="cudagraphs must be a bool"):
        er.compile(mlp, options={"cudagraphs": "yes"})


def test_default_mode_on_cpu_records_nothing() -> None:
    c = er.compile(layers, dynamic=False)
    with torch.no_grad():
        c(torch.randn(2, 8), torch.randn(8, 8))
    assert er.explain(c).cuda_graphs == []


class Normed(torch.nn.Module):
    """Small buffers read every call (BatchNorm's running statistics, in eval)."""

    def __init__(self) -> None:
        super().__init__()
        self.shift: torch.Tensor
        self.register_buffer("shift", torch.randn(8))
        self.w = torch.nn.Parameter(torch.randn(8, 8) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(8):
            x = torch.tanh(x @ self.w - self.shift)
        return x


def test_module_buffers_are_read_in_place_not_copied(cpu_recorded: None) -> None:
    import gc

    from ember.runtime.cudagraphs import _Recording
    before = {id(o) for o in gc.get_objects() if isinstance(o, _Recording)}
    m = Normed()
    c = er.compile(m, dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 8)
            torch.testing.assert_close(c(x), m(x))
        m.shift.add_(1.0)  # read where it is: the next replay sees the new values
        torch.testing.assert_close(c(x), m(x))
    (r,) = [o for o in gc.get_objects() if isinstance(o, _Recording) and id(o) not in before]
    static = {i for i, _ in r.static}
    assert len(static) == 2 and r.copied == [next(i for i in range(3) if i not in static)]
