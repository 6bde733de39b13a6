"""The generic checks over op database entries.

`op_module(op, sample)` builds a one-node aten graph for a sample (tensors become parameters,
everything else literals); `check_decomposition` lowers it with the `decompose` pass and checks:
only prims remain, the result verifies and round-trips through the text format, and running it
on prims' references equals calling the aten op eagerly (assert_close per dtype, NaN and inf in
the same places). With `symbolic=True` the parameters get duck-sized symbols (one per distinct
size >= 2) and the decomposition must specialise to the same types at the hints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import ember.prims  # noqa: F401  (registers prims and decompositions)
from ember.ir import (
    DType,
    GraphBuilder,
    Interpreter,
    Module,
    Symbol,
    TensorType,
    parse,
    verify,
)
from ember.ir.expr import symbol
from ember.ir.torch_ops import call_torch, resolve
from ember.ir.types import device_text
from ember.prims.decomp import DECOMPOSITIONS, decompose_module
from ember.prims.decomp.random import with_philox_inputs
from ember.testing.opdb import OpEntry, Sample


def to_literal(v: Any) -> Any:
    """A Python/torch argument as an IR literal."""
    if isinstance(v, torch.dtype):
        return DType.from_torch(v)
    if isinstance(v, torch.device):
        return device_text(v)
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v).replace("torch.", "")
    if isinstance(v, (list, tuple)):
        return [to_literal(x) for x in v]
    return v


def op_module(op: str, sample: Sample, symbolic: bool = False,
              returns: Sequence[int] | None = None) -> tuple[Module, list[Any]]:
    """A module with one graph `@f` calling `op` on the sample (returning the results at
    `returns`, default all); and the graph's inputs."""
    m = Module()
    gb = GraphBuilder(m, "f")
    inputs: list[Any] = []
    syms: dict[int, str] = {}

    def dim(n: int) -> Any:
        if not symbolic or n < 2:
            return n
        if n not in syms:
            syms[n] = f"s{len(syms)}"
            m.add_symbol(Symbol(syms[n], hint=n, min=2))
        return symbol(syms[n])

    def bind(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            t = TensorType(DType.from_torch(v.dtype), tuple(dim(int(s)) for s in v.shape), None,
                           device_text(v.device))
            inputs.append(v)
            return gb.param(f"a{len(inputs) - 1}", t)
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return [bind(x) for x in v]
        return to_literal(v)

    args = [bind(a) for a in sample.args]
    kwargs = {k: bind(v) for k, v in sample.kwargs.items()}
    results = gb.emit(op, args, kwargs)
    gb.ret(results if returns is None else [results[i] for i in returns])
    return m, inputs


def eager(op: str, sample: Sample) -> list[Any]:
    overload = resolve(op)
    assert overload is not None, op
    out = call_torch(overload, list(sample.args), dict(sample.kwargs))
    return list(out) if isinstance(out, (list, tuple)) else [out]


def decomposed(op: str, sample: Sample, symbolic: bool = False,
               returns: Sequence[int] | None = None) -> tuple[Module, list[Any]]:
    m, inputs = op_module(op, sample, symbolic, returns)
    verify(m)
    d = decompose_module(m, DECOMPOSITIONS)
    leftover = sorted({n.op for g in d.graphs.values() for n in g.nodes
                       if not n.op.startswith("prims.")})
    assert not leftover, f"{op} decomposed to non-prims: {leftover}"
    verify(d)
    text = str(d)
    assert str(parse(text)) == text, "the decomposed module does not round-trip"
    return d, inputs


def check_decomposition(entry: OpEntry, sample: Sample, symbolic: bool = False) -> None:
    d, inputs = decomposed(entry.op, sample, symbolic, entry.results)
    args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    got = Interpreter(d).run(with_philox_inputs(d.graph(), args)).outputs  # random ops: seed 0
    want = entry.reference(sample) if entry.reference is not None else eager(entry.op, sample)
    if entry.results is not None:
        want = [want[i] for i in entry.results]
    if entry.compare is not None:
        entry.compare(sample, got, want)
        return
    assert_outputs_close(entry, got, want)


def assert_outputs_close(entry: OpEntry, got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want), f"{len(got)} outputs, eager gives {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(w, torch.Tensor):
            assert g == w, f"output {i}: {g!r} != eager {w!r}"
            continue
        assert isinstance(g, torch.Tensor), f"output {i} is {type(g).__name__}"
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, eager {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {tuple(g.shape)}, eager {tuple(w.shape)}"
        tol = entry.tolerance(w.dtype)
        kw: dict[str, Any] = {"rtol": tol[0], "atol": tol[1]} if tol else {}
        prefix = f"{entry.op} output {i}: "
        torch.testing.assert_close(g, w, equal_nan=True, **kw,
                                   msg=lambda m: prefix + m)  # noqa: B023 (used at once)
