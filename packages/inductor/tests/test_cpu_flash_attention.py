"""ember's fused CPU attention forward (targets/cpu/flash.py) against torch's flash kernel:
output and logsumexp over shapes, layouts, masks (broadcast, -inf entries, fully masked rows)
and causal calls; torch's kernel where ember's does not serve; and the CPU lowering's use of
it for a q of any layout (its output read as a permuted view of the [B, L, H, E] buffer)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import flash
from ember.ir import parse

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _layout(t: torch.Tensor, kind: int) -> torch.Tensor:
    """[B, H, N, E] values as a contiguous tensor (0), a head split of [B, N, H, E] rows (1)
    or with E strided (2: a transpose of [B, H, E, N] storage)."""
    if kind == 1:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if kind == 2:
        return t.transpose(2, 3).contiguous().transpose(2, 3)
    return t.contiguous()


@st.composite
def _calls(draw: st.DrawFn, few_heads: bool = False) -> dict:
    b, h = draw(st.integers(1, 2 if few_heads else 3)), draw(st.integers(1, 3 if few_heads else 4))
    n = draw(st.integers(flash.MIN_ROWS, 140 if few_heads else 45))
    s = draw(st.integers(1, 70))
    e = ev = draw(st.integers(1, 70))  # (torch's kernel needs one head size)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q, k, v = (_layout(torch.randn(b, h, m, d, generator=g), draw(st.integers(0, 2)))
               for m, d in ((n, e), (s, e), (s, ev)))
    shape = draw(st.sampled_from([None, (b, h, n, s), (1, h, n, s), (b, 1, n, s), (n, s),
                                  (1, 1, 1, s)]))
    mask = None
    if shape is not None:
        mask = torch.randn(shape, generator=g) * 3
        mask[torch.rand(shape, generator=g) < draw(st.sampled_from([0.0, 0.3]))] = \
            float("-inf")
        if draw(st.booleans()) and len(shape) == 4:
            mask[..., 0, :] = float("-inf")  # a fully masked row
    return {"q": q, "k": k, "v": v, "attn_mask": mask, "is_causal": draw(st.booleans()),
            "scale": draw(st.sampled_from([None, 0.3])), "heads_last": draw(st.booleans())}


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
               is_causal: bool, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The math in f64, with torch's flash kernel's conventions: causal is top-left, a row whose
    every score is -inf gives an output and a logsumexp of 0."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(2, 3) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if attn_mask is not None:
        s = s + attn_mask.double()
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    dead = torch.isneginf(s).all(-1, keepdim=True)
    s = s.masked_fill(dead, 0.0)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse).masked_fill(dead, 0.0)
    return (p @ v).float(), lse.masked_fill(dead, 0.0).squeeze(-1).float()


@settings(max_examples=80, deadline=None)
@given(_calls())
def test_matches_the_math_and_torchs_flash_kernel(c: dict) -> None:
    q, k, v, heads_last = c.pop("q"), c.pop("k"), c.pop("v"), c.pop("heads_last")
    want_o, want_l = _reference(q, k, v, **c)
    if all(t.stride(-1) == 1 for t in (q, k, v)):  # (torch's kernel needs that: flash.py)
        flash_o, flash_l = FLASH(q, k, v, 0.0, **c)
        torch.testing.assert_close(flash_o, want_o, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(flash_l, want_l, rtol=1e-4, atol=1e-5)
    o, lse = flash.forward(q, k, v, 0.0, **c, heads_last=heads_last)
    torch.testing.assert_close(o, want_o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, want_l, rtol=1e-4, atol=1e-5)
    if heads_last:  # permuted views of [B, L, H, E] and [B, L, H] buffers
        assert o.transpose(1, 2).is_contiguous() and lse.transpose(1, 2).is_contiguous()
    else:
        assert o.is_contiguous() and lse.is_contiguous()


def test_serving_calls_run_embers_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g) for _ in range(3))
    want = FLASH(q, k, v, is_causal=True)

    def refuse(*a: object, **kw: object) -> None:
        raise AssertionError("torch's kernel ran")
    monkeypatch.setattr(flash, "_KERNEL", refuse)
    out, lse = flash.forward(q, k, v, is_causal=True)
    torch.testing.assert_close(out, want[0])
    torch.testing.assert_close(lse, want[1])


@pytest.mark.parametrize("case", ["f64", "few rows", "dropout", "gqa", "long keys"])
def test_other_calls_run_torchs_kernel(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(4)
    dt = torch.float64 if case == "f64" else torch.float32
    n = flash.MIN_ROWS - 1 if case == "few rows" else 32
    q = torch.randn(2, 4, n, 8, generator=g, dtype=dt)
    k = torch.randn(2, 2 if case == "gqa" else 4, 32, 8, generator=g, dtype=dt)
    if case == "long keys":  # (an expanded view: the check reads the sizes alone)
        k = torch.zeros(1, 1, 1, 8).expand(2, 4, flash.MAX_KEYS_X_FEATURES // 8 + 1, 8)
    if case in ("gqa", "dropout", "long keys"):  # (torch's kernel refuses the first two)
        assert not flash._serves(q, k, k, 0.5 if case == "dropout" else 0.0, None)
        return
    calls = []
    kernel = flash._KERNEL

    def spy(*a: object, **kw: object) -> object:
        calls.append(1)
        return kernel(*a, **kw)
    monkeypatch.setattr(flash, "_KERNEL", spy)
    out, lse = flash.forward(q, k, k)
    assert calls == [1]
    want_o, want_l = _reference(q, k, k, None, False, None)
    torch.testing.assert_close(out, want_o.to(dt), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, want_l.to(dt), rtol=1e-4, atol=1e-5)


CONTIGUOUS_Q = """ember.ir 1.0

graph @f(%q: f32[2, 2, 24, 4], %w: f32[8, 8]) -> (f32[48, 8]) {
  %o, %l = aten._scaled_dot_product_flash_attention_for_cpu.default(%q, %q, %q, 0.0, true) : (f32[2, 2, 24, 4], f32[2, 2, 24])
  %ot = aten.transpose.int(%o, 1, 2) : f32[2, 24, 2, 4]
  %m = aten.reshape.default(%ot, [48, 8]) : f32[48, 8]
  %y = aten.mm.default(%m, %w) : f32[48, 8]
  return (%y)
}
"""


def test_a_contiguous_q_is_read_where_embers_kernel_writes() -> None:
    """A q written [B, H, L, E] (rotary's kernel): ember's kernel writes the output
    [B, L, H, E] all the same, so the head merge before the GEMM is a view, not a copy."""
    g = torch.Generator().manual_seed(5)
    q, w = torch.randn(2, 2, 24, 4, generator=g), torch.randn(8, 8, generator=g)
    compiled = compile_module(parse(CONTIGUOUS_Q))
    nodes = compiled.graph().nodes
    externs = [n for n in nodes if n.op == "kernels.extern"]
    assert externs[0].kwargs["op"] == "loop.attention_heads_last_cpu", \
        [n.kwargs["op"] for n in externs]
    at, mm = nodes.index(externs[0]), nodes.index(externs[1])
    assert not any(n.op == "kernels.call" for n in nodes[at:mm]), [n.op for n in nodes[at:mm]]
    (y,) = compiled_runner(compiled)(None, [q, w]).outputs
    o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(y, o.transpose(1, 2).reshape(48, 8) @ w)


@pytest.mark.parametrize("causal", [False, True])
def test_a_heads_rows_split_into_chunks(causal: bool) -> None:
    """One head of 300 rows: the kernel splits its rows into tasks (each packing the keys it
    reads: a causal chunk only those up to its last row)."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 1, 300, 8, generator=g) for _ in range(3))
    mask = torch.randn(300, 300, generator=g)
    o, lse = flash.forward(q, k, v, is_causal=causal, attn_mask=mask)
    want_o, want_l = _reference(q, k, v, mask, causal, None)
    torch.testing.assert_close(o, want_o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, want_l, rtol=1e-4, atol=1e-5)


def _layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b, n, d = x.shape
    q, k, v = (x @ w).view(b, n, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return (a.transpose(1, 2).reshape(b, n, d) ** 2).sum()


def test_training_reads_embers_output_and_logsumexp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward (torch's kernel) reads the forward's output and logsumexp from ember's."""
    import ember.runtime as er
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(2, 40, 16, generator=g), torch.randn(16, 48, generator=g) / 4
    ran: list[int] = []
    kernel = flash._library()

    def counted(*a: object) -> None:
        ran.append(1)
        kernel(*a)
    monkeypatch.setattr(flash, "_library", lambda: counted)

    def grads(fn: object) -> list[torch.Tensor]:
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(xs, ws).backward()  # type: ignore[operator]
        assert xs.grad is not None and ws.grad is not None
        return [xs.grad, ws.grad]
    got = grads(er.compile(_layer, backend="inductor"))
    assert ran
    torch.testing.assert_close(got, grads(_layer), rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@settings(max_examples=25, deadline=None)
@given(_calls(few_heads=True))
def test_few_heads_at_many_threads(c: dict) -> None:
    """B*H below the threads (the query blocks are the tasks, the keys and values packed once):
    at 1, 3, 7 and 16 threads the same bits, and the math's values."""
    q, k, v, heads_last = c.pop("q"), c.pop("k"), c.pop("v"), c.pop("heads_last")
    want_o, want_l = _reference(q, k, v, **c)
    runs = []
    for n in (1, 3, 7, 16):
        with _threads(n):
            runs.append(flash.forward(q, k, v, 0.0, **c, heads_last=heads_last))
    torch.testing.assert_close(runs[0][0], want_o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(runs[0][1], want_l, rtol=1e-4, atol=1e-5)
    for o, lse in runs[1:]:
        torch.testing.assert_close(o, runs[0][0], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(lse, runs[0][1], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(("bh", "n", "threads", "least"), [
    ((2, 4), 128, 16, 32), ((2, 3), 197, 16, 32), ((1, 1), 128, 2, 4), ((1, 1), 128, 16, 16),
    ((1, 1), 40, 16, 5), ((2, 12), 128, 16, 32)])
def test_tasks_cover_the_threads(bh: tuple[int, int], n: int, threads: int, least: int) -> None:
    """With fewer heads than threads (bert's 2x4 and DeiT's 2x3 at 16 threads, one head at 2),
    the query blocks of 8 rows are tasks: >= 2 a thread where the rows allow (one head of 128
    rows has 16 blocks); whole heads at one thread."""
    count, shared = flash.tasks(*bh, n, n, 64, threads)
    assert count >= least and shared, (count, shared)
    assert flash.tasks(*bh, n, n, 64, 1) == (bh[0] * bh[1], False)
    assert flash.tasks(16, 8, n, n, 64, threads)[0] == 128  # (>= 4 heads a thread)


_EMPTY = """
import torch
from ember.inductor.targets.cpu import flash
torch.set_num_threads(3)
for b, h in ((0, 2), (2, 0)):
    q, k, v = torch.randn(b, h, 32, 16), torch.randn(b, h, 20, 16), torch.randn(b, h, 20, 16)
    out, lse = flash.forward(q, k, v, 0.0, False)
    assert out.shape == (b, h, 32, 16) and lse.shape == (b, h, 32), (out.shape, lse.shape)
    assert flash.tasks(b, h, 32, 20, 16, 3) == (0, False)
print("ok")
"""


def test_an_empty_batch_or_no_heads_at_several_threads() -> None:
    """B*H == 0 at > 1 thread: the plan divided by B*H (SIGFPE, the process killed); run in a
    child process so that a crash fails this test only."""
    import subprocess
    import sys
    got = subprocess.run([sys.executable, "-c", _EMPTY], capture_output=True, text=True,
                         timeout=600)
    assert got.returncode == 0 and got.stdout.strip().endswith("ok"), (got.returncode,
                                                                        got.stderr[-2000:])
