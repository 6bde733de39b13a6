"""Compiled kernels of a test session go to a fresh cache directory (never ~/.cache); the
Triton target in the CPU's place, for the Triton tests; the runs of the in-place cache op."""

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ember.inductor.targets import Target, add_target, targets, unregister_target


@pytest.fixture(scope="session", autouse=True)
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("ember-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(d))
        yield d


@pytest.fixture
def triton_on_cpu() -> Iterator[Target]:
    """The Triton target (interpreted) in place of the CPU's, restored after: for tests whose
    module imported ember.inductor.targets.cuda (its inductor-cuda-interpret pipeline)."""
    cpu = targets()["cpu"]
    unregister_target("cpu")
    try:
        yield add_target(dataclasses.replace(
            cpu, pipeline="inductor-cuda-interpret", loader="triton", lowerings={},
            front="decompose,cse,dce", description="Triton in the interpreter (a test)"))
    finally:
        unregister_target("cpu")
        add_target(cpu)


@pytest.fixture
def inplace_runs() -> Iterator[list[bool]]:
    """Per run of `cache-inplace`'s op (loop.index_copy_inplace): whether its result was its
    input tensor itself (the cache written in place)."""
    from ember.inductor.targets.cuda import inplace
    from ember.ir.registry import default_registry
    reg = default_registry()
    real = reg.lookup(inplace.OP)
    assert real is not None
    seen: list[bool] = []

    def run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
        out = real.reference(interp, args, kw)
        seen.append(out is args[0])
        return out
    reg.unregister(inplace.OP)
    reg.register(dataclasses.replace(real, reference=run))
    try:
        yield seen
    finally:
        reg.unregister(inplace.OP)
        reg.register(real)
