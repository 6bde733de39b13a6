"""The decomposition table: aten op name -> a plain Python function over `DecompContext`.

A decomposition's parameters are named as in the aten schema (`self`, `other`, `alpha`, ...);
arguments are bound by the schema, defaults filled in from it, so a decomposition never cares
whether the IR passed an argument positionally or by keyword. It returns a Value or a
list/tuple of Values, one per result of the aten op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ember.ir import DType, Value
from ember.ir.torch_ops import resolve
from ember.prims.decomp.context import DecompContext, DecompositionError

DecompFn = Callable[..., Any]


class DecompositionTable:
    def __init__(self) -> None:
        self._fns: dict[str, DecompFn] = {}

    def register(self, *ops: str) -> Callable[[DecompFn], DecompFn]:
        """Decorator: `fn` decomposes each of `ops` (full overload names, aten.add.Tensor)."""

        def deco(fn: DecompFn) -> DecompFn:
            for op in ops:
                if op in self._fns:
                    raise ValueError(f"{op} already has a decomposition "
                                     f"({self._fns[op].__module__}.{self._fns[op].__name__})")
                if resolve(op) is None:
                    raise ValueError(f"{op} is not a torch operator")
                self._fns[op] = fn
            return fn

        return deco

    def __contains__(self, op: str) -> bool:
        return op in self._fns

    def ops(self) -> list[str]:
        return sorted(self._fns)

    def get(self, op: str) -> DecompFn | None:
        return self._fns.get(op)

    def apply(self, ctx: DecompContext, op: str, args: Sequence[Any],
              kwargs: Mapping[str, Any]) -> Any:
        fn = self._fns.get(op)
        if fn is None:
            raise DecompositionError(f"ember.prims: no decomposition for {op}")
        return fn(ctx, **bind_schema(op, args, kwargs))


def bind_schema(op: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments by schema name, with the schema's defaults for the ones not given."""
    overload = resolve(op)
    if overload is None:
        raise DecompositionError(f"{op} is not a torch operator")
    schema = overload._schema.arguments
    positional = [a for a in schema if not a.kwarg_only]
    if len(args) > len(positional):
        raise DecompositionError(f"{op}: {len(args)} positional arguments, the schema takes "
                                 f"{len(positional)}")
    bound: dict[str, Any] = {a.name: v for a, v in zip(positional, args, strict=False)}
    names = {a.name for a in schema}
    for k, v in kwargs.items():
        if k not in names:
            raise DecompositionError(f"{op}: unknown argument {k}")
        if k in bound:
            raise DecompositionError(f"{op}: argument {k} given twice")
        bound[k] = v
    for a in schema:
        if a.name not in bound:
            if not a.has_default_value():
                raise DecompositionError(f"{op}: missing argument {a.name}")
            bound[a.name] = _default(a.default_value)
    return bound


def _default(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return DType.from_torch(v)
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return str(v).replace("torch.", "")
    if isinstance(v, tuple):
        return list(v)
    return v


DECOMPOSITIONS = DecompositionTable()
register_decomposition = DECOMPOSITIONS.register


def values_of(out: Any) -> list[Value]:
    if isinstance(out, Value):
        return [out]
    if isinstance(out, (list, tuple)) and all(isinstance(v, Value) for v in out):
        return list(out)
    raise DecompositionError(f"a decomposition returned {out!r}, not values")
