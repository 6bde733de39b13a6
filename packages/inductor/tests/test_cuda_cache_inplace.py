"""`cache-inplace` (CUDA target): a static KV cache's new rows written into the cache in place.

Without a GPU: graphs are captured on the CPU and run through `inductor-cuda-interpret` (Triton's
interpreter), with the CUDA target's lowering rule for the in-place op on the CPU target. The
runtime's `backend_module` says which results replace which inputs (`replaced_inputs`); the pass
then writes an index_copy's rows into the input itself (one extern, no scatter copy of the whole
cache, no write-back), where nothing else reads the input's old value. Checked against eager:
the values, the cache tensors after the call, and that the graph returns the cache itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
import ember.runtime as er
from ember.inductor.backend import compiled_runner
from ember.inductor.targets import Target, targets
from ember.inductor.targets.cuda import FRONT, inplace
from ember.ir import Module
from ember.ir.passes import run_pipeline
from ember.ir.registry import OpTypeError, default_registry
from ember.runtime.writeback import REPLACED_INPUTS, backend_module
from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.inductor.tests.decode_steps import (
    DECODE_FRONT,
    cache_inputs,
    cache_step,
    cache_step_reading_old,
    captured,
    check_cache_step,
    check_compiled_cache_calls,
    check_static_generate,
    cuda_rules_on_cpu,
    externs,
    last_decode_step,
    run_from,
    snapshot,
)

pytestmark = INTERPRETER_ONLY

@pytest.fixture
def cpu_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA target's lowering rule for the in-place op, on CPU graphs (this test only)."""
    monkeypatch.setitem(targets()["cpu"].lowerings, inplace.OP,
                        inplace.lower_inplace)


def compiled(fn: Any, args: tuple[torch.Tensor, ...]) -> Module:
    m = backend_module(captured(fn, args))
    assert m.graph().attrs[REPLACED_INPUTS] == [[0, 1]]
    return run_pipeline(m, f"{FRONT},inductor-cuda-interpret")


def test_rows_written_in_place_and_the_cache_returned(cpu_rules: None,
                                                      inplace_runs: list[bool]) -> None:
    args = cache_inputs()
    m = compiled(cache_step, args)
    ops = externs(m)
    assert ops.count(inplace.OP) == 1 and "prims.scatter" not in ops, ops
    check_cache_step(m, cache_step, args, in_place=True)
    assert inplace_runs == [True]


def test_kept_where_the_old_value_is_read(cpu_rules: None,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = cache_inputs()
    c = captured(cache_step_reading_old, args)
    m = run_pipeline(backend_module(c), f"{FRONT},cache-inplace{{explain=true}}")
    assert "the input's old value is read by other nodes" in capsys.readouterr().err
    assert not any(n.op == inplace.OP for n in m.graph().nodes)
    m = run_pipeline(backend_module(c), f"{FRONT},inductor-cuda-interpret")
    assert inplace.OP not in externs(m)
    check_cache_step(m, cache_step_reading_old, args, in_place=False)


def test_a_graph_without_replaced_inputs_stays_pure(cpu_rules: None) -> None:
    c = captured(cache_step, cache_inputs())
    m = run_pipeline(c.module.clone(), f"{FRONT},cache-inplace")  # input_updates: no promise
    assert not any(n.op == inplace.OP for n in m.graph().nodes)


@pytest.fixture
def triton_cpu(triton_on_cpu: Target, monkeypatch: pytest.MonkeyPatch) -> Target:
    monkeypatch.setitem(triton_on_cpu.lowerings, inplace.OP,
                        inplace.lower_inplace)
    return triton_on_cpu


def test_compile_updates_the_callers_cache_each_call(triton_cpu: Target,
                                                     inplace_runs: list[bool]) -> None:
    """Through compile(): each call writes its row into the caller's tensor (which the runtime's
    write-back then leaves alone), as eager does, call after call."""
    check_compiled_cache_calls(inplace_runs)


def test_static_cache_generate_matches_eager(triton_cpu: Target,
                                             inplace_runs: list[bool]) -> None:
    """A tiny GPT-NeoX's greedy generate() with a static cache: eager's tokens, each decode
    step writing its 2 layers x (keys, values) rows in place."""
    check_static_generate("neox", 4, inplace_runs)


def test_bad_operands_are_a_type_error() -> None:
    from ember.ir import VerificationError, parse, verify
    text = """ember.ir 1.0

graph @f(%x: f32[2, 6, 4], %i: i64[1], %s: f32[2, 2, 4]) -> (f32[2, 6, 4]) {
  %y = loop.index_copy_inplace(%x, %i, %s, dim=1) : f32[2, 6, 4]
  return (%y)
}
"""
    with pytest.raises(VerificationError, match=r"src must be f32\[2, 1, 4\]"):
        verify(parse(text))
    with pytest.raises(OpTypeError, match="dim= must be a dim of x"):
        inplace._infer(None, parse(text).graph().nodes[0].args, {"dim": 3})


DECODE = (f"{DECODE_FRONT},lower-loops,fuse,fuse-shared,schedule-cuda,"
          "codegen-triton{interpret=true},plan-buffers")


def test_decode_attention_one_kernel_matches_eager(cpu_rules: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """cache-inplace{attention=true} on a tiny GPT-NeoX's decode step (static cache, its CPU
    attention in the CUDA form): per layer one decode-attention extern (no index_copy_, no
    torch attention); logits and the caches after the step are eager's."""
    pytest.importorskip("transformers")
    from ember.inductor.targets.cuda.attention import cuda_form_of_cpu_attention
    from ember.runtime.testing import tiny_hf_model
    cuda_rules_on_cpu(monkeypatch, {inplace.ATTENTION_OP: inplace.lower_decode_attention})
    model: Any = tiny_hf_model("neox")[0]
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    c, real, args, kwargs = last_decode_step(model, ids, 4)
    m = run_pipeline(cuda_form_of_cpu_attention(backend_module(c)), f"{FRONT},{DECODE}")
    ops = externs(m)
    assert ops.count(inplace.ATTENTION_OP) == 2, ops  # one per layer
    assert inplace.OP not in ops and not any("attention" in o and o != inplace.ATTENTION_OP
                                             for o in ops), ops
    short = run_pipeline(cuda_form_of_cpu_attention(backend_module(c)),
                         f"{FRONT},cache-inplace{{attention=true,attention_max_len=4}}")
    assert not any(n.op == inplace.ATTENTION_OP for n in short.graph().nodes)  # 8 rows > 4
    ins = list(c.input_examples)
    snap = snapshot(ins)
    with torch.no_grad():
        want = real(*args, **kwargs).logits[:, -1]
    after = snapshot(ins)
    got = run_from(m, ins, snap)
    torch.testing.assert_close(got[0].reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    in_place = 0
    for p, r in ((u.param, u.result) for u in c.updates):
        # the caches are written in place (the graph returns them); the lengths are new values
        in_place += got[r] is ins[p]
        torch.testing.assert_close(got[r], after[p], rtol=1e-5, atol=1e-5)
    assert in_place == 4  # 2 layers x (keys, values)


@pytest.mark.parametrize(("dtype", "S", "bias"), [
    (torch.float32, 10, "mask"), (torch.bfloat16, 37, None), (torch.bfloat16, 70, "per-head")])
def test_decode_attention_kernel_matches_torch(dtype: torch.dtype, S: int,
                                               bias: str | None) -> None:
    """The Triton kernel (interpreted) against index_copy_ + eager sdpa: the caches bit for
    bit, the output within the dtype's rounding (keys in several blocks of 16..64)."""
    from ember.inductor.targets.cuda.decode_attention import decode_attention_
    g = torch.Generator().manual_seed(S)
    kc, vc = (torch.randn(2, 3, S, 20, generator=g).to(dtype) for _ in range(2))
    q, kn, vn = (torch.randn(2, 3, 1, 20, generator=g).to(dtype) for _ in range(3))
    pos = torch.tensor([S // 2])
    b = None
    if bias == "mask":  # a padding mask as transformers passes it: [B, 1, 1, S], 0 or -inf
        b = torch.where(torch.arange(S) <= S // 2, 0.0, float("-inf")).to(dtype)
        b = b.expand(2, 1, 1, S)
    elif bias == "per-head":
        b = torch.randn(2, 3, 1, S, generator=g).to(dtype)
    k1, v1, k2, v2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    want = decode_attention_(q, k1, v1, pos, kn, vn, b, triton=False)
    got = decode_attention_(q, k2, v2, pos, kn, vn, b, triton=True)
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="one position"):
        decode_attention_(q, k2, v2, torch.tensor([1, 2]), kn, vn, b)


GEMV_IR = """ember.ir 1.0

graph @f(%x: bf16[1, 300], %w: bf16[33, 300]) -> (bf16[1, 33]) {
  %t = prims.permute(%w, dims=[1, 0]) : bf16[300, 33]
  %y = prims.matmul(%x, %t) : bf16[1, 33]
  return (%y)
}
"""


def test_decode_gemv_matches_cublas_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode-gemv: a one-row product against a transposed weight becomes the Triton GEMV
    extern (interpreted here; K not a multiple of the block, N not either), torch.mm's
    values within bf16 rounding."""
    from ember.inductor.targets.cuda import gemv
    from ember.ir import parse
    monkeypatch.setitem(targets()["cpu"].lowerings, gemv.OP,
                        gemv.lower_gemv)
    m = run_pipeline(parse(GEMV_IR), "decode-gemv,dce,lower-loops,fuse,schedule-cuda,"
                     "codegen-triton{interpret=true},plan-buffers")
    assert externs(m) == [gemv.OP]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 300, generator=g).to(torch.bfloat16)
    w = torch.randn(33, 300, generator=g).to(torch.bfloat16)
    got = compiled_runner(m)(None, [x, w]).outputs[0]
    torch.testing.assert_close(got, torch.mm(x, w.t()), rtol=2e-2, atol=5e-2)


def test_decode_gemv_only_under_cuda_graph_modes(triton_cpu: Target,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """compile() adds decode-gemv under mode="reduce-overhead" (launch cost hidden by the CUDA
    graph), not in the default mode; the values are torch's either way."""
    from ember.inductor.targets.cuda import gemv
    monkeypatch.setitem(triton_cpu.lowerings, gemv.OP, gemv.lower_gemv)
    reg = default_registry()
    real = reg.lookup(gemv.OP)
    assert real is not None
    ran: list[int] = []

    def run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
        ran.append(1)
        return real.reference(interp, args, kw)
    monkeypatch.setattr(reg, "lookup", lambda name: dataclasses.replace(real, reference=run)
                        if name == gemv.OP else type(reg).lookup(reg, name))
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 300, generator=g).to(torch.bfloat16)
    w = torch.randn(33, 300, generator=g).to(torch.bfloat16)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w.t()
    for mode, uses in ((None, False), ("reduce-overhead", True)):
        ran.clear()
        got = er.compile(f, mode=mode)(x, w)
        torch.testing.assert_close(got, f(x, w), rtol=2e-2, atol=5e-2)
        assert bool(ran) == uses, mode


OUTER_IR = """ember.ir 1.0

graph @f(%a: f32[2, 10, 1], %b: f32[2, 1, 5]) -> (f32[2, 10, 5]) {
  %y = prims.matmul(%a, %b) : f32[2, 10, 5]
  %z = prims.cos(%y) : f32[2, 10, 5]
  return (%z)
}
"""


def test_decode_gemv_makes_a_contraction_of_one_a_multiply() -> None:
    """transformers' rotary `inv_freq @ position_ids` (K = 1): a broadcast multiply fused into
    its reader (no GEMM launch), bit for bit torch's product."""
    from ember.ir import parse
    m = run_pipeline(parse(OUTER_IR), "decode-gemv,dce,lower-loops,fuse,schedule-cuda,"
                     "codegen-triton{interpret=true},plan-buffers")
    assert externs(m) == []
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(2, 10, 1, generator=g), torch.randn(2, 1, 5, generator=g)
    got = compiled_runner(m)(None, [a, b]).outputs[0]
    torch.testing.assert_close(got, torch.cos(a @ b))
