"""The scaled dot-product attention kernel a capture records is the one real tensors get.

`F.scaled_dot_product_attention` is a composite: it asks the device's backend choice (math,
flash, memory-efficient, cuDNN) and calls that kernel, so a capture records whatever the choice
said. On fake tensors the choice is not always the real one: on the H200, q/k/v with no mask
and is_causal=False (hf/vit's attention) got math under FakeTensorMode where real tensors of
the same layout get cuDNN (benchmarks/results/2026-12-02-h200-cuda-checks.md). The capture
then recorded math's decomposition (two GEMMs and a softmax, the scores in memory) where eager
runs one fused kernel. The choice is made inside sdpa's C++ (a dispatch stub, not an operator
the recorder sees), so the tracer asks it here instead: of real, uninitialised tensors of the
operands' layout on their device (it reads shapes, strides, dtypes, requires_grad, the device
and the global sdp switches, never values), and where that names a fused kernel, it calls the
kernel as sdpa would. Only the plain case is taken (no mask, no dropout, no GQA, a head dim
the kernels take unpadded); any other call runs sdpa as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

SDPA = torch._C._nn.scaled_dot_product_attention
# sdpa as code may reach it: F.scaled_dot_product_attention (that builtin, or a Python wrapper
# of it, depending on the torch version) and the aten operator itself
_SDPA_FORMS = (SDPA, torch.ops.aten.scaled_dot_product_attention,
               torch.ops.aten.scaled_dot_product_attention.default)
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS: dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False,
                             "scale": None, "enable_gqa": False}
FLASH, EFFICIENT, CUDNN = 1, 2, 3  # sdp::SDPBackend's numbers, as _fused_sdp_choice returns
DEVICES = ("cuda",)  # where the fake choice is not trusted (the CPU's is the real one)


def _bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    if len(args) > len(_NAMES) or set(kwargs) - set(_NAMES):
        return None
    got = {**_DEFAULTS, **dict(zip(_NAMES, args, strict=False)), **kwargs}
    return got if all(n in got for n in _NAMES) else None


def real_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                scale: float | None) -> int:
    """The backend sdpa picks for real tensors laid out as q, k, v (no mask, no dropout)."""
    def real(x: torch.Tensor) -> torch.Tensor:
        r = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype,
                                device=x.device)
        return r.requires_grad_(x.requires_grad)
    with _disable_current_modes():
        return int(torch.ops.aten._fused_sdp_choice(real(q), real(k), real(v), None, 0.0,
                                                    is_causal, scale=scale))


def _plain(b: dict[str, Any]) -> bool:
    q, k, v = b["query"], b["key"], b["value"]
    if not all(isinstance(t, torch.Tensor) and t.device.type in DEVICES and t.dim() == 4
               and t.is_floating_point() for t in (q, k, v)):
        return False
    if not all(isinstance(d, int) for t in (q, k, v) for d in (*t.shape, *t.stride())):
        return False  # symbolic shapes: no real tensor takes them
    E = q.shape[-1]
    return (b["attn_mask"] is None and b["dropout_p"] == 0.0 and b["enable_gqa"] is False
            and isinstance(b["is_causal"], bool) and E % 8 == 0 and k.shape[-1] == E
            and v.shape[-1] == E and q.shape[1] == k.shape[1] == v.shape[1]
            and (b["scale"] is None or isinstance(b["scale"], float)))


def as_real_choice(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> Callable[..., Any]:
    """`fn`, or where `fn` is sdpa on fake CUDA operands whose real choice is a fused kernel,
    a call of that kernel with the arguments sdpa's composite gives it (aten/native/
    transformers/attention.cpp: the log-sum-exp only where autograd needs it, flash's scale
    computed from the head dim, the output the first result)."""
    if not any(fn is f for f in _SDPA_FORMS):
        return fn
    b = _bind(args, kwargs)
    if b is None or not _plain(b):
        return fn
    q, k, v, causal, scale = b["query"], b["key"], b["value"], b["is_causal"], b["scale"]
    choice = real_choice(q, k, v, causal, scale)
    aten = torch.ops.aten

    def lse() -> bool:
        return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if choice == CUDNN:
        return lambda *a, **kw: aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, lse(), 0.0, causal, False, scale=scale)[0]
    if choice == EFFICIENT:
        return lambda *a, **kw: aten._scaled_dot_product_efficient_attention(
            q, k, v, None, lse(), 0.0, causal, scale=scale)[0]
    if choice == FLASH:
        s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        return lambda *a, **kw: aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=s)[0]
    return fn
