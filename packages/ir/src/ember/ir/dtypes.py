"""Element types of ir-v1, in one table.

Each row: IR name, torch dtype, and the class the type rules care about.
"""

from __future__ import annotations

import enum

import torch

_TorchDType = torch.dtype  # `torch` is also a property name inside DType


class DType(enum.Enum):
    """An ir-v1 element type. `DType.f32.name == "f32"`; `.torch` is the torch dtype."""

    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    f8e4m3fn = "f8e4m3fn"
    f8e5m2 = "f8e5m2"
    f8e4m3fnuz = "f8e4m3fnuz"
    f8e5m2fnuz = "f8e5m2fnuz"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"
    b8 = "b8"
    c32 = "c32"
    c64 = "c64"
    c128 = "c128"

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    @property
    def torch(self) -> _TorchDType:
        return _TO_TORCH[self]

    @property
    def is_floating(self) -> bool:
        return self.torch.is_floating_point

    @property
    def is_complex(self) -> bool:
        return self.torch.is_complex

    @property
    def is_integer(self) -> bool:
        return not (self.is_floating or self.is_complex or self is DType.b8)

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize

    @staticmethod
    def from_torch(dt: _TorchDType) -> DType:
        try:
            return _FROM_TORCH[dt]
        except KeyError:
            raise ValueError(f"torch dtype {dt} has no ir-v1 name") from None


_TO_TORCH: dict[DType, torch.dtype] = {
    DType.f16: torch.float16,
    DType.bf16: torch.bfloat16,
    DType.f32: torch.float32,
    DType.f64: torch.float64,
    DType.f8e4m3fn: torch.float8_e4m3fn,
    DType.f8e5m2: torch.float8_e5m2,
    DType.f8e4m3fnuz: torch.float8_e4m3fnuz,
    DType.f8e5m2fnuz: torch.float8_e5m2fnuz,
    DType.i8: torch.int8,
    DType.i16: torch.int16,
    DType.i32: torch.int32,
    DType.i64: torch.int64,
    DType.u8: torch.uint8,
    DType.u16: torch.uint16,
    DType.u32: torch.uint32,
    DType.u64: torch.uint64,
    DType.b8: torch.bool,
    DType.c32: torch.complex32,
    DType.c64: torch.complex64,
    DType.c128: torch.complex128,
}
_FROM_TORCH: dict[torch.dtype, DType] = {v: k for k, v in _TO_TORCH.items()}

DTYPE_NAMES: frozenset[str] = frozenset(d.name for d in DType)
