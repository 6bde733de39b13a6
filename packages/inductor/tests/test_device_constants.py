"""CPU constants moved to the device are computed on it (targets/device_constants.py).

Found on the H200: timm's edgenext builds `~torch.zeros(shape).to(device=...)`, captured as a
CPU `zeros` copied to cuda, and the CUDA graph was refused ("tensors on several devices"). No
GPU here: the meta device stands in for cuda (capture records the same nodes), and the checks
are on the rewritten graph's types (verified) and on what is left alone.
"""

from __future__ import annotations

from typing import Any

import torch

from ember.capture import capture
from ember.inductor.targets import mixed_devices, scalar_inputs_to_device
from ember.ir import TensorType, parse, verify


def _captured(fn: Any, *args: torch.Tensor) -> Any:
    with torch.no_grad():
        c = capture(fn, args, {})
    assert getattr(c, "module", None) is not None, c
    return c.module  # type: ignore[union-attr]


def made_then_moved(x: torch.Tensor) -> torch.Tensor:
    mask = ~torch.zeros(x.shape).to(device=x.device, dtype=torch.bool)
    return x * mask.cumsum(1, dtype=torch.float32)


def returned_on_cpu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.zeros(x.shape)
    return x + z.to(x.device), z


def test_a_cpu_constant_copied_to_the_device_is_made_there() -> None:
    m = _captured(made_then_moved, torch.randn(2, 3, device="meta"))
    assert set(mixed_devices(m)) == {"cpu", "meta"}
    moved = scalar_inputs_to_device(m)
    assert moved is not None and moved.positions == {}
    assert not mixed_devices(moved.module)
    zeros = next(n for n in moved.module.graph().nodes if n.op == "aten.zeros.default")
    assert zeros.kwargs["device"] == "meta"
    assert isinstance(zeros.results[0].type, TensorType)
    assert zeros.results[0].type.device == "meta"
    verify(parse(str(moved.module)))


def test_a_cpu_value_the_caller_gets_back_stays_refused() -> None:
    m = _captured(returned_on_cpu, torch.randn(2, 3, device="meta"))
    assert scalar_inputs_to_device(m) is None
    assert set(mixed_devices(m)) == {"cpu", "meta"}
