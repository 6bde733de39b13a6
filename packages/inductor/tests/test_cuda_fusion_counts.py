"""How many kernels the CUDA target makes of a transformer block (issue 16: fewer, fatter
Triton kernels), and that the fused kernels compute what eager does.

The graphs are captured here, retyped onto cuda:0 and compiled by `inductor-cuda` (code
generation only, no GPU): the counts are of Triton kernels. `matmul-lowp` keeps a linear's GEMM
in f16/bf16 (no upcast copy kernels of the activation and the weight), `fuse-shared` computes
each residual add in the next layernorm's kernel. Numerics run the same passes in Triton's
interpreter (`inductor-cuda-interpret`, f32 and f16: the interpreter's bf16 arithmetic is
wrong) against eager.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor
import ember.inductor.targets.cuda  # noqa: F401  (the inductor-cuda pipelines)
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.inductor.targets import Target
from ember.ir import DType, Module, parse
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY

_TYPE = re.compile(r"((?:f16|bf16|f32|f64|i8|i16|i32|i64|u8|b8)\[[^\]]*\](?:\{[^}]*\})?)(?!@)")
FRONT = "decompose,cse,dce"


class Block(nn.Module):
    """A pre-layernorm GPT block: attention as matmul + softmax + matmul (no fused kernel)."""

    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (u.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for u in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1 / math.sqrt(d // self.heads)), -1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def residual_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                  m: torch.Tensor) -> torch.Tensor:
    """The residual stream's add, its layernorm, a product, and the sum read again after it
    (so the add's two readers cannot merge horizontally)."""
    h = x + r
    y = F.layer_norm(h, (h.shape[-1],), w, b)
    return (y @ m) + h


def on_cuda(fn: Callable[..., Any], *args: torch.Tensor, passes: str = "inductor-cuda"
            ) -> Module:
    """fn captured here, retyped onto cuda:0, through `passes` (code generation only)."""
    with torch.no_grad():
        c = capture(fn, args, {})
    assert c.module is not None
    return run_pipeline(parse(_TYPE.sub(r"\1@cuda:0", str(c.module))), f"{FRONT},{passes}")


def triton_kernels(m: Module) -> int:
    calls = [n for g in m.graphs.values() for n in g.nodes if n.op == "kernels.call"]
    assert not [n for g in m.graphs.values() for n in g.nodes if n.op.startswith("loop.")]
    return len(calls)


def interpreted(fn: Callable[..., Any], *args: torch.Tensor) -> list[torch.Tensor]:
    """fn's outputs through inductor-cuda-interpret's Triton kernels (on cpu tensors)."""
    with torch.no_grad():
        c = capture(fn, args, {})
    m = run_pipeline(c.module, f"{FRONT},inductor-cuda-interpret")  # type: ignore[union-attr]
    load_module(m)
    return list(compiled_runner(m)(None, list(args)).outputs)


def test_transformer_block_kernel_count() -> None:
    torch.manual_seed(0)
    model = Block().eval().half()
    m = on_cuda(model, torch.randn(2, 8, 32).half())
    # ln1 (+ the input's upcast), qkv bias, q/v and k head copies for the batched GEMMs, softmax,
    # the heads' merge copy, residual + ln2, bias + gelu, the last residual (the output):
    # without matmul-lowp and fuse-shared it was 17 (8 upcast copies, 2 residual kernels)
    assert triton_kernels(m) == 9
    mms = [n for g in m.graphs.values() for n in g.nodes
           if n.op == "kernels.extern" and n.kwargs.get("op") == "prims.matmul"]
    assert len(mms) == 6
    # every GEMM runs in f16 (the linears' and attention's)
    assert all(n.results[0].type.dtype == DType.f16 for n in mms)  # type: ignore[union-attr]


def test_residual_add_computed_by_the_layernorm_kernel() -> None:
    x, r, w, b, mm = (torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), torch.randn(16),
                      torch.randn(16, 16))
    m = on_cuda(residual_norm, x, r, w, b, mm)
    assert triton_kernels(m) == 2  # residual + layernorm; the last add after the product
    without = on_cuda(residual_norm, x, r, w, b, mm, passes=(
        "matmul-lowp,dce,lower-loops,fuse,schedule-cuda,codegen-triton,plan-buffers"))
    assert triton_kernels(without) == 3
    fused = on_cuda(residual_norm, x, r, w, b, mm, passes="lower-loops,fuse,fuse-shared")
    multi = [n for g in fused.graphs.values() for n in g.nodes
             if n.op == "loop.pointwise" and len(n.results) == 2]
    assert len(multi) == 1  # the layernorm's kernel returns the sum as its second result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_residual_layernorm_matches_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    args = [torch.randn(4, 16, dtype=dtype) for _ in range(2)] + \
        [torch.randn(16, dtype=dtype) for _ in range(2)] + [torch.randn(16, 16, dtype=dtype)]
    (got,) = interpreted(residual_norm, *args)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, residual_norm(*args), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_transformer_block_matches_eager(triton_on_cpu: Target, dtype: torch.dtype) -> None:
    from ember.runtime import compile as ember_compile
    torch.manual_seed(2)
    model = Block().eval().to(dtype)
    x = torch.randn(2, 8, 32, dtype=dtype)
    cf = ember_compile(model, dynamic=False)
    with torch.no_grad():
        got = cf(x)
        want = model(x)
    cm = getattr(cf, "compiled", cf)
    assert not cm.history.fallbacks
    assert {k.lang for k in cm._last_compiled.kernels.values()} == {"triton"}
    with torch.no_grad():  # f16 GEMMs round once more than eager's addmm: an f32 reference
        ref = model.float()(x.float())
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    else:
        # the f16 product rounded before its bias add: within a few f16 ulps of eager's
        err = (got.float() - ref).norm() / ref.norm()
        err_eager = (want.float() - ref).norm() / ref.norm()
        assert err < 3 * err_eager + 1e-3, (float(err), float(err_eager))


def test_matmul_lowp_keeps_attention_scores_f32() -> None:
    """A product read by a softmax in f32 keeps its f32 GEMM; a linear's product is f16."""
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        s = F.linear(x, w, b).float() @ x.float().transpose(0, 1)
        return torch.softmax(s, -1)
    x, w, b = torch.randn(8, 16).half(), torch.randn(16, 16).half(), torch.randn(16).half()
    m = on_cuda(f, x, w, b, passes="matmul-lowp,dce")
    mms = [n.results[0].type.dtype for g in m.graphs.values() for n in g.nodes  # type: ignore
           if n.op == "prims.matmul"]
    assert sorted(d.name for d in mms) == ["f16", "f32"]


def projections(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
    """Separate q, k, v products with their own epilogues: the three pointwise kernels share no
    input (fuse's horizontal rule 3 needs one)."""
    return tuple(torch.relu(x @ w) * (k + 1) for k, w in enumerate((wq, wk, wv)))


def test_independent_pointwise_kernels_merge() -> None:
    args = [torch.randn(4, 8)] + [torch.randn(8, 8) for _ in range(3)]
    assert triton_kernels(on_cuda(projections, *args)) == 1
    apart = "lower-loops,fuse,fuse-shared{independent=false},schedule-cuda,codegen-triton"
    assert triton_kernels(on_cuda(projections, *args, passes=apart)) == 3
    for a, e in zip(interpreted(projections, *args), projections(*args), strict=True):
        torch.testing.assert_close(a, e)


def test_linear_on_3d_input_is_one_f16_gemm_and_its_epilogue(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A linear on [B, T, K] (the input reshaped, the weight transposed: views between the
    upcast and the product): the GEMM in f16, the bias + gelu epilogue the only kernel."""
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, w, b))
    args = (torch.randn(2, 4, 16).half(), torch.randn(8, 16).half(), torch.randn(8).half())
    m = on_cuda(f, *args)
    assert triton_kernels(m) == 1
    mms = [n for g in m.graphs.values() for n in g.nodes
           if n.op == "kernels.extern" and n.kwargs.get("op") == "prims.matmul"]
    assert [n.results[0].type.dtype for n in mms] == [DType.f16]  # type: ignore[union-attr]
    before = on_cuda(f, *args, passes="lower-loops,fuse,schedule-cuda,codegen-triton")
    assert triton_kernels(before) == 3  # the input's and the weight's f32 copies
    on_cuda(lambda x, w: F.linear(x, w).float().softmax(-1) @ w.float(),
            args[0], args[1], passes="matmul-lowp{explain=true}")
    assert "kept in f32: an operand is not an upcast" in capsys.readouterr().err


# a weight's gradient as the backward of a bf16/f16 linear computes it: the upcast operands'
# f32 product, rounded straight back (no epilogue between)
ROUNDED_BACK = """ember.ir 1.0

graph @f(%g: f16[8, 4]{dev}, %x: f16[8, 16]{dev}) -> (f16[4, 16]{dev}) {{
  %gt = prims.permute(%g, dims=[1, 0]) : f16[4, 8]{dev}
  %g32 = prims.convert_element_type(%gt, dtype=f32) : f32[4, 8]{dev}
  %x32 = prims.convert_element_type(%x, dtype=f32) : f32[8, 16]{dev}
  %p = prims.matmul(%g32, %x32) : f32[4, 16]{dev}
  %r = prims.convert_element_type(%p, dtype=f16) : f16[4, 16]{dev}
  return (%r)
}}
"""


def test_a_product_rounded_straight_back_is_the_gemms_own_result() -> None:
    """The f32 product of upcasts rounded straight back to f16: the f16 GEMM's result is the
    value itself (bf16/f16 -> f32 -> back is exact), no copy kernel rounding it into a second
    buffer; with interpreted kernels, eager's product."""
    m = run_pipeline(parse(ROUNDED_BACK.format(dev="@cuda:0")), "inductor-cuda")
    assert triton_kernels(m) == 0
    (g,) = m.graphs.values()
    (mm,) = [n for n in g.nodes if n.op == "kernels.extern"]
    assert mm.results[0].type.dtype == DType.f16  # type: ignore[union-attr]
    assert g.outputs[0] in mm.results
    cpu = run_pipeline(parse(ROUNDED_BACK.format(dev="")), "inductor-cuda-interpret")
    load_module(cpu)
    gr, x = torch.randn(8, 4).half(), torch.randn(8, 16).half()
    (got,) = compiled_runner(cpu)(None, [gr, x]).outputs
    torch.testing.assert_close(got, (gr.float().T @ x.float()).half())
