"""Which input dims a capture makes symbolic: compile()'s `dynamic=` and the marking API.

- `dynamic=False`: never (every new shape is a new capture, as before).
- `dynamic=True`: every dim of every tensor the caller passes, from the first call.
- `dynamic=None` (the default, torch.compile's automatic dynamic): the first call specializes;
  a later capture makes symbolic each dim whose size differs from an earlier capture's for the
  same argument, and it stays symbolic from then on.

`mark_dynamic(t, dim, min=, max=)` makes a dim symbolic from the first call (in its range) unless
`dynamic=False`; `mark_static(t, dim)` keeps it static whatever `dynamic` says. Sizes 0 and 1 are
always static (a size-1 dim broadcasts: torch specializes it too). Module parameters and buffers
keep static shapes. The capture side (ember.capture.symbolic) does the rest.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ember.capture.symbolic import Policy

_DYN = "_ember_dynamic_dims"
_STATIC = "_ember_static_dims"


def _dims(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    out = []
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"dim {d!r} is out of range for a tensor of {t.dim()} dims")
        out.append(d % t.dim())
    return out


def mark_dynamic(t: torch.Tensor, dim: int | list[int] | tuple[int, ...], *,
                 min: int | None = None, max: int | None = None) -> None:  # noqa: A002
    """Make `t`'s dim (or dims) symbolic in the captures of calls that pass `t`, with sizes
    in [min, max] (default [2, inf)); a call outside the range recompiles."""
    lo = 2 if min is None else min
    hi: int | float = math.inf if max is None else max
    if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0 or \
            (hi != math.inf and (not isinstance(hi, int) or isinstance(hi, bool))) or hi < lo:
        raise ValueError(f"mark_dynamic: need 0 <= min <= max, got min={min!r}, max={max!r}")
    marks = dict(getattr(t, _DYN, {}))
    for d in _dims(t, dim):
        marks[d] = (max_(lo, 2), hi)
    setattr(t, _DYN, marks)
    static = set(getattr(t, _STATIC, set())) - set(marks)
    setattr(t, _STATIC, static)


def max_(a: int, b: int) -> int:
    return a if a > b else b


def mark_static(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Keep `t`'s dim (or dims) static, whatever compile()'s `dynamic` says."""
    static = set(getattr(t, _STATIC, set())) | set(_dims(t, dim))
    setattr(t, _STATIC, static)
    marks = {d: r for d, r in getattr(t, _DYN, {}).items() if d not in static}
    setattr(t, _DYN, marks)


class DynamicPolicy(Policy):
    """compile()'s policy for one compiled function: its mode and the sizes seen so far."""

    def __init__(self, mode: bool | None):
        self.mode = mode
        self.seen: dict[str, tuple[int, ...]] = {}  # argument -> its shape at the last capture
        self.changed: dict[str, set[int]] = {}  # argument -> dims seen with two sizes
        self.ints: dict[str, int] = {}  # Python int argument -> its value at the last capture
        self.changed_ints: set[str] = set()  # int arguments seen with two values

    def int_range(self, where: str, value: int) -> tuple[int, int | float] | None:
        """A Python int argument is a size symbol under dynamic=True, and under dynamic=None
        once a capture saw it change (as a dim is); 0 and 1 stay static."""
        old = self.ints.get(where)
        self.ints[where] = value
        if old is not None and old != value:
            self.changed_ints.add(where)
        if self.mode is False or value < 2 or (not self.mode and where not in self.changed_ints):
            return None
        return (2, math.inf)

    def dims(self, where: str, real: Any) -> dict[int, tuple[int, int | float]]:
        if self.mode is False or not isinstance(real, torch.Tensor) or \
                isinstance(real, torch.nn.Parameter):
            return {}
        shape = tuple(real.shape)
        static: set[int] = set(getattr(real, _STATIC, set()))
        out: dict[int, tuple[int, int | float]] = {}
        old = self.seen.get(where)
        if old is not None and len(old) == len(shape):
            self.changed.setdefault(where, set()).update(
                d for d, (a, b) in enumerate(zip(old, shape, strict=True)) if a != b)
        auto = set(range(len(shape))) if self.mode else self.changed.get(where, set())
        for d in auto:
            out[d] = (2, math.inf)
        out.update(getattr(real, _DYN, {}))
        return {d: r for d, r in out.items() if d not in static and shape[d] >= 2
                and r[0] <= shape[d] <= r[1]}

    def observe(self, where: str, real: Any) -> None:
        """A capture took `real` for argument `where`: later sizes are compared with it."""
        if isinstance(real, torch.Tensor):
            self.seen[where] = tuple(real.shape)
