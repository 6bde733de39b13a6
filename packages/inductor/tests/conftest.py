"""Compiled kernels of a test session go to a fresh cache directory (never ~/.cache); the
Triton target in the CPU's place, for the Triton tests."""

import dataclasses
from collections.abc import Iterator
from pathlib import Path

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
