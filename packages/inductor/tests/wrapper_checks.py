"""What the generated wrapper's tests (test_wrapper_views.py, test_wrapper_direct.py) share: a
test module's IR text compiled once per session (the CPU target's g++ builds are the cost), and
results compared bit for bit (the wrapper's cheap forms must not change a value)."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from ember.inductor.kernels import compile_module
from ember.ir import Module, parse


@cache
def compiled_once(text: str) -> Module:
    m: Module = compile_module(parse(text))
    return m


def same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
