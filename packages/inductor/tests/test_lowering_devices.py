"""`lower-loops` keeps a cuda graph on cuda (found on the H200: concatenate's bounds were typed
cpu, so `prims.where` refused them next to cuda loads and resnet18/deit/vit fell back to eager).

Graphs are captured here on cpu and retyped onto cuda:0, then lowered (no GPU needed: nothing
runs). Every value of every lowered graph, kernel bodies included (loads, `loop.index`, constants),
must be on cuda:0, and the dump must replay.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers lower-loops)
from ember.capture import capture
from ember.ir import Module, TensorType, parse, verify
from ember.ir.passes import run_pipeline

_TYPE = re.compile(r"((?:f16|bf16|f32|f64|i8|i16|i32|i64|u8|b8)\[[^\]]*\](?:\{[^}]*\})?)(?!@)")


def lowered_for_cuda(fn: Callable[..., Any], *args: torch.Tensor,
                     pipeline: str = "decompose,cse,dce,lower-loops") -> Module:
    with torch.no_grad():
        c = capture(fn, args, {})
    assert c.module is not None
    text = _TYPE.sub(r"\1@cuda:0", str(c.module))
    return run_pipeline(parse(text), pipeline)


def devices(m: Module) -> dict[str, set[str]]:
    """Each graph's devices (its parameters', nodes' results' and outputs' tensor types)."""
    out: dict[str, set[str]] = {}
    for g in m.graphs.values():
        vals = [*g.params, *(r for n in g.nodes for r in n.results), *g.outputs]
        out[g.name] = {v.type.device for v in vals if isinstance(v.type, TensorType)}
    return out


def assert_all_cuda(m: Module) -> None:
    mixed = {name: devs for name, devs in devices(m).items() if devs - {"cuda:0"}}
    assert not mixed, mixed
    verify(parse(str(m)))  # loop.index's device= survives the text round trip


def test_cat_pad_iota_and_max_pool_lower_on_cuda() -> None:
    x = torch.randn(2, 3, 8, 8)
    assert_all_cuda(lowered_for_cuda(
        lambda x: torch.cat([F.max_pool2d(x, 2), x[:, :, :4, :4]], 1), x))
    assert_all_cuda(lowered_for_cuda(lambda x: F.pad(x, (1, 2, 0, 3)) * 2, x))
    assert_all_cuda(lowered_for_cuda(
        lambda x: x + torch.arange(8, device=x.device, dtype=x.dtype), x))


def test_fused_cat_stays_on_cuda() -> None:
    # rotary embedding's cat is fused into its reader: the copied bodies keep the device
    def rotate(x: torch.Tensor) -> torch.Tensor:
        a, b = x[..., :4], x[..., 4:]
        return x * 0.5 + torch.cat([-b, a], -1)
    assert_all_cuda(lowered_for_cuda(rotate, torch.randn(2, 3, 8),
                                     pipeline="decompose,cse,dce,lower-loops,fuse"))


def test_cpu_graphs_write_no_device() -> None:
    # cpu, the default, stays unwritten: cpu dumps read as before
    with torch.no_grad():
        c = capture(lambda x: torch.cat([x, x * 2], 0), (torch.randn(2, 3),), {})
    assert c.module is not None
    m = run_pipeline(c.module, "decompose,cse,dce,lower-loops")
    assert "loop.index" in str(m) and "device=" not in str(m)
    assert devices(m) and all(d <= {"cpu"} for d in devices(m).values())


@settings(max_examples=10)
@given(sizes=st.lists(st.integers(0, 3), min_size=1, max_size=4), dim=st.integers(0, 2),
       pad=st.lists(st.integers(0, 2), min_size=2, max_size=2))
def test_lowering_never_mixes_devices(sizes: list[int], dim: int, pad: list[int]) -> None:
    """Concatenations of drawn pieces along a drawn dim, padded and added to an arange: every
    lowered value is on cuda:0."""
    base = [2, 3, 2]
    pieces = []
    for k, s in enumerate(sizes):
        shape = list(base)
        shape[dim] = s
        pieces.append(torch.randn(shape) + k)

    def fn(*xs: torch.Tensor) -> torch.Tensor:
        y = F.pad(torch.cat(xs, dim), (pad[0], pad[1]))
        return y + torch.arange(y.shape[-1], device=y.device, dtype=y.dtype)
    assert_all_cuda(lowered_for_cuda(fn, *pieces, pipeline="decompose,cse,dce,lower-loops,fuse"))
