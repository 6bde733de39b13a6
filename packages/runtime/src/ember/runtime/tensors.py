"""Inputs and outputs of graph runs: safetensors files, random inputs, numeric comparison.

Tensors travel as safetensors, never pickle. Scalars (`i64`, `f64`, `bool` parameters and
results) are stored as 0-dim tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ember.ir import Graph, Module, ScalarKind, ScalarType, TensorType
from ember.ir.expr import ExprEvalError


class InputError(ValueError):
    """Inputs that do not fit the graph's parameters."""


_SCALAR_DTYPES = {ScalarKind.i64: torch.int64, ScalarKind.f64: torch.float64,
                  ScalarKind.bool: torch.bool}


def load_inputs(path: str, graph: Graph) -> list[Any]:
    """Inputs for `graph` from a safetensors file keyed by parameter name (without `%`)."""
    try:
        data = load_file(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except Exception as e:
        raise InputError(f"{path}: not a readable safetensors file ({e})") from None
    missing = [p.name for p in graph.params if p.name not in data]
    if missing:
        raise InputError(f"{path}: no tensor for parameter(s) {', '.join(missing)} "
                         f"(keys: {', '.join(sorted(data)) or 'none'})")
    return [from_stored(data[p.name], p.type, p.name) for p in graph.params]


def from_stored(t: torch.Tensor, ty: TensorType | ScalarType, name: str) -> Any:
    if isinstance(ty, ScalarType):
        if t.numel() != 1:
            raise InputError(f"parameter {name} is a scalar {ty}, the file holds shape "
                             f"{tuple(t.shape)}")
        v = t.reshape(()).item()
        return {ScalarKind.i64: int, ScalarKind.f64: float, ScalarKind.bool: bool}[ty.kind](v)
    if ty.device != "cpu":
        t = t.to(ty.device)
    return t


def to_stored(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().contiguous().clone()
    if isinstance(x, bool):
        return torch.tensor(x, dtype=torch.bool)
    if isinstance(x, int):
        return torch.tensor(x, dtype=torch.int64)
    if isinstance(x, float):
        return torch.tensor(x, dtype=torch.float64)
    raise InputError(f"cannot store a result of kind {type(x).__name__}")


def save_tensors(path: str, tensors: Mapping[str, Any]) -> None:
    save_file({k: to_stored(v) for k, v in tensors.items()}, path)


def random_inputs(module: Module, graph: Graph, seed: int = 0) -> list[Any]:
    """Random inputs at the symbols' hints: floats ~ N(0, 1), integers and bools in [0, 2)
    (so index inputs stay valid)."""
    gen = torch.Generator().manual_seed(seed)
    hints = module.hints()
    out: list[Any] = []
    for p in graph.params:
        t = p.type
        if isinstance(t, ScalarType):
            r = int(torch.randint(0, 2, (), generator=gen))
            out.append({ScalarKind.i64: r, ScalarKind.f64: float(torch.randn((), generator=gen)),
                        ScalarKind.bool: bool(r)}[t.kind])
            continue
        try:
            shape = t.concrete_shape(hints)
        except ExprEvalError as e:
            raise InputError(f"parameter %{p.name}: {e}; random inputs need a hint for every "
                             f"symbol") from None
        dt = t.dtype.torch
        if dt.is_floating_point:
            x = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
        elif dt.is_complex:
            x = torch.randn(shape, generator=gen, dtype=torch.complex64).to(dt)
        elif dt == torch.bool:
            x = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            x = torch.randint(0, 2, shape, generator=gen).to(dt)
        if t.strides is not None and all(isinstance(s, int) for s in t.strides):
            # honour a declared layout: fill a buffer of the right extent through a view
            strides = [int(s) for s in t.strides]
            extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if n)
            x = torch.empty(extent, dtype=dt).as_strided(shape, strides).copy_(x)
        if t.device != "cpu":
            x = x.to(t.device)
        out.append(x)
    return out


@dataclass
class Mismatch:
    where: str
    detail: str
    max_abs: float = 0.0


def compare(expected: Sequence[Any], actual: Sequence[Any], names: Sequence[str]
            ) -> tuple[list[Mismatch], float]:
    """Compare results with `torch.testing.assert_close` defaults per dtype (NaNs equal).

    Returns the mismatches and the worst absolute error seen."""
    bad: list[Mismatch] = []
    worst = 0.0
    for name, e, a in zip(names, expected, actual, strict=True):
        te, ta = to_stored(e), to_stored(a)
        if te.shape != ta.shape or te.dtype != ta.dtype:
            bad.append(Mismatch(name, f"{ta.dtype} {tuple(ta.shape)} vs expected "
                                      f"{te.dtype} {tuple(te.shape)}"))
            continue
        err = _max_abs(te, ta)
        worst = max(worst, err)
        try:
            torch.testing.assert_close(ta, te, equal_nan=True)
        except AssertionError as ex:
            first = str(ex).strip().splitlines()[0]
            bad.append(Mismatch(name, f"max abs error {err:.3g}: {first}", err))
    return bad, worst


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool:
        return float((a != b).any())
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.to(wide), b.to(wide)
    same = (x == y) | (x.isnan() & y.isnan())  # equal infinities and NaN positions count as 0
    d = torch.where(same, torch.zeros_like(x.real), (x - y).abs())
    return float(torch.nan_to_num(d, nan=float("inf")).max())
