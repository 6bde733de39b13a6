"""One kernel for a decode step's attention against a static KV cache (the CUDA target).

After `cache-inplace` a decode step's attention layer is three launches: the new key row and
the new value row written into the caches (`index_copy_`, one each) and torch's fused attention
(cuDNN or the memory-efficient kernel) of the one query row against the caches. The work is
tiny (batch x heads programs, each a [S, E] slab of each cache) and launch latency dominates.
`decode_attention_` does all three in one Triton kernel, one program per (batch, head): it
stores the head's new key and value rows at the step's position, then runs an online softmax
over the cache in blocks of keys, the new rows taken from registers at their position (no
store-then-load within the program), scores in f32 with the additive bias, and writes the
[B, H, 1, E] output.

Numerics: scores, softmax and the weighted sum in f32 as torch's fused kernels do; the output
rounded once to the cache dtype. A row whose every key is masked gives NaN (0/0), as eager's
math attention does. A position outside the cache (a static cache run past its length) writes
nothing, where eager's index_copy_ raises: reading it back would cost a sync per step.

`decode_attention_` runs the Triton kernel on CUDA tensors (and on CPU tensors in Triton's
interpreter, TRITON_INTERPRET=1, or with `triton=True`); otherwise the same computation in torch
(index_copy_ and scaled_dot_product_attention), the reference the tests compare with.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention_kernel(  # type: ignore[no-untyped-def]
            q_ptr, kc_ptr, vc_ptr, kn_ptr, vn_ptr, pos_ptr, bias_ptr, out_ptr, cos_ptr, sin_ptr,
            H, E, scale,
            sq_b, sq_h, sq_e, sk_b, sk_h, sk_s, sk_e, sv_b, sv_h, sv_s, sv_e,
            skn_b, skn_h, skn_e, svn_b, svn_h, svn_e, sb_b, sb_h, sb_s, so_b, so_h, so_e,
            S: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_S: tl.constexpr,
            BLOCK_E: tl.constexpr, PDL: tl.constexpr, ROT: tl.constexpr):
        pid = tl.program_id(0)
        if PDL:  # the next kernel (a GEMV's launch, gemv_group.PDL) may start its weight loads
            tl.extra.cuda.gdc_launch_dependents()
        b = pid // H
        h = pid % H
        pos = tl.load(pos_ptr)
        e = tl.arange(0, BLOCK_E)
        em = e < E
        kn = tl.load(kn_ptr + b * skn_b + h * skn_h + e * skn_e, mask=em, other=0.0)
        vn = tl.load(vn_ptr + b * svn_b + h * svn_h + e * svn_e, mask=em, other=0.0)
        q = tl.load(q_ptr + b * sq_b + h * sq_h + e * sq_e, mask=em, other=0.0)
        if ROT > 0:  # GPT-NeoX rotary on the first ROT dims of q and k, eager's roundings
            half = ROT // 2
            rm = e < ROT
            other = tl.where(e < half, e + half, e - half)
            sign = tl.where(e < half, -1.0, 1.0)
            c = tl.load(cos_ptr + e, mask=rm, other=0.0).to(tl.float32)
            sn = tl.load(sin_ptr + e, mask=rm, other=0.0).to(tl.float32)
            q2 = tl.load(q_ptr + b * sq_b + h * sq_h + other * sq_e, mask=rm, other=0.0)
            k2 = tl.load(kn_ptr + b * skn_b + h * skn_h + other * skn_e, mask=rm, other=0.0)
            # each product and the sum rounded to bf16 to nearest-even in integer arithmetic
            # (Triton's interpreter truncates a bf16 cast: the tests compare bit for bit)
            t1 = (q.to(tl.float32) * c).to(tl.int32, bitcast=True)
            t2 = (q2.to(tl.float32) * sign * sn).to(tl.int32, bitcast=True)
            t3 = (kn.to(tl.float32) * c).to(tl.int32, bitcast=True)
            t4 = (k2.to(tl.float32) * sign * sn).to(tl.int32, bitcast=True)
            t1 = ((t1 + 0x7FFF + ((t1 >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            t2 = ((t2 + 0x7FFF + ((t2 >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            t3 = ((t3 + 0x7FFF + ((t3 >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            t4 = ((t4 + 0x7FFF + ((t4 >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            u1 = (t1 + t2).to(tl.int32, bitcast=True)
            u2 = (t3 + t4).to(tl.int32, bitcast=True)
            qr = ((u1 + 0x7FFF + ((u1 >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            kr = ((u2 + 0x7FFF + ((u2 >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            qr = qr.to(kn.dtype)  # exact: qr holds a bf16 value
            kr = kr.to(kn.dtype)
            q = tl.where(rm, qr, q)
            kn = tl.where(rm, kr, kn)
        # the new rows into the caches (this head's slot at pos; never outside the cache)
        pe = pos + tl.zeros_like(e)  # block-shaped: a scalar & block mask is not a bool block in every Triton
        inside = em & (pe >= 0) & (pe < S)
        tl.store(kc_ptr + b * sk_b + h * sk_h + pos * sk_s + e * sk_e, kn, mask=inside)
        tl.store(vc_ptr + b * sv_b + h * sv_h + pos * sv_s + e * sv_e, vn, mask=inside)
        q = q.to(tl.float32)
        knf = kn.to(tl.float32)
        vnf = vn.to(tl.float32)
        m_i = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), 0)
        l_i = tl.sum(tl.zeros([BLOCK_S], tl.float32), 0)
        acc = tl.zeros([BLOCK_E], tl.float32)
        for s0 in range(0, S, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            sm = s < S
            mask2 = sm[:, None] & em[None, :]
            at = (s == pos)[:, None]
            k = tl.load(kc_ptr + b * sk_b + h * sk_h + s[:, None] * sk_s + e[None, :] * sk_e,
                        mask=mask2, other=0.0).to(tl.float32)
            k = tl.where(at, knf[None, :], k)
            scores = tl.sum(k * q[None, :], 1) * scale
            if HAS_BIAS:
                scores += tl.load(bias_ptr + b * sb_b + h * sb_h + s * sb_s, mask=sm,
                                  other=0.0).to(tl.float32)
            scores = tl.where(sm, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 0))
            # a block (or a prefix) all -inf: keep the zero weights, not exp(nan)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(scores - m_safe)
            alpha = tl.exp(m_i - m_safe)
            v = tl.load(vc_ptr + b * sv_b + h * sv_h + s[:, None] * sv_s + e[None, :] * sv_e,
                        mask=mask2, other=0.0).to(tl.float32)
            v = tl.where(at, vnf[None, :], v)
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            m_i = m_new
        out = acc / l_i
        tl.store(out_ptr + b * so_b + h * so_h + e * so_e,
                 out.to(out_ptr.dtype.element_ty), mask=em)

    return decode_attention_kernel


def _use_triton(x: torch.Tensor, triton: bool | None) -> bool:
    if triton is not None:
        return triton
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's rotary embedding of the first R = cos.numel() dims of x [.., E] (the rest
    passed through) with eager's roundings: each product and the sum rounded to x's dtype."""
    r = cos.numel()
    c, s = cos.reshape(r).float(), sin.reshape(r).float()
    a, rest = x[..., :r], x[..., r:]
    rot = torch.cat([-a[..., r // 2:], a[..., :r // 2]], -1)
    out = ((a.float() * c).to(x.dtype).float() + (rot.float() * s).to(x.dtype).float())
    return torch.cat([out.to(x.dtype), rest], -1)


def decode_attention_(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                      k_new: torch.Tensor, v_new: torch.Tensor, bias: torch.Tensor | None,
                      scale: float | None = None, *, triton: bool | None = None,
                      rope: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> torch.Tensor:
    """kc[:, :, pos] = k_new; vc[:, :, pos] = v_new (in place); then the attention of q
    [B, H, 1, E] over kc, vc [B, H, S, E] with the additive bias (broadcastable to
    [B, H, 1, S]); returns the [B, H, 1, E] output. `pos`: one position (a 1-element tensor).
    `rope` (cos, sin), each R values (R even, <= E): q and k_new are first rotated as
    `rotary` does (GPT-NeoX's partial rotary), in the kernel."""
    B, H, S, E = kc.shape
    if q.shape != (B, H, 1, E) or k_new.shape != (B, H, 1, E) or v_new.shape != (B, H, 1, E) \
            or vc.shape != kc.shape or pos.numel() != 1:
        raise ValueError(f"decode_attention_: q, k_new, v_new [B, H, 1, E] = {[B, H, 1, E]} "
                         f"and one position, got q {list(q.shape)}, k_new "
                         f"{list(k_new.shape)}, v_new {list(v_new.shape)}, cache "
                         f"{list(kc.shape)}/{list(vc.shape)}, {pos.numel()} positions")
    sc = 1.0 / math.sqrt(E) if scale is None else float(scale)
    rot = 0
    if rope is not None:
        rot = rope[0].numel()
        if kc.dtype != torch.bfloat16:
            raise ValueError(f"decode_attention_: rope takes bf16 caches (its roundings are "
                             f"bf16's), got {kc.dtype}")
        if rot % 2 or rot > E or rope[1].numel() != rot:
            raise ValueError(f"decode_attention_: rope's cos and sin must be R values, R even "
                             f"and <= {E}, got {rope[0].numel()} and {rope[1].numel()}")
    if not _use_triton(kc, triton):
        if rope is not None:
            q, k_new = rotary(q, *rope), rotary(k_new, *rope)
        kc.index_copy_(2, pos.reshape(1), k_new)
        vc.index_copy_(2, pos.reshape(1), v_new)
        return torch.nn.functional.scaled_dot_product_attention(
            q, kc, vc, attn_mask=bias, scale=sc)
    out = torch.empty((B, H, 1, E), dtype=q.dtype, device=q.device)
    bb = bias.expand(B, H, 1, S) if bias is not None else None
    bstr = (bb.stride(0), bb.stride(1), bb.stride(3)) if bb is not None else (0, 0, 0)
    block_e = max(16, 1 << (E - 1).bit_length())
    # one program per head walks the cache serially: long caches take bigger blocks and more
    # warps (the loads of a block are what is in flight)
    block_s = max(16, min(256, 1 << (S - 1).bit_length()))
    warps = 8 if block_s * block_e >= 128 * 128 else 4
    from ember.inductor.targets.cuda.gemv_group import PDL
    pdl = PDL and kc.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"
    _kernel()[(B * H,)](
        q, kc, vc, k_new, v_new, pos, bb if bb is not None else q, out,
        *((rope[0].reshape(-1).contiguous(), rope[1].reshape(-1).contiguous())
          if rope is not None else (q, q)), H, E, sc,
        q.stride(0), q.stride(1), q.stride(3), *kc.stride(), *vc.stride(),
        k_new.stride(0), k_new.stride(1), k_new.stride(3),
        v_new.stride(0), v_new.stride(1), v_new.stride(3), *bstr,
        out.stride(0), out.stride(1), out.stride(3),
        S=S, HAS_BIAS=bb is not None, BLOCK_S=block_s, BLOCK_E=block_e, PDL=pdl, ROT=rot,
        num_warps=warps)
    return out


__all__ = ["decode_attention_", "rotary"]
