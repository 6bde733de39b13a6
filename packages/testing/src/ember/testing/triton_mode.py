"""How a test process runs Triton kernels, decided once per process before `triton.jit` runs:
in Triton's interpreter on CPU tensors (CI, no GPU), or launched on a GPU (the device run).

`triton.jit` reads TRITON_INTERPRET when a kernel is defined, so one setting must hold for the
whole process. Test files used to set it at import; collected in one pytest process on the
H200, one of them switched the GPU tests collected after it to the interpreter (a CUDA-graph
test then failed: the interpreter copies to the host while a graph records). The repository's
conftest.py imports this module before any test module, every Triton test file imports it
ahead of triton, and tests skip by its marks: `INTERPRETER_ONLY` (kernels run interpreted on
CPU tensors) and `NEEDS_CUDA` (real launches on a GPU), each with the reason.

The rule, from the environment at first import:
- `EMBER_TEST_CUDA=1` with a CUDA device (and TRITON_INTERPRET not 1): launches on the GPU.
- `TRITON_INTERPRET=0`: Triton compiles for real and nothing launches (a process that checks
  real compilation without a GPU: test_cuda_launch's `real_compile_check`).
- otherwise the interpreter: TRITON_INTERPRET=1 is set here.
"""

from __future__ import annotations

import os

import pytest
import torch


def _why_not_cuda() -> str | None:
    """Why kernels do not launch on a GPU in this process (None: they do)."""
    if os.environ.get("EMBER_TEST_CUDA") != "1":
        return "EMBER_TEST_CUDA=1 is not set"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "EMBER_TEST_CUDA=1, but TRITON_INTERPRET=1 is set"
    if not torch.cuda.is_available():
        return "EMBER_TEST_CUDA=1, but torch sees no CUDA device"
    return None


WHY_NOT_CUDA = _why_not_cuda()
REAL_CUDA = WHY_NOT_CUDA is None  # kernels launch on the GPU
# Triton's interpreter runs every kernel of this process
INTERPRET = not REAL_CUDA and os.environ.get("TRITON_INTERPRET") != "0"
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

NEEDS_CUDA = pytest.mark.skipif(
    not REAL_CUDA, reason=f"launches Triton kernels on a GPU: {WHY_NOT_CUDA} (the device run "
                          f"sets EMBER_TEST_CUDA=1 on a machine with a GPU)")
INTERPRETER_ONLY = pytest.mark.skipif(
    not INTERPRET, reason="runs Triton's interpreter on CPU tensors; this process "
                          + ("launches kernels on the GPU (EMBER_TEST_CUDA=1)" if REAL_CUDA
                             else "compiles them for real (TRITON_INTERPRET=0)"))
