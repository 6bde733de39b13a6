"""Value types: tensors (dtype, shape, optional strides, device) and Python scalars."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ember.ir.dtypes import DType
from ember.ir.expr import Dim, evaluate, free_symbol_names, simplify_dim, to_text


class ScalarKind(enum.Enum):
    """Python scalars: `i64` (also a size read from a tensor), `f64`, `bool`."""

    i64 = "i64"
    f64 = "f64"
    bool = "bool"


@dataclass(frozen=True)
class ScalarType:
    kind: ScalarKind

    def __str__(self) -> str:
        return self.kind.value

    def free_symbols(self) -> set[str]:
        return set()


@dataclass(frozen=True)
class TensorType:
    """A tensor type. Dims are ints or sympy expressions over the module's symbols.

    `strides` is None unless a layout is meant (buffer-level kernels, inputs a compiled graph
    relies on). `device` is a torch device string; "cpu" is the default and never printed.
    """

    dtype: DType
    shape: tuple[Dim, ...]
    strides: tuple[Dim, ...] | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(simplify_dim(d) for d in self.shape))
        if self.strides is not None:
            # A 0-dim tensor has no strides to state (ir-v1 needs at least one in `{...}`).
            strides = tuple(simplify_dim(d) for d in self.strides)
            object.__setattr__(self, "strides", strides or None)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        text = f"{self.dtype.name}[{', '.join(to_text(d) for d in self.shape)}]"
        if self.strides is not None:
            text += "{" + ", ".join(to_text(d) for d in self.strides) + "}"
        if self.device != "cpu":
            text += f"@{self.device}"
        return text

    def free_symbols(self) -> set[str]:
        out: set[str] = set()
        for d in self.shape + (self.strides or ()):
            out |= free_symbol_names(d)
        return out

    def concrete_shape(self, env: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(d, env) for d in self.shape)

    def with_shape(self, shape: Sequence[Dim]) -> TensorType:
        return TensorType(self.dtype, tuple(shape), None, self.device)

    @staticmethod
    def of(t: torch.Tensor, *, strides: bool = False) -> TensorType:
        """The type of a concrete tensor (device normalised as torch prints it)."""
        return TensorType(
            DType.from_torch(t.dtype),
            tuple(int(s) for s in t.shape),
            tuple(int(s) for s in t.stride()) if strides else None,
            device_text(t.device),
        )


Type = TensorType | ScalarType

I64 = ScalarType(ScalarKind.i64)
F64 = ScalarType(ScalarKind.f64)
BOOL = ScalarType(ScalarKind.bool)


def device_text(d: torch.device | str) -> str:
    d = torch.device(d)
    return d.type if d.index is None else f"{d.type}:{d.index}"


def scalar_type_of(v: object) -> ScalarType:
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return I64
    if isinstance(v, float):
        return F64
    raise TypeError(f"{type(v).__name__} is not an ir-v1 scalar")
