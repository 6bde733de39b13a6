"""Decode steps for the `cache-inplace` and decode tests of both targets
(test_cpu_cache_inplace.py, test_cuda_cache_inplace.py, test_cuda_gemv_group.py): a toy static
cache's update and its inputs, captured with the cache as an updated input; a tiny Hugging Face
model's decode step captured with its static cache, the CUDA externs' lowering rules on the CPU
target, the front of the CUDA pipeline up to the decode passes, and runs of a compiled module
from one snapshot of the step's inputs (the caches are written in place). The fixture counting
the in-place op's runs, `inplace_runs`, is conftest.py's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ember.capture import Captured, capture
from ember.inductor.backend import compiled_runner
from ember.inductor.targets import targets
from ember.ir import Module
from ember.ir.passes import run_pipeline
from ember.runtime.writeback import backend_module

# the CUDA pipeline's front with the decode attention extern (cache-inplace{attention=true})
DECODE_FRONT = "cuda-attention,matmul-lowp,cache-inplace{attention=true},dce"

# the toy cache: [batch, heads, length, head dim]
B, H, S, E = 2, 3, 6, 4


def cache_step(cache: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A static cache's update (transformers' StaticCache: index_copy_ along the length dim),
    then attention-like reads of the updated cache."""
    cache.index_copy_(2, pos, k)
    return torch.softmax(cache.sum(-1) * 0.5, -1)


def cache_step_reading_old(cache: torch.Tensor, k: torch.Tensor, pos: torch.Tensor
                           ) -> torch.Tensor:
    old = cache.sum(-1)  # the old value is read: the rows cannot be written in place
    cache.index_copy_(2, pos, k)
    return cache.sum(-1) - old


def cache_inputs(at: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cache, the new row, its position `at`), random but fixed by `at`."""
    g = torch.Generator().manual_seed(at)
    return (torch.randn(B, H, S, E, generator=g), torch.randn(B, H, 1, E, generator=g),
            torch.tensor([at]))


def captured(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Captured:
    """`fn` captured without grad; it must update an input (the cache)."""
    with torch.no_grad():
        c = capture(fn, args, kwargs or {})
    assert isinstance(c, Captured) and c.updates, c
    return c


def check_cache_step(m: Module, fn: Any, args: tuple[torch.Tensor, ...], in_place: bool) -> None:
    """m (compiled from `fn`, a cache step) run on a copy of `args`' cache against eager `fn`:
    the value, and the cache bit for bit. `in_place`: the graph writes the cache tensor itself
    and returns it (no write-back to do); otherwise it leaves the cache as it was (pure: the
    runtime writes the result back) and returns the updated cache as a new value."""
    want_cache = args[0].clone()
    want = fn(want_cache, *args[1:])
    cache = args[0].clone()
    got = compiled_runner(m)(None, [cache, *args[1:]]).outputs
    if in_place:
        assert got[1] is cache
        torch.testing.assert_close(cache, want_cache, rtol=0, atol=0)
    else:
        torch.testing.assert_close(cache, args[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want_cache, rtol=0, atol=0)
    torch.testing.assert_close(got[0], want)


def check_compiled_cache_calls(runs: list[bool]) -> None:
    """compile()'s `cache_step`, called at each of the cache's positions: each call writes its
    row into the caller's tensor (which the runtime's write-back then leaves alone), as eager
    does, call after call; `runs` (conftest.py's `inplace_runs`) saw one in-place run a call."""
    import ember.runtime as er
    cf = er.compile(cache_step)
    cache, want_cache = cache_inputs()[0], cache_inputs()[0].clone()
    for at in range(S):
        _, k, pos = cache_inputs(at)
        with torch.no_grad():
            got = cf(cache, k, pos)
        want = cache_step(want_cache, k, pos)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(cache, want_cache, rtol=0, atol=0)
    assert len(runs) == S and all(runs), runs
    assert er.explain(cf).fallbacks == []


def check_static_generate(name: str, new: int, runs: list[bool]) -> None:
    """The tiny HF model `name`'s greedy generate() of `new` tokens with a static cache through
    its compiled forward: eager's tokens, every decode step writing each of its 2 layers' key
    and value rows in place (`runs`: conftest.py's `inplace_runs`), no fallback."""
    pytest.importorskip("transformers")
    import ember.runtime as er
    from ember.runtime.testing import generate_with, tiny_hf_model
    model: Any = tiny_hf_model(name)[0]
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    cf = er.compile(model.forward)
    want, got = generate_with(model, cf, ids, max_new_tokens=new, do_sample=False,
                              pad_token_id=0, cache_implementation="static")
    assert torch.equal(got, want)
    assert runs and len(runs) % 4 == 0 and all(runs), runs  # 2 layers x (keys, values) a step
    assert er.explain(cf).fallbacks == []


def externs(m: Module) -> list[str]:
    """The ops of m's extern calls, in order."""
    return [str(n.kwargs.get("op")) for g in m.graphs.values() for n in g.nodes
            if n.op == "kernels.extern"]


def last_decode_step(model: Any, ids: torch.Tensor, new: int
                     ) -> tuple[Captured, Any, tuple[Any, ...], dict[str, Any]]:
    """(the capture, model's own forward, its args and kwargs) of the last decode step of a
    greedy static-cache generate() of `new` tokens, the cache rewound to that step's slot."""
    steps: list[tuple[Any, dict[str, Any]]] = []
    real = model.forward

    def spy(*a: Any, **k: Any) -> Any:
        steps.append((a, dict(k)))
        return real(*a, **k)
    model.forward = spy
    try:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0,
                           cache_implementation="static")
    finally:
        del model.forward
    args, kwargs = steps[-1]
    cache: Any = kwargs.get("past_key_values", kwargs.get("cache"))  # (the name by version)
    for layer in cache.layers:  # the last step again: its slot, not one past the end
        layer.cumulative_length.sub_(1)
    return captured(model.forward, args, kwargs), real, args, kwargs


def cuda_rules_on_cpu(monkeypatch: pytest.MonkeyPatch, rules: dict[str, Any]) -> None:
    """The CUDA target's lowering rules for its externs on the CPU target (this test only)."""
    cpu = targets()["cpu"].lowerings
    for op, rule in rules.items():
        monkeypatch.setitem(cpu, op, rule)


def decode_front(c: Captured) -> Module:
    """The step's module through the CUDA front and DECODE_FRONT (its CPU attention in the CUDA
    form)."""
    from ember.inductor.targets.cuda import FRONT
    from ember.inductor.targets.cuda.attention import cuda_form_of_cpu_attention
    return run_pipeline(cuda_form_of_cpu_attention(backend_module(c)), f"{FRONT},{DECODE_FRONT}")


def snapshot(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def run_from(m: Module, ins: list[Any], snap: list[Any]) -> list[Any]:
    """m's outputs on `ins`, its tensors first reset to `snap` (the caches are written in
    place)."""
    with torch.no_grad():
        for x, s in zip(ins, snap, strict=True):
            if isinstance(x, torch.Tensor):
                x.copy_(s)
        return list(compiled_runner(m)(None, ins).outputs)
