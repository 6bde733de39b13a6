"""A torch operator whose real kernel leaves results undefined (None) where its meta kernel
returns tensors (issue 20): the node's results are the meta kernel's, so the reference must
answer with exactly those. On the H200 (torch 2.11) cuDNN attention without
compute_log_sumexp returned no logsumexp and the eager backend's interpreter failed with
"returned 5 results, the node declares 6". A custom op stands in for it on the CPU."""

from __future__ import annotations

import pytest
import torch

from ember.ir import parse, run_graph, verify

_LIB = torch.library.Library("ember_undef_results", "DEF")  # noqa: TOR901  (a test-only op)
_LIB.define("fused(Tensor q, bool want_lse) -> "
            "(Tensor out, Tensor lse, Tensor cum, SymInt n, Tensor seed, Tensor extra)")


def _cpu(q: torch.Tensor, want_lse: bool) -> tuple[object, ...]:
    # like cuDNN attention's: lse only when asked, no cumulative lengths, no rng state; and a
    # result only the real kernel fills (the meta kernel says None)
    lse = q.sum(-1, keepdim=True) if want_lse else None
    return q * 2, lse, None, q.shape[0], None, q + 1


META_CALLS: list[tuple[int, ...]] = []


def _meta(q: torch.Tensor, want_lse: bool) -> tuple[object, ...]:
    META_CALLS.append(tuple(q.shape))
    return (torch.empty_like(q), q.new_empty((*q.shape[:-1], 1)), None, q.shape[0],
            torch.empty((), dtype=torch.long, device="meta"), None)


_LIB.impl("fused", _cpu, "CPU")
_LIB.impl("fused", _meta, "Meta")

_TEXT = """ember.ir 1.0

graph @f(%q: f32[3, 2]) -> (f32[3, 2], f32[3, 1], i64[]) {
  %o, %l, %n, %s = ember_undef_results.fused.default(%q, WANT) : (f32[3, 2], f32[3, 1], i64, i64[])
  return (%o, %l, %s)
}
"""


@pytest.mark.parametrize("want_lse", [False, True])
def test_results_follow_the_meta_kernel_whatever_the_real_kernel_leaves_undefined(
        want_lse: bool) -> None:
    m = parse(_TEXT.replace("WANT", "true" if want_lse else "false"))
    verify(m)
    q = torch.randn(3, 2)
    o, lse, seed = run_graph(m, [q])
    torch.testing.assert_close(o, q * 2)
    if want_lse:
        torch.testing.assert_close(lse, q.sum(-1, keepdim=True))
    else:  # undefined in the real kernel: zeros of the declared type
        assert lse.shape == (3, 1) and lse.dtype == torch.float32 and not lse.any()
    assert seed.shape == () and seed.dtype == torch.int64


def test_the_meta_kernel_runs_once_per_signature() -> None:
    # it cost ~250 us per cuDNN attention call on the H200 (a transformer's call kernel by
    # kernel paid it in every layer): asked once per argument layout, then its plan is reused
    # (a shape of its own: the other tests' calls have their plans already)
    m = parse(_TEXT.replace("WANT", "false").replace("[3, ", "[5, "))
    verify(m)
    META_CALLS.clear()
    for _ in range(4):
        q = torch.randn(5, 2)
        o, lse, seed = run_graph(m, [q])
        torch.testing.assert_close(o, q * 2)
        assert lse.shape == (5, 1) and not lse.any() and seed.shape == ()
    assert META_CALLS == [(5, 2)]
    # another layout of the operand: the meta kernel is asked again
    q = torch.randn(2, 5).t()
    o, _, _ = run_graph(m, [q])
    torch.testing.assert_close(o, q * 2)
    assert META_CALLS == [(5, 2), (5, 2)]
