"""Test kernels around the CUDA target's prelude (targets/cuda/prelude.py), for the tests of its
math functions run by Triton's interpreter (test_triton_erf.py, test_triton_bf16_math.py): the
prelude's interpreter form with the test's kernels written as one module, and an elementwise
launch of such a kernel."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ember.inductor.targets.cuda.prelude import prelude


def prelude_module(directory: Path, name: str, kernels: str) -> ModuleType:
    """The prelude (interpreter form) followed by `kernels` (Triton source using its
    functions), imported as module `name` from a file in `directory`."""
    path = directory / f"{name}.py"
    path.write_text(prelude(True) + kernels)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # triton.jit reads the function's module source
    spec.loader.exec_module(mod)
    return mod


def elementwise(kernel: Any, x: torch.Tensor, block: int = 1024, **kw: Any) -> torch.Tensor:
    """kernel(x_ptr, out_ptr, n, ..., BLOCK) over x as f32, one program per `block` elements."""
    x = x.to(torch.float32).contiguous()
    out = torch.empty_like(x)
    kernel[(max(1, math.ceil(x.numel() / block)),)](x, out, x.numel(), BLOCK=block, **kw)
    return out
