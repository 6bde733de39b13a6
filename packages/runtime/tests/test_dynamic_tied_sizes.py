"""Two size symbols compared by their difference (issue 17, issue 20): transformers 5.17's mask
code pads the attention mask by `kv_length + kv_offset - mask.shape[-1]` where kv_length is the
KV cache's length + 1, so a decode step compares the cache's length symbol with the mask's. The
probes give each symbol its own unrelated size, so that branch went the other way at the probes
and both symbols were made static: a recompile per decode step up to the cache limit, then eager.
Now the capture retries with the second size written as the first's symbol + their real
difference (`s0 + 1`, checked by its input's guard): one symbolic decode graph."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ember.runtime.compile import compile, compiled_function_of


def decode_step(cache: torch.Tensor, mask: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    kv_length = cache.shape[-2] + new.shape[-2]
    if (pad := kv_length - mask.shape[-1]) > 0:  # a static cache: mask shorter than the keys
        mask = F.pad(mask, (0, pad))
    keys = torch.cat([cache, new], dim=-2)
    scores = (new @ keys.transpose(-1, -2)).masked_fill(mask[:, None, :] == 0, -1e9)
    return scores.softmax(-1) @ keys


def _steps(fn: Any, calls: list[tuple[int, int]], dynamic: bool | None) -> Any:
    """Call the compiled `fn` with (cache length, mask length - cache length) per step."""
    cf = compile(fn, dynamic=dynamic, backend="eager")
    torch.manual_seed(0)
    with torch.no_grad():
        for n, extra in calls:
            cache, new = torch.randn(2, n, 4), torch.randn(2, 1, 4)
            mask = torch.ones(2, n + extra, dtype=torch.int64)
            mask[0, 0] = 0
            torch.testing.assert_close(cf(cache, mask, new), fn(cache, mask, new))
    f = compiled_function_of(cf)
    assert f is not None
    return f.history


def test_growing_cache_and_mask_compared_by_difference_capture_one_symbolic_graph() -> None:
    h = _steps(decode_step, [(n, 1) for n in range(5, 10)], None)
    assert len(h.graphs) == 2, h.recompilations  # the first call's, then one symbolic graph
    assert h.fallbacks == [], h.fallbacks
    # one symbol: the mask's length is the cache's + 1, checked by the mask's guard
    ir = h.graphs[-1].ir
    assert "symbol s0" in ir and "symbol s1" not in ir, ir
    assert "%l_mask: i64[2, s0 + 1]" in ir, ir
    assert any(g.startswith("mask: tensor int64[2, s0 + 1]") for g in h.graphs[-1].guards)


@pytest.mark.parametrize("dynamic", [True, None])
def test_a_call_off_the_tie_fails_its_guard_and_stays_correct(dynamic: bool | None) -> None:
    # the guarded difference: a mask as long as the cache (the pad branch) is a new capture
    h = _steps(decode_step, [(5, 1), (6, 1), (7, 1), (8, 0), (9, 0)], dynamic)
    tied_graphs = 1 if dynamic else 2  # dynamic=None: the first call's graph, then symbolic
    assert len(h.graphs) == tied_graphs + 1, h.recompilations
    assert "sizes:" in h.recompilations[-1] or "mask" in h.recompilations[-1], h.recompilations
