"""plan-buffers hands a dead buffer to an extern that has an out form (prims.matmul as torch.mm /
torch.bmm with out=), as it does to a kernel output: the generated wrapper passes the dead
buffer's storage as out= instead of letting the product allocate (TorchInductor's
`extern_kernels.bmm(..., out=buf)`). Results equal eager, a returned product is not written
by the next call, and the product's storage is a dead product's (seen at the dispatcher)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from ember.inductor.backend import compile_module, compiled_runner
from ember.inductor.wrapper import generate
from ember.ir import Module, parse


def _source(batch: int | None, n: int) -> str:
    """%a and %b die at %c (the peak: three products and %w live); %e may take either's
    storage. (%w is computed: a 2-d product with a graph input on the right is oneDNN's
    packed linear, which has no out form.)"""
    t = f"f32[{batch}, {n}, {n}]" if batch is not None else f"f32[{n}, {n}]"
    return f"""ember.ir 1.0

graph @f(%x: {t}, %y: {t}, %z: {t}) -> ({t}) {{
  %w = prims.tanh(%y) : {t}
  %a = prims.matmul(%x, %w) : {t}
  %b = prims.matmul(%x, %z) : {t}
  %c = prims.matmul(%a, %b) : {t}
  %d = prims.tanh(%c) : {t}
  %e = prims.matmul(%d, %w) : {t}
  return (%e)
}}
"""


def _eager(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    w = torch.tanh(y)
    return torch.tanh((x @ w) @ (x @ z)) @ w


def _compiled(batch: int | None, n: int) -> Module:
    return compile_module(parse(_source(batch, n)))


def _inputs(batch: int | None, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (n, n) if batch is None else (batch, n, n)
    return [torch.randn(shape, generator=g) / n ** 0.5 for _ in range(3)]


def _extern_reuse(m: Module) -> dict[str, list[str]]:
    return {n.results[0].name: [r.name for r in n.kwargs.get("reuse", [])]  # type: ignore[union-attr]
            for n in m.graph().nodes if n.op == "kernels.extern"}


@settings(max_examples=6, deadline=None)
@given(batch=st.one_of(st.none(), st.integers(1, 3)), n=st.integers(1, 9))
def test_out_form_results_equal_eager(batch: int | None, n: int) -> None:
    m = _compiled(batch, n)
    reuse = _extern_reuse(m)
    assert reuse["e"] and reuse["e"][0] in ("a", "b"), reuse
    assert "out=" in generate(m).source
    run = compiled_runner(m)
    for seed in (0, 1):
        xs = _inputs(batch, n, seed)
        torch.testing.assert_close(run(None, xs).outputs[0], _eager(*xs))


def test_returned_product_not_clobbered() -> None:
    run = compiled_runner(_compiled(2, 8))
    first = _inputs(2, 8, 0)
    r1 = run(None, first).outputs[0]
    kept = r1.clone()
    second = _inputs(2, 8, 1)
    r2 = run(None, second).outputs[0]
    torch.testing.assert_close(r1, kept)
    torch.testing.assert_close(r1, _eager(*first))
    torch.testing.assert_close(r2, _eager(*second))
    assert r1.untyped_storage().data_ptr() != r2.untyped_storage().data_ptr()


class _Storages(TorchDispatchMode):
    """Per aten call: the op and the storage addresses of its result and out= operand."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int | None, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = (kwargs or {}).get("out")
        if isinstance(out, torch.Tensor):
            self.calls.append((str(func), given.untyped_storage().data_ptr()
                               if isinstance(given, torch.Tensor) else None,
                               out.untyped_storage().data_ptr()))
        return out


@pytest.mark.parametrize("batch", [None, 2])
def test_product_written_into_dead_product(batch: int | None) -> None:
    run = compiled_runner(_compiled(batch, 8))
    xs = _inputs(batch, 8, 0)
    run(None, xs)
    with _Storages() as seen:
        res = run(None, xs).outputs[0]
    products = [c for c in seen.calls if "bmm" in c[0] or ".mm" in c[0]]
    assert len(products) == 4, seen.calls
    # the last product is bmm.out into the storage of %a or %b (dead since %c), not new memory
    op, given, got = products[-1]
    assert "out" in op and given == got == res.untyped_storage().data_ptr()
    assert got in (products[0][2], products[1][2])


def test_symbolic_batch() -> None:
    """A symbolic batch: the dead buffer is viewed at the call's sizes (launch.out_buffer)."""
    src = _source(2, 8).replace("f32[2, 8, 8]", "f32[s0, 8, 8]").replace(
        "ember.ir 1.0\n", "ember.ir 1.0\n\nsymbol s0 hint=4 min=1\n")
    m = compile_module(parse(src))
    assert _extern_reuse(m)["e"]
    run = compiled_runner(m)
    for batch in (1, 3, 5):
        xs = _inputs(batch, 8, batch)
        torch.testing.assert_close(run(None, xs).outputs[0], _eager(*xs))
