"""Masks of the CUDA target's Triton kernels (render.py `_below`, `_xmask`): a lane mask that
is always true (a static extent covered exactly by the blocks) is a constant, which Triton's
compiler folds away (unmasked, vectorised loads and stores; no selects before reductions);
the others compare. Checked in Triton's interpreter against eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.ir import Module
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY

PIPELINE = "decompose,cse,dce,inductor-cuda-interpret"


def compiled(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Module, str]:
    m = run_pipeline(capture(fn, args, {}).module, PIPELINE)  # type: ignore[arg-type]
    load_module(m)
    (k,) = m.kernels.values()
    return m, k.source


def test_exact_rows_have_constant_masks() -> None:
    x = torch.randn(8, 64)
    m, src = compiled(lambda a: torch.softmax(a, -1), x)
    assert "rmasks = xmask & tl.full([1, 64], 1, tl.int1)" in src
    assert "if 8 % XBLOCK == 0:" in src and "xmask = tl.full([XBLOCK, 1], 1, tl.int1)" in src
    torch.testing.assert_close(compiled_runner(m)(None, [x]).outputs[0], torch.softmax(x, -1))


def test_ragged_rows_and_chunks_compare() -> None:
    x = torch.randn(5, 100)
    m, src = compiled(lambda a: torch.softmax(a, -1), x)
    assert "(rflats < 100)" in src and "xmask = xflat < 5" in src
    torch.testing.assert_close(compiled_runner(m)(None, [x]).outputs[0], torch.softmax(x, -1))


def test_pointwise_mask_follows_the_launched_block() -> None:
    """The constant xmask is chosen at compile time by the launch's XBLOCK: the same kernel
    launched with a block that does not divide the elements masks the tail again."""
    x = torch.randn(12, 8)
    m, src = compiled(lambda a: a.sin() * 2, x)
    assert "if 96 % XBLOCK == 0:" in src
    want = x.sin() * 2
    torch.testing.assert_close(compiled_runner(m)(None, [x]).outputs[0], want)
    (loaded,) = load_module(m).values()
    scope = loaded.fn.__globals__  # the block's module: its kernel
    kern = next(v for n, v in scope.items() if n.startswith("ember_k_"))
    big = torch.zeros(200)  # the output inside a larger buffer: a write past it would show
    view = big[:96].view(12, 8)
    kern[(2,)](x, view, XBLOCK=64)  # 96 % 64 != 0: the second program's tail is masked
    torch.testing.assert_close(view, want)
    assert torch.count_nonzero(big[96:]) == 0
