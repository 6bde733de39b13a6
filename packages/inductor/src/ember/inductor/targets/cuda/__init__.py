"""The CUDA target: Triton kernels rendered from ember's fused loop IR (docs/inductor.md).

Registers the `triton` loader (codegen.py: each block a Python module of Triton source, loaded
from the private kernel cache; it runs on cuda, and on cpu tensors in Triton's interpreter),
the passes `matmul-lowp`, `schedule-cuda` and `codegen-triton` and the pipelines `inductor-cuda`
(prims -> kernels.*: `matmul-lowp` (matmul_lowp.py: a linear's GEMM in bf16/f16, not f32),
`cache-inplace` (inplace.py: a static KV cache's new rows written into the cache in place, and
with them a decode step's attention over the cache as one Triton kernel),
`lower-loops`, `fuse`, `fuse-shared` (fuse_shared.py: a residual add computed by the next
layernorm's kernel), `schedule-cuda`, `codegen-triton`, `plan-buffers`) and `inductor-cuda-interpret` (the same for CPU
graphs, run by TRITON_INTERPRET=1: how the target is tested without a GPU). Externs (matmul,
convolution, attention) are torch's own CUDA kernels.

The target record for device kind "cuda" is registered when this machine has CUDA and triton
is installed (`register_cuda_target()` registers it anywhere): elsewhere a cuda graph stays
refused with the registered targets named, as before, rather than failing at load time.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ember.inductor.launch import register_loader
from ember.inductor.targets import Target, register_target, targets
from ember.inductor.targets.cuda.attention import LOWERINGS as ATTENTION_LOWERINGS
from ember.inductor.targets.cuda.attention import cuda_attention as _cuda_attention  # noqa: F401
from ember.inductor.targets.cuda.autotune import autotune_cuda, with_autotune
from ember.inductor.targets.cuda.codegen import LANG, codegen_triton, load_triton
from ember.inductor.targets.cuda.fuse_shared import fuse_shared as _fuse_shared  # noqa: F401
from ember.inductor.targets.cuda.gemv import LOWERINGS as GEMV_LOWERINGS
from ember.inductor.targets.cuda.inplace import LOWERINGS as INPLACE_LOWERINGS
from ember.inductor.targets.cuda.matmul_lowp import matmul_lowp as _matmul_lowp  # noqa: F401
from ember.ir import Node
from ember.ir.passes import register_pipeline

# torch's fused CUDA attention stays one op (an extern of the same kernel: attention.py)
FRONT = "decompose{keep_cuda_attention=true},cse,dce"
INDUCTOR_CUDA = register_pipeline(
    "inductor-cuda", "cuda-attention,matmul-lowp,cache-inplace{attention=true},dce,lower-loops,fuse,fuse-shared,schedule-cuda,codegen-triton,plan-buffers",
    "prims -> loop kernels, fused, scheduled (cuda_* attributes), as Triton kernel blocks with "
    "planned buffers (CUDA)").text
INDUCTOR_CUDA_INTERPRET = register_pipeline(
    "inductor-cuda-interpret",
    "cuda-attention,matmul-lowp,cache-inplace{attention=true},dce,lower-loops,fuse,fuse-shared,schedule-cuda,"
    "codegen-triton{interpret=true},plan-buffers",
    "inductor-cuda for CPU graphs: Triton kernels run by Triton's interpreter "
    "(TRITON_INTERPRET=1; testing without a GPU)").text

TRITON_LOADER = register_loader(LANG, load_triton, devices=("cuda", "cpu"), launch_attrs=True)


def _extern(lw: Any, n: Node) -> None:
    """A torch kernel the front end keeps whole: one extern call on strided views."""
    lw.passthrough(n, n.op)


# the convolution gradients of training (prims.convolution's VJP rule): torch's cuDNN backward
# kernel, one extern (without this rule the backward's call was left to the reference
# interpreter, one eager op between Triton kernels)
EXTERNS = {"aten.convolution_backward.default": _extern}


def register_cuda_target() -> Target:
    """The target of device kind "cuda" (registered once; again returns the record)."""
    have = targets().get("cuda")
    if have is not None:
        return have
    return register_target("cuda", "inductor-cuda", LANG, front=FRONT,
                           lowerings={**ATTENTION_LOWERINGS, **INPLACE_LOWERINGS,
                                      **GEMV_LOWERINGS, **EXTERNS},
                           description="Triton kernels (externs: torch's CUDA kernels)")


def available() -> bool:
    """Whether this machine can run the target: a CUDA device and the triton package."""
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


if available():
    register_cuda_target()

__all__ = ["FRONT", "INDUCTOR_CUDA", "INDUCTOR_CUDA_INTERPRET", "TRITON_LOADER", "autotune_cuda",
           "available", "codegen_triton", "register_cuda_target", "with_autotune"]
