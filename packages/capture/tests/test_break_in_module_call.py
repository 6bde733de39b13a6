"""A graph break under a module class's own `__call__` (transformers' GradientCheckpointingLayer:
`return super().__call__(*args, **kwargs)`): capture's top frame is that `__call__`, not
`forward`, so the break site is looked up in `__call__`'s code. Found on the H200: hf/deberta-v2's
layers broke at a scripted helper, and the site's index, taken in `forward`'s shorter code, was
past its end: `IndexError: list index out of range` out of `CompiledFunction._miss`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.capture import capture
from ember.capture.errors import Unhandled
from ember.capture.resume import Broken
from ember.runtime import compile as ember_compile


def opaque(x: torch.Tensor) -> torch.Tensor:
    return x * 2


_OPAQUE = torch.jit.script(opaque)
if hasattr(_OPAQUE, "_torchdynamo_inline"):  # no inlining: the call is a graph break
    del _OPAQUE._torchdynamo_inline


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # a longer frame than forward's, as GradientCheckpointingLayer's
        if self.training and getattr(self, "gradient_checkpointing", False):
            kwargs = dict(kwargs)
            kwargs.pop("use_cache", None)
        return super().__call__(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _OPAQUE(self.lin(x))
        return out.relu()


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x + 1)
        return x


def test_a_break_under_a_module_call_is_split_or_refused_never_raised() -> None:
    layer = Layer().eval()
    with torch.no_grad():
        got = capture(layer, (torch.randn(2, 4),), {})
    assert isinstance(got, (Broken, Unhandled)), got
    reason = got.unhandled.reason if isinstance(got, Broken) else got.reason
    assert "ScriptFunction" in reason


def test_a_model_whose_layers_break_under_their_call_runs_right() -> None:
    model = Stack().eval()
    x = torch.randn(2, 4)
    cf = ember_compile(model, dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cf(x), model(x))
