"""Every ATen op that real models emit (recorded by tools/record_model_ops.py on CPU and CUDA,
committed as ember/prims/data/model_ops.json) has a decomposition, or a listed reason."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from ember.prims.decomp import DECOMPOSITIONS

# In-place ops reach the prims in their functional form (capture functionalizes them).
FUNCTIONAL = {"aten.bernoulli_.float": "aten.bernoulli.p"}

# Ops that never reach the decompose pass, and why.
NOT_DECOMPOSED = {
    "aten._local_scalar_dense.default": "`.item()`: a data-dependent Python value; capture "
                                        "breaks the graph there (capture part 3)",
}


def _recorded() -> dict[str, list[str]]:
    data = resources.files("ember.prims").joinpath("data", "model_ops.json").read_text()
    ops: dict[str, list[str]] = json.loads(data)["ops"]
    return ops


def functional_form(op: str) -> str:
    if op in FUNCTIONAL:
        return FUNCTIONAL[op]
    return re.sub(r"^(\w+)\.(\w+?)_\.", r"\1.\2.", op)  # aten.add_.Tensor -> aten.add.Tensor


RECORDED = _recorded()


def test_the_recorded_list_covers_the_models() -> None:
    where = {w.split("/")[0] for ws in RECORDED.values() for w in ws}
    assert {"gpt2", "llama", "bert", "t5", "gpt_neox", "resnet18", "vit_tiny"} <= where
    assert {w.split("/")[1] for ws in RECORDED.values() for w in ws} == {"cpu", "cuda"}


@pytest.mark.parametrize("op", sorted(RECORDED))
def test_recorded_op_decomposes(op: str) -> None:
    if op in NOT_DECOMPOSED:
        return
    assert functional_form(op) in DECOMPOSITIONS, (
        f"{op} (emitted by {', '.join(RECORDED[op][:4])}) has no decomposition")
