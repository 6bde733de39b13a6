"""A compile()'s first call records its function once (issue 18 #5, compile time): the
dynamic-shape attempt makes no symbol on a first call (automatic dynamic waits for a size to
change), and its recording then is the static capture; capture used to record it again. A
later call with a changed size still records twice at the probe sizes and goes symbolic."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from ember.capture import Captured, capture
from ember.runtime import compile as ember_compile
from ember.runtime.dynamic import DynamicPolicy

CAP = sys.modules["ember.capture.capture"]


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    orig = CAP._capture

    def counted(*a: Any, **k: Any) -> Any:
        count[0] += 1
        return orig(*a, **k)
    monkeypatch.setattr(CAP, "_capture", counted)
    return count


def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ y) + x.sum(1, keepdim=True)


@pytest.mark.parametrize("dynamic", [None, False])
def test_first_call_records_once(recordings: list[int], dynamic: bool | None) -> None:
    c = ember_compile(f, dynamic=dynamic, backend="eager")
    x, y = torch.randn(4, 6), torch.randn(6, 6)
    torch.testing.assert_close(c(x, y), f(x, y))
    assert recordings[0] == 1


def test_changed_size_still_goes_symbolic(recordings: list[int]) -> None:
    c = ember_compile(f, backend="eager")
    y = torch.randn(6, 6)
    c(torch.randn(4, 6), y)
    recordings[0] = 0
    x = torch.randn(9, 6)
    torch.testing.assert_close(c(x, y), f(x, y))
    assert recordings[0] == 2  # the two probe recordings of the symbolic capture
    x = torch.randn(13, 6)
    recordings[0] = 0
    torch.testing.assert_close(c(x, y), f(x, y))
    assert recordings[0] == 0  # the symbolic graph serves the third size


def test_static_recording_is_the_static_capture() -> None:
    """The graph the dynamic attempt returns without symbols prints as capture's static one."""
    x, y = torch.randn(4, 6), torch.randn(6, 6)
    got = capture(f, (x, y), {}, dynamic=DynamicPolicy(None))
    want = capture(f, (x, y), {})
    assert isinstance(got, Captured) and isinstance(want, Captured)
    assert str(got.module) == str(want.module)
    assert [str(g) for g in got.guards] == [str(g) for g in want.guards]
