"""The CUDA target keeps a training backward's `aten.convolution_backward` as one extern call
of torch's kernel (issue 16: on the H200 the conv+BN training step's backward left it to the
reference interpreter, an eager op between Triton kernels, reported as a fallback).

Without a GPU: a graph calling the op, captured on the CPU, retyped onto cuda:0 in the IR (as
benchmarks/cuda_kernel_census.py does), through the CUDA front end and `lower-loops`: the
lowering rules are those of the graph's device's target, so this is the CUDA target's table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from ember.capture import capture
from ember.inductor.targets import targets, unregister_target
from ember.inductor.targets.cuda import EXTERNS, FRONT, register_cuda_target
from ember.ir import TensorType
from ember.ir.passes import run_pipeline

OP = "aten.convolution_backward.default"


@pytest.fixture(scope="module", autouse=True)
def _cuda_target() -> Iterator[None]:
    """The cuda target registered for this file only (other files check a machine without it)."""
    had = targets().get("cuda") is not None
    register_cuda_target()
    yield
    if not had:
        unregister_target("cuda")


def _on_cuda(module: object) -> object:
    for g in module.graphs.values():  # type: ignore[attr-defined]
        for v in [*g.params, *(r for n in g.nodes for r in n.results)]:
            if isinstance(v.type, TensorType):
                v.type = dataclasses.replace(v.type, device="cuda:0")
        g.result_types = [o.type for o in g.outputs]
    return module


def test_conv_backward_lowers_to_an_extern_on_the_cuda_target() -> None:
    assert OP in EXTERNS

    def grads(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gi, gw, _ = torch.ops.aten.convolution_backward(
            g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
        return gi, gw
    c = capture(grads, (torch.randn(2, 4, 6, 6), torch.randn(2, 3, 6, 6),
                        torch.randn(4, 3, 3, 3)), {})
    m = run_pipeline(_on_cuda(c.module), f"{FRONT},lower-loops")  # type: ignore[attr-defined]
    nodes = [n for g in m.graphs.values() for n in g.nodes]
    assert not [n for n in nodes if n.op == OP], "left to the reference interpreter"
    assert [n.kwargs.get("op") for n in nodes if n.op == "loop.extern"] == [OP]
