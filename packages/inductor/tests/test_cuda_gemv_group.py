"""decode-gemv's grouping (CUDA target, targets/cuda/gemv_group.py, gemv_fused.py): a decode
step's GEMVs with their bias and erf-GELU epilogues, two to a launch.

Without a GPU: the kernels run in Triton's interpreter (TRITON_INTERPRET=1) with small shapes,
against eager torch (bf16 rounding tolerances); the pass on a tiny bf16 GPT-NeoX's decode step
(static cache, batch 1) through the CUDA pipeline with the CPU target's lowering rules for the
CUDA externs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import Captured
from ember.inductor.targets.cuda import gemv, gemv_group, inplace
from ember.inductor.targets.cuda.gemv_fused import gemv_pair, reference
from ember.ir import Module
from ember.ir.passes import run_pipeline
from ember.ir.registry import OpTypeError
from ember.testing.triton_mode import INTERPRETER_ONLY
from packages.inductor.tests.decode_steps import (
    cuda_rules_on_cpu,
    decode_front,
    last_decode_step,
    run_from,
    snapshot,
)

pytestmark = INTERPRETER_ONLY

BF = torch.bfloat16


def _r(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF)


@pytest.mark.parametrize(("k1", "n1", "k2", "n2", "eps"), [
    (300, 33, 130, 70, ("bias", "bias+gelu")), (64, 8, 64, 40, ("none", "gelu")),
    (200, 17, None, None, ("bias+gelu",))])
def test_gemv_pair_matches_eager(k1: int, n1: int, k2: int | None, n2: int | None,
                                 eps: tuple[str, ...]) -> None:
    """One launch of one or two products (K and N not multiples of the blocks, several K
    chunks), each within one bf16 rounding of eager's linear (+ GELU)."""
    segs: list[Any] = []
    for i, (k, n, e) in enumerate(zip((k1, k2), (n1, n2), eps)):
        assert k is not None and n is not None
        segs += [_r(1, k, seed=i), _r(n, k, seed=10 + i),
                 _r(n, seed=20 + i) if e.startswith("bias") else None,
                 "gelu" if e.endswith("gelu") else None]
    got = gemv_pair(*segs, blocks=tuple((4, 64, 4) for _ in eps))
    for j, y in enumerate(got):
        x, w, b, act = segs[4 * j:4 * j + 4]
        lin = torch.nn.functional.linear(x.float(), w.float(),
                                         b.float() if b is not None else None)
        want = torch.nn.functional.gelu(lin.to(BF).float()) if act else lin
        scale = float(want.abs().max())
        torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=scale * 1e-2)
        assert torch.equal(y, reference(x, w, b, act)) or float(
            (y.float() - reference(x, w, b, act).float()).abs().max()) <= scale * 1e-2


def test_bad_operands_are_clear_errors() -> None:
    x, w = _r(1, 30, seed=1), _r(8, 30, seed=2)
    with pytest.raises(ValueError, match="bias must be"):
        gemv_pair(x, w, _r(7, seed=3), None)
    with pytest.raises(ValueError, match="activation"):
        gemv_pair(x, w, None, "relu")
    with pytest.raises(OpTypeError, match="epilogues"):
        gemv_group._segments([], {"epilogues": ["tanh"]})


def _neox_step(monkeypatch: pytest.MonkeyPatch
               ) -> tuple[Captured, Any, tuple[Any, ...], dict[str, Any], Module]:
    """A tiny bf16 GPT-NeoX's last decode step (batch 1, static cache): its capture, the
    model's forward, the step's args and kwargs, and its module through the CUDA front up to
    decode-gemv; the CUDA externs' lowering rules on the CPU target for this test."""
    from ember.runtime.testing import tiny_hf_model
    cuda_rules_on_cpu(monkeypatch, {**gemv.LOWERINGS, **inplace.LOWERINGS})
    model: Any = tiny_hf_model("neox")[0].to(BF)
    ids = torch.randint(2, 100, (1, 5), generator=torch.Generator().manual_seed(1))
    c, real, args, kwargs = last_decode_step(model, ids, 3)
    return c, real, args, kwargs, decode_front(c)


PIPE = ("decode-gemv{group=true},lower-loops,fuse,fuse-shared,schedule-cuda,"
        "codegen-triton{interpret=true},plan-buffers")


def test_neox_decode_step_grouped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny bf16 GPT-NeoX's decode step: per layer two gemv_group launches (QKV + h_to_4h
    with its bias and GELU, dense + 4h_to_h, every bias absorbed) where group=false leaves four
    GEMVs; logits and the caches after the step within bf16 rounding of eager's."""
    pytest.importorskip("transformers")
    c, real, args, kwargs, front = _neox_step(monkeypatch)
    plain = run_pipeline(front, "decode-gemv{group=false}")
    assert sum(n.op == gemv.OP for n in plain.graph().nodes) == 2 * 4 + 1  # + the lm_head
    m = run_pipeline(front, PIPE)
    eps = [n.kwargs["epilogues"] for gr in m.graphs.values() for n in gr.nodes
           if n.op == "kernels.extern" and n.kwargs.get("op") == gemv_group.OP]
    assert eps == [["bias", "bias+gelu"], ["bias", "bias"]] * 2, eps
    assert [n.kwargs.get("op") for n in m.graph().nodes if n.op == "kernels.extern"
            and n.kwargs.get("op") == gemv.OP] == [gemv.OP]  # the lm_head: nothing to absorb
    # no kernel is left writing an absorbed value (the bias's f32 convert) nothing reads
    calls = sum(n.op == "kernels.call" for n in m.graph().nodes)
    ungrouped = run_pipeline(plain, PIPE.split(",", 1)[1])
    assert calls == sum(n.op == "kernels.call" for n in ungrouped.graph().nodes) - 2, calls
    ins = list(c.input_examples)
    snap = snapshot(ins)
    with torch.no_grad():
        want = real(*args, **kwargs).logits[:, -1].float()
    after = snapshot(ins)
    got = run_from(m, ins, snap)
    scale = float(want.abs().max())
    torch.testing.assert_close(got[0].reshape(want.shape).float(), want, rtol=0,
                               atol=scale * 0.05)
    for u in c.updates:  # the caches (new rows within bf16 rounding) and the lengths
        b = after[u.param]
        torch.testing.assert_close(got[u.result], b, rtol=0,
                                   atol=float(b.abs().max()) * 0.02 + 1e-6)


def test_neox_decode_step_rope_in_the_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode-gemv{rope=true}: the tiny bf16 NeoX's rotary of q and the new key row runs in the
    decode attention kernel (loop.decode_attention_rope, one Triton kernel fewer per layer);
    the caches within one bf16 rounding of the pipeline without it (the interpreter truncates
    a bf16 cast where the device rounds to nearest even, as the kernel's rotary does), the
    logits within bf16 rounding."""
    pytest.importorskip("transformers")
    from ember.inductor.targets.cuda import decode_rope
    c, real, args, kwargs, front = _neox_step(monkeypatch)
    mods = {r: run_pipeline(front, PIPE.replace("group=true", f"group=true,rope={r}"))
            for r in ("true", "false")}
    ext = {r: [n.kwargs.get("op") for n in m.graph().nodes if n.op == "kernels.extern"]
           for r, m in mods.items()}
    assert ext["true"].count(decode_rope.OP) == 2 and inplace.ATTENTION_OP not in ext["true"]
    calls = {r: sum(n.op == "kernels.call" for n in m.graph().nodes) for r, m in mods.items()}
    assert calls["true"] < calls["false"], calls
    ins = list(c.input_examples)
    snap = snapshot(ins)
    outs = {r: snapshot(run_from(m, ins, snap)) for r, m in mods.items()}
    for u in c.updates:
        a, b = outs["true"][u.result], outs["false"][u.result]
        torch.testing.assert_close(a, b, rtol=0, atol=float(b.abs().max()) * 2 ** -7 + 1e-6)
    with torch.no_grad():
        want = real(*args, **kwargs).logits[:, -1].float()
    torch.testing.assert_close(outs["true"][0].reshape(want.shape).float(), want, rtol=0,
                               atol=float(want.abs().max()) * 0.05)


@pytest.mark.parametrize("rot", [2, 6, 20])
def test_decode_attention_rope_caches_bit_for_bit(rot: int) -> None:
    """The kernel's rotary (decode_attention.py, rope=) against transformers' form in torch:
    the new key row written into the cache bit for bit, the output within bf16 rounding."""
    from ember.inductor.targets.cuda.decode_attention import decode_attention_
    g = torch.Generator().manual_seed(rot)
    kc, vc = (torch.randn(1, 3, 13, 20, generator=g).to(BF) for _ in range(2))
    q, kn, vn = (torch.randn(1, 3, 1, 20, generator=g).to(BF) for _ in range(3))
    cos, sin = (torch.randn(1, 1, rot, generator=g).to(BF) for _ in range(2))
    pos = torch.tensor([5])
    k1, v1, k2, v2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    want = decode_attention_(q, k1, v1, pos, kn, vn, None, triton=False, rope=(cos, sin))
    got = decode_attention_(q, k2, v2, pos, kn, vn, None, triton=True, rope=(cos, sin))
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="R even"):
        decode_attention_(q, k2, v2, pos, kn, vn, None, rope=(cos[..., :1], sin[..., :1]))


PAIR_IR = """ember.ir 1.0

graph @f(%x: bf16[1, 8], %w1: bf16[4, 8], %w2: bf16[6, 8], %c: bf16[1, 8], %i: i64[1], %s: bf16[1, 1]) -> (bf16[1, 4], bf16[1, 6]{extra}) {{
  %t1 = prims.permute(%w1, dims=[1, 0]) : bf16[8, 4]
  %y1 = prims.matmul(%x, %t1) : bf16[1, 4]
{write}  %u = prims.mul(%c, 2.0) : bf16[1, 8]
  %t2 = prims.permute(%w2, dims=[1, 0]) : bf16[8, 6]
  %y2 = prims.matmul(%u, %t2) : bf16[1, 6]
  return (%y1, %y2{ret})
}}
"""


def test_pairing_hoists_pure_nodes_but_never_above_an_in_place_write() -> None:
    """Two independent GEMVs become one launch, the second's input computation moved above the
    first; not when that computation reads a tensor an in-place op between them writes."""
    from ember.ir import parse
    plain = PAIR_IR.format(extra="", write="", ret="")
    m = run_pipeline(parse(plain), "decode-gemv{group=true}")
    ops = [n.op for n in m.graph().nodes]
    assert ops.count(gemv_group.OP) == 1 and gemv.OP not in ops, ops
    written = PAIR_IR.format(
        extra=", bf16[1, 8]", ret=", %c2",
        write="  %c2 = loop.index_copy_inplace(%c, %i, %s, dim=1) : bf16[1, 8]\n")
    m = run_pipeline(parse(written), "decode-gemv{group=true}")
    ops = [n.op for n in m.graph().nodes]
    assert gemv_group.OP not in ops and ops.count(gemv.OP) == 2, ops
