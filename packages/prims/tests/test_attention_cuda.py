"""The CUDA forms of attention against the CUDA kernels themselves (skipped without a GPU).

The op database checks these decompositions on CPU against a reference built from eager CPU
ops; this test pins the kernels' conventions that reference encodes: the memory-efficient
kernel's logsumexp padded to a multiple of 32 with +inf and 0 on fully masked rows, the flash
kernel's bottom-right causal alignment and +inf logsumexp on rows that see no key, cuDNN's
[B, H, L, 1] logsumexp with -inf on fully masked rows. Last run: H200, torch 2.11.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from ember.ir import Interpreter
from ember.testing.harness import decomposed
from ember.testing.opdb import Sample

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

aten = torch.ops.aten
EFF = "aten._scaled_dot_product_efficient_attention.default"
FLASH = "aten._scaled_dot_product_flash_attention.default"
CUDNN = "aten._scaled_dot_product_cudnn_attention.default"
TOL = {torch.float16: (5e-3, 5e-3), torch.bfloat16: (2e-2, 3e-2), torch.float32: (1e-4, 1e-4)}
# (B, H, L, S, E, Ev): square, L > S, L < S, more than 32 rows (the padded logsumexp)
SHAPES = [(2, 3, 5, 5, 64, 64), (1, 2, 7, 3, 32, 32), (1, 2, 3, 9, 16, 8), (1, 1, 40, 40, 64, 64),
          (1, 2, 6, 16, 64, 64), (1, 2, 16, 8, 64, 64)]


def _decomposed(op: str, sample: Sample, returns: list[int] | None) -> list[Any]:
    d, inputs = decomposed(op, sample, False, returns)
    return Interpreter(d).run([x.clone() if isinstance(x, torch.Tensor) else x
                               for x in inputs]).outputs


def _close(got: torch.Tensor, want: torch.Tensor, tol: tuple[float, float]) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1], equal_nan=True)


def _inputs(dt: torch.dtype, shape: tuple[int, ...], masked: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    B, H, L, S, E, Ev = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(*s, device="cuda", dtype=dt, generator=g)
               for s in ((B, H, L, E), (B, H, S, E), (B, H, S, Ev)))
    if not masked:
        return q, k, v, None
    bias = torch.randn(B, H, L, S, device="cuda", dtype=dt, generator=g)
    bias[..., 0, :] = -math.inf  # a fully masked row
    bias[..., 1:, 0] = -math.inf
    return q, k, v, bias


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mode", ["plain", "causal", "bias"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_fused_attention_matches_the_cuda_kernels(dt: torch.dtype, shape: tuple[int, ...],
                                                  mode: str, scale: float | None) -> None:
    if mode == "bias" and shape[3] % 8:
        pytest.skip("the kernels need the bias rows aligned to 8 elements")
    q, k, v, bias = _inputs(dt, shape, mode == "bias")
    causal = mode == "causal"
    kw = {"is_causal": causal, "scale": scale}
    tol = TOL[dt]
    for with_lse in (True, False):
        want = aten._scaled_dot_product_efficient_attention(q, k, v, bias, with_lse, 0.0,
                                                            causal, scale=scale)
        got = _decomposed(EFF, Sample((q, k, v, bias, with_lse), kw), None)
        _close(got[0], want[0], tol)
        _close(got[1], want[1], (1e-4, 1e-4))
    if dt == torch.float32:
        return  # flash and cuDNN take f16/bf16
    want = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True, 0.0, causal,
                                                    scale=scale)
    got = _decomposed(CUDNN, Sample((q, k, v, bias, True), kw), [0, 1])
    _close(got[0], want[0], tol)
    _close(got[1], want[1], (1e-4, 1e-4))
    if bias is not None or shape[4] != shape[5]:
        return  # flash takes no mask, and one head dim
    want = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, scale=scale)
    got = _decomposed(FLASH, Sample((q, k, v), kw), [0, 1])
    _close(got[0], want[0], tol)
    _close(got[1], want[1], (1e-4, 1e-4))


# ---- the CUDA target keeps the fused op whole (targets/cuda/attention.py) -------------------

HEADS, D = 4, 64


def _layer(causal: bool, masked: bool) -> Any:
    """Queries from x, keys and values from mem (a decode step: fewer queries than keys), sdpa,
    heads merged, projected: what the CUDA target compiles around the kept attention op."""
    import torch.nn.functional as F

    def f(x: torch.Tensor, mem: torch.Tensor, wq: torch.Tensor, wkv: torch.Tensor,
          o: torch.Tensor, *mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        s = mem.shape[1]
        q = (x @ wq).reshape(b, t, HEADS, D // HEADS).transpose(1, 2)
        k, v = ((u.reshape(b, s, HEADS, D // HEADS).transpose(1, 2))
                for u in (mem @ wkv).split(D, -1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if masked else None,
                                           is_causal=causal)
        return y.transpose(1, 2).reshape(b, t, D) @ o
    return f


@pytest.mark.parametrize("case", ["plain", "causal", "mask16", "mask7", "decode7"])
def test_compiled_attention_is_one_torch_kernel_and_matches_eager(case: str) -> None:
    import ember.inductor  # noqa: F401
    from ember.capture import capture
    from ember.inductor.backend import compiled_runner
    from ember.inductor.targets.cuda import FRONT
    from ember.inductor.targets.cuda.attention import HEADS_LAST
    from ember.ir.passes import run_pipeline

    S = 7 if case.endswith("7") else 16
    L = 1 if case.startswith("decode") else S
    masked = case.startswith(("mask", "decode"))
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, device="cuda", dtype=dt, generator=g) * 0.3
    args = [r(2, L, D), r(2, S, D), r(D, D), r(D, 2 * D), r(D, D)]
    if masked:
        args.append(r(2, 1, L, S))
    f = _layer(case == "causal", masked)
    with torch.no_grad():
        c = capture(f, tuple(args), {})
        assert c.module is not None
        m = run_pipeline(c.module, f"{FRONT},inductor-cuda")
        ops = [n.kwargs.get("op") for gr in m.graphs.values() for n in gr.nodes]
        assert HEADS_LAST in ops, sorted({str(o) for o in ops})
        got = compiled_runner(m)(None, args).outputs[0]
        want = f(*args)
    # the captured graph returns the product's [B*L, D] matrix (the model's reshape is a view
    # the runtime applies outside the graph)
    _close(got.reshape(want.shape), want, TOL[dt])
