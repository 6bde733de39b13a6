"""The CPU target renders a pointwise kernel over split loops (targets/cpu/splitloops.py): a
dim its indices divide becomes several loops (no `//` or `mod` left in the loads), and a loop
whose concatenations and clamps change at a break point becomes consecutive loops (no selects
between the pieces, no clamped gathers). The pattern is a transformer's training backward:
q, k and v gradients ([B, H, L, E], rotary's half swap on q and k) written as rows of the qkv
projection's gradient. Values are checked against the reference interpreter."""

from __future__ import annotations

import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Interpreter, Module, parse, verify


def _qkv_rows(b: int, h: int, n: int, e: int, cut: int) -> str:
    """q, k, v [b, h, n, e] -> [b*n, 3*h*e]: q and k with their last dim's halves at `cut`
    swapped (rotary's cat([-x2, x1])), stacked, heads merged."""
    t = f"f32[{b}, {h}, {n}, {e}]"
    lines = [f"  %cb = prims.broadcast_in_dim(%c, shape=[{b}, {h}, {n}, {e}], "
             f"broadcast_dims=[2, 3]) : {t}"]
    for x in ("q", "k"):
        lines += [
            f"  %{x}1 = prims.slice(%{x}, start=[0, 0, 0, 0], limit=[{b}, {h}, {n}, {cut}]) "
            f": f32[{b}, {h}, {n}, {cut}]",
            f"  %{x}2 = prims.slice(%{x}, start=[0, 0, 0, {cut}], limit=[{b}, {h}, {n}, {e}]) "
            f": f32[{b}, {h}, {n}, {e - cut}]",
            f"  %{x}n = prims.neg(%{x}2) : f32[{b}, {h}, {n}, {e - cut}]",
            f"  %{x}r = prims.concatenate([%{x}n, %{x}1], dim=3) : {t}",
            f"  %{x}s = prims.mul(%{x}r, %cb) : {t}",
            f"  %{x}o = prims.add(%{x}, %{x}s) : {t}",
            f"  %{x}5 = prims.reshape(%{x}o, shape=[1, {b}, {h}, {n}, {e}]) "
            f": f32[1, {b}, {h}, {n}, {e}]",
        ]
    lines += [f"  %v5 = prims.reshape(%v, shape=[1, {b}, {h}, {n}, {e}]) "
              f": f32[1, {b}, {h}, {n}, {e}]",
              f"  %s = prims.concatenate([%q5, %k5, %v5], dim=0) : f32[3, {b}, {h}, {n}, {e}]",
              f"  %p = prims.permute(%s, dims=[1, 3, 0, 2, 4]) : f32[{b}, {n}, 3, {h}, {e}]",
              f"  %y = prims.reshape(%p, shape=[{b * n}, {3 * h * e}]) : f32[{b * n}, "
              f"{3 * h * e}]"]
    body = "\n".join(lines)
    return (f"ember.ir 1.0\n\ngraph @f(%q: {t}, %k: {t}, %v: {t}, %c: f32[{n}, {e}]) -> "
            f"(f32[{b * n}, {3 * h * e}]) {{\n{body}\n  return (%y)\n}}\n")


def _check(text: str) -> Module:
    m = parse(text)
    verify(m)
    compiled: Module = compile_module(m)
    g = m.items["f"]
    inputs = [torch.randn(*[int(d) for d in p.type.shape]) for p in g.params]  # type: ignore
    want = Interpreter(m).run(inputs).outputs[0]
    got = compiled_runner(compiled)(None, inputs).outputs[0]
    torch.testing.assert_close(got, want)  # (g++ may fuse x + s * c into one fma)
    return compiled


def _kernel_text(m: Module) -> str:
    return "\n".join(k.source for k in m.kernels.values())


def _loads(src: str) -> list[str]:
    """The kernels' statements that read a buffer (`in3[...]`)."""
    return [ln for ln in src.splitlines() if re.search(r"\bin[0-9]+\[", ln)]


def test_head_merge_with_rotary_has_no_divisions_selects_or_clamps() -> None:
    src = _kernel_text(_check(_qkv_rows(2, 4, 8, 32, 16)))
    loads = _loads(src)
    assert loads and not [ln for ln in loads if "ember_" in ln or "std::m" in ln
                          or " / " in ln or " % " in ln], loads
    # the row's two halves are consecutive innermost loops of 16
    assert len(re.findall(r"for \(int64_t i4 = 0; i4 < 16; \+\+i4\)", src)) >= 2, src


def test_without_the_split_the_same_kernel_divides() -> None:
    """The baseline the test above removes: the kernel's loads, over [b*n, 3*h*e], divide."""
    import ember.inductor.targets.cpu.kernel as kernel
    old = kernel.split_kernel
    kernel.split_kernel = lambda *a, **k: None
    try:
        src = _kernel_text(_check(_qkv_rows(2, 4, 8, 32, 16)))
    finally:
        kernel.split_kernel = old
    assert [ln for ln in _loads(src) if "ember_mod" in ln or " % " in ln]


@settings(max_examples=10, deadline=None)
@given(b=st.integers(1, 3), h=st.integers(1, 3), n=st.integers(1, 5),
       e=st.integers(2, 40), data=st.data())
def test_split_kernels_match_the_reference(b: int, h: int, n: int, e: int,
                                           data: st.DataObject) -> None:
    cut = data.draw(st.integers(1, e - 1))
    _check(_qkv_rows(b, h, n, e, cut))
