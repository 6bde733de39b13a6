"""CPU attention (targets/cpu/flash.py) with no heads, no queries or no keys: torch's kernel,
which flash.py falls back to there, divides by those sizes (SIGFPE: the process dies), so
such calls return eager SDPA's result without it (empty, or zeros where there are no keys).
Run in a child process, so that a crash fails this test alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHILD = r"""
import sys
import torch
import torch.nn.functional as F
from ember.inductor.targets.cpu import flash

torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(0)
for b, h, n, s, e in [(2, 0, 5, 7, 16), (2, 3, 0, 7, 16), (2, 3, 5, 0, 16), (0, 3, 5, 0, 8)]:
    for causal, mask in [(False, None), (True, None), (False, (1, 1, n, s)), (False, (b, h, n, s))]:
        q = torch.randn(b, h, n, e, generator=g)
        k, v = torch.randn(b, h, s, e, generator=g), torch.randn(b, h, s, e, generator=g)
        m = torch.randn(*mask, generator=g) if mask is not None else None
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)
        out, lse = flash.forward(q, k, v, 0.0, causal, attn_mask=m)
        torch.testing.assert_close(out, want)
        assert lse.shape == (b, h, n) and lse.dtype == torch.float32
        out, lse = flash.forward_heads_last(q, k, v, 0.0, causal, attn_mask=m)
        torch.testing.assert_close(out, want.transpose(1, 2))
        assert out.is_contiguous() and lse.shape == (b, n, h) and lse.is_contiguous()
print("ok")
"""


@pytest.mark.parametrize("threads", [1, 3])
def test_no_heads_queries_or_keys_match_eager_without_crashing(threads: int) -> None:
    r = subprocess.run([sys.executable, "-c", _CHILD, str(threads)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
