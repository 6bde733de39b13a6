"""Inputs and outputs of graph runs: safetensors files, random inputs, numeric comparison.

Tensors travel as safetensors, never pickle. Scalars (`i64`, `f64`, `bool` parameters and
results) are stored as 0-dim tensors.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ember.ir import DType, Graph, InterpretError, Module, ScalarKind, ScalarType, TensorType
from ember.ir.expr import ExprEvalError, evaluate
from ember.ir.interpreter import bind_symbols


class InputError(ValueError):
    """Inputs that do not fit the graph's parameters."""


# What safetensors can hold (it has no complex32/complex128).
_STORABLE = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
             torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32,
             torch.uint64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
             torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.complex64}
MAX_INPUT_BYTES_ENV = "EMBER_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 4 << 30  # random inputs beyond this are a typo, not a test
_RESULT_KEY = re.compile(r"out[0-9]+")
_I64 = (-(2**63), 2**63 - 1)


def parse_size(text: str) -> int:
    """A byte count: `123`, `512M`, `4G`, `1T` (powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if m is None:
        raise InputError(f"{text!r} is not a size (e.g. 4096, 512M, 8G)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]


def max_input_bytes(flag: str | None = None) -> int:
    """The limit on random input data: the flag, else the environment, else 4 GiB."""
    text = flag if flag is not None else os.environ.get(MAX_INPUT_BYTES_ENV)
    if text is None:
        return DEFAULT_MAX_INPUT_BYTES
    try:
        return parse_size(text)
    except InputError as e:
        where = "--max-input-bytes" if flag is not None else MAX_INPUT_BYTES_ENV
        raise InputError(f"{where}: {e}") from None


def check_device(device: str, what: str) -> torch.device:
    """The torch device a type names, refused when it is unknown or absent on this machine."""
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise InputError(f"{what}: unknown device {device!r}") from None
    if d.type == "cpu":
        return d
    if d.type == "meta":
        raise InputError(f"{what}: device 'meta' holds no data to run on")
    backend = getattr(torch, d.type, None)
    available = getattr(backend, "is_available", None)
    if not callable(available) or not available():
        raise InputError(f"{what}: device {device!r} is not available on this machine")
    count = getattr(backend, "device_count", None)
    if d.index is not None and callable(count) and d.index >= count():
        raise InputError(f"{what}: device {device!r} does not exist ({count()} present)")
    return d


def load_inputs(path: str, graph: Graph, module: Module | None = None, *,
                optional: dict[str, Any] | None = None) -> list[Any]:
    """Inputs for `graph` from a safetensors file keyed by parameter name (without `%`).

    Every stored tensor must match its parameter's declared type exactly (dtype, rank, sizes,
    a symbol bound once and within its declared min/max); a scalar parameter takes a 0-dim
    tensor of its kind, or one that converts losslessly (an integer for `f64`). A key of
    `optional` that names no parameter is stored there instead of being refused."""
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not a safetensors file")
    try:
        data = load_file(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except Exception as e:
        raise InputError(f"{path}: not a readable safetensors file ({e})") from None
    # safetensors hands out tensors at the file's offsets (8-byte aligned); some CPUs' BLAS
    # round differently on such memory than on torch's 64-byte aligned allocations, which a
    # live run has: a copy keeps replays bitwise equal to the run that wrote the file.
    data = {k: v.clone() for k, v in data.items()}
    names = [p.name for p in graph.params]
    missing = [n for n in names if n not in data]
    if missing:
        raise InputError(f"{path}: no tensor for parameter(s) {', '.join(missing)} "
                         f"(keys: {', '.join(sorted(data)) or 'none'})")
    extra = sorted(set(data) - set(names))
    if optional is not None:
        optional.update({k: data[k] for k in extra if k in optional})
        extra = [k for k in extra if k not in optional]
    if extra:
        raise InputError(f"{path}: tensor(s) {', '.join(extra)} name no parameter of "
                         f"@{graph.name} (parameters: {', '.join(names) or 'none'})")
    inputs = [from_stored(data[p.name], p.type, p.name) for p in graph.params]
    return check_inputs(module, graph, inputs)


def from_stored(t: torch.Tensor, ty: TensorType | ScalarType, name: str) -> Any:
    if isinstance(ty, ScalarType):
        return _scalar_from(t, ty, name)
    if t.dtype != ty.dtype.torch:
        raise InputError(f"parameter %{name} is declared {ty}, the file holds "
                         f"{_dtype_text(t.dtype)}{list(t.shape)}")
    if t.dim() != ty.rank:
        raise InputError(f"parameter %{name} is declared {ty} (rank {ty.rank}), the file "
                         f"holds {_dtype_text(t.dtype)}{list(t.shape)}")
    return t


def _scalar_from(t: torch.Tensor, ty: ScalarType, name: str) -> Any:
    given = f"{_dtype_text(t.dtype)}{list(t.shape)}"
    if t.dim() != 0:
        raise InputError(f"parameter %{name} is a scalar {ty}, the file holds {given} (store "
                         f"a 0-dim tensor)")
    v = t.item()
    dt = t.dtype
    integer = not (dt.is_floating_point or dt.is_complex or dt == torch.bool)
    if ty.kind is ScalarKind.bool and dt == torch.bool:
        return bool(v)
    if ty.kind is ScalarKind.i64 and integer and _I64[0] <= int(v) <= _I64[1]:
        return int(v)
    if ty.kind is ScalarKind.f64 and dt.is_floating_point:
        return float(v)  # every float dtype widens to f64 exactly
    if ty.kind is ScalarKind.f64 and integer and float(v) == v:
        return float(v)  # an integer f64 represents exactly
    why = "" if integer or ty.kind is not ScalarKind.i64 else " (no float or bool for i64)"
    raise InputError(f"parameter %{name} is a scalar {ty}, the file holds {given} = {v!r}, "
                     f"which does not convert to {ty} exactly{why}")


def _dtype_text(dt: torch.dtype) -> str:
    try:
        return DType.from_torch(dt).name
    except (KeyError, ValueError):
        return str(dt).replace("torch.", "")


def check_inputs(module: Module | None, graph: Graph, inputs: list[Any]) -> list[Any]:
    """Bind the graph's symbols from the inputs (each within its declared min/max, one size per
    symbol), check every dim, and give each tensor its declared device and layout."""
    symbols = module.symbols if module is not None else None
    try:
        env = bind_symbols(graph, inputs, symbols)
    except InterpretError as e:
        raise InputError(str(e)) from None
    out: list[Any] = []
    for p, x in zip(graph.params, inputs, strict=True):
        t = p.type
        if isinstance(t, TensorType):
            x = _placed(x, t, tuple(x.shape), env, f"parameter %{p.name}")
        out.append(x)
    return out


def _strides(t: TensorType, env: Mapping[str, int], what: str) -> list[int] | None:
    if t.strides is None:
        return None
    try:
        strides = [evaluate(s, env) for s in t.strides]
    except ExprEvalError as e:
        raise InputError(f"{what}: the strides of {t}: {e}") from None
    if any(s < 0 for s in strides):
        raise InputError(f"{what}: {t} has a negative stride, which torch cannot allocate")
    return strides


def _placed(x: torch.Tensor, t: TensorType, shape: tuple[int, ...], env: Mapping[str, int],
            what: str) -> torch.Tensor:
    """`x` on the declared device, laid out with the declared strides."""
    device = check_device(t.device, what)
    strides = _strides(t, env, what)
    if strides is not None and list(x.stride()) != strides:
        # honour a declared layout: fill a buffer of the right extent through a view
        x = torch.empty(_extent(shape, strides), dtype=x.dtype).as_strided(shape, strides) \
            .copy_(x)
    return x.to(device) if device.type != "cpu" else x


def _extent(shape: Sequence[int], strides: Sequence[int]) -> int:
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def to_stored(x: Any) -> torch.Tensor:
    """`x` as safetensors can write it (a scalar as a 0-dim tensor)."""
    if isinstance(x, torch.Tensor) and x.dtype not in _STORABLE:
        raise InputError(f"safetensors cannot hold {_dtype_text(x.dtype)} tensors")
    return _as_tensor(x)


def _as_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise InputError("a tensor on device 'meta' holds no data")
        return x.detach().cpu().contiguous().clone()
    if isinstance(x, bool):
        return torch.tensor(x, dtype=torch.bool)
    if isinstance(x, int):
        if not _I64[0] <= x <= _I64[1]:
            raise InputError(f"the integer {x} does not fit an i64")
        return torch.tensor(x, dtype=torch.int64)
    if isinstance(x, float):
        return torch.tensor(x, dtype=torch.float64)
    raise InputError(f"cannot store a result of kind {type(x).__name__}")


def save_tensors(path: str, tensors: Mapping[str, Any]) -> None:
    stored = {}
    for k, v in tensors.items():
        try:
            stored[k] = to_stored(v)
        except InputError as e:
            raise InputError(f"{k}: {e}") from None
    save_file(stored, path)


def check_result_names(graph: Graph) -> None:
    """`out<N>` keys are the outputs' alone, so an output file's keys say which is which: a graph
    that updates a parameter with such a name is refused rather than written ambiguously."""
    for p, _r in graph.input_updates:
        name = graph.params[p].name
        if _RESULT_KEY.fullmatch(name):
            raise InputError(f"@{graph.name} updates parameter %{name}, and names of the form "
                             f"out<N> are reserved for its outputs in the --out file: rename "
                             f"the parameter")


def check_storable(graph: Graph, *, results: bool, params: bool) -> None:
    """Refuse, before a run, to write a tensor type safetensors cannot hold (c32, c128)."""
    typed = [(f"result {i}", t) for i, t in enumerate(graph.result_types) if results]
    typed += [(f"parameter %{p.name}", p.type) for p in graph.params if params]
    for what, t in typed:
        if isinstance(t, TensorType) and t.dtype.torch not in _STORABLE:
            raise InputError(f"@{graph.name} {what} is {t}: safetensors cannot hold "
                             f"{t.dtype.name} tensors")


def result_names(graph: Graph, outputs: Sequence[Any], updates: Mapping[int, Any]
                 ) -> dict[str, Any]:
    """Keys for a run's results: `out0`, `out1`, ... for the outputs, the parameter's name for
    an updated parameter (so the file can feed the next run as its inputs)."""
    check_result_names(graph)
    named = {f"out{i}": o for i, o in enumerate(outputs)}
    named.update({graph.params[p].name: v for p, v in updates.items()})
    return named


def random_inputs(module: Module, graph: Graph, seed: int = 0,
                  max_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> list[Any]:
    """Random inputs at the symbols' hints: floats ~ N(0, 1), integers and bools in [0, 2)
    (so index inputs stay valid). Refused when they would take more than `max_bytes`."""
    if not 0 <= seed < 2**64:
        raise InputError(f"--seed {seed}: a seed lies in [0, 2**64)")
    gen = torch.Generator().manual_seed(seed)
    hints = module.hints()
    plans: list[tuple[TensorType, tuple[int, ...], str] | None] = []
    total = 0
    for p in graph.params:
        t = p.type
        if isinstance(t, ScalarType):
            plans.append(None)
            continue
        what = f"parameter %{p.name}"
        try:
            shape = t.concrete_shape(hints)
        except ExprEvalError as e:
            raise InputError(f"{what}: {e}; random inputs need a hint for every symbol") \
                from None
        if any(n < 0 for n in shape):
            raise InputError(f"{what}: {t} has a negative size {list(shape)} at the hints")
        check_device(t.device, what)
        strides = _strides(t, hints, what)
        n = _extent(shape, strides) if strides is not None else math.prod(shape)
        total += n * t.dtype.torch.itemsize
        if total > max_bytes:
            raise InputError(f"{what}: random inputs up to it take {total:,} bytes, more than "
                             f"the limit of {max_bytes:,} (raise it with --max-input-bytes "
                             f"or {MAX_INPUT_BYTES_ENV})")
        plans.append((t, shape, what))
    out: list[Any] = []
    for p, plan in zip(graph.params, plans, strict=True):
        if plan is None:
            assert isinstance(p.type, ScalarType)
            kind = p.type.kind
            r = int(torch.randint(0, 2, (), generator=gen))
            out.append({ScalarKind.i64: r, ScalarKind.f64: float(torch.randn((), generator=gen)),
                        ScalarKind.bool: bool(r)}[kind])
            continue
        t, shape, what = plan
        dt = t.dtype.torch
        if dt.is_floating_point:
            x = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
        elif dt.is_complex:
            x = torch.randn(shape, generator=gen, dtype=torch.complex64).to(dt)
        elif dt == torch.bool:
            x = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            x = torch.randint(0, 2, shape, generator=gen).to(dt)
        out.append(_placed(x, t, shape, hints, what))
    return check_inputs(module, graph, out)


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
        te, ta = _as_tensor(e), _as_tensor(a)
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
