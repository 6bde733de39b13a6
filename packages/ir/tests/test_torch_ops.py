"""torch operators as IR ops: device arguments, schema-driven literal conversion."""

from __future__ import annotations

import pytest
import torch

from ember.ir import parse, run_graph, verify


@pytest.mark.parametrize("device,want", [("cpu", ""), ("cuda:0", "@cuda:0"), ("cuda", "@cuda")])
def test_device_argument_types_without_running_on_it(device: str, want: str) -> None:
    """Type inference runs meta kernels, so a device argument must not reach a real device;
    the result type carries the named device."""
    text = (f'ember.ir 1.0\n\ngraph @f(%x: f32[2]) -> (f64[2]{want}, f32[3]{want}) {{\n'
            f'  %y = aten._to_copy.default(%x, dtype=f64, device="{device}") : f64[2]{want}\n'
            f'  %z = aten.full.default([3], 1.5, device="{device}") : f32[3]{want}\n'
            f'  return (%y, %z)\n}}\n')
    verify(parse(text))


def test_device_argument_runs_on_cpu() -> None:
    m = parse('ember.ir 1.0\n\ngraph @f(%x: f32[2]) -> (f64[2]) {\n'
              '  %y = aten._to_copy.default(%x, dtype=f64, device="cpu") : f64[2]\n'
              '  return (%y)\n}\n')
    (y,) = run_graph(m, [torch.ones(2)])
    assert y.dtype == torch.float64


def test_wrong_device_in_declared_type_is_reported() -> None:
    m = parse('ember.ir 1.0\n\ngraph @f(%x: f32[2]) -> (f64[2]) {\n'
              '  %y = aten._to_copy.default(%x, dtype=f64, device="cuda:0") : f64[2]\n'
              '  return (%y)\n}\n')
    with pytest.raises(Exception, match="cuda:0"):
        verify(m)


def test_layout_and_memory_format_strings() -> None:
    m = parse('ember.ir 1.0\n\ngraph @f(%x: f32[1, 2, 3, 3]) -> (f32[1, 2, 3, 3]) {\n'
              '  %y = aten.clone.default(%x, memory_format="channels_last") : f32[1, 2, 3, 3]\n'
              '  return (%y)\n}\n')
    verify(m)
    (y,) = run_graph(m, [torch.randn(1, 2, 3, 3)])
    assert y.is_contiguous(memory_format=torch.channels_last)
