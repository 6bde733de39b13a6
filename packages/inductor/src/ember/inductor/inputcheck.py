"""One C call for a generated wrapper's input checks (wrapper.py), where a checker is registered.

A wrapper checks each tensor input's type, dtype and shape and makes it contiguous before a
kernel reads it by address: ~0.1 + 0.3 us per check and ~0.35 us per `.contiguous()` (which is
`self` for a contiguous tensor). LeViT's forward has 274 inputs (parameters, BatchNorm stats)
read by 536 kernel calls: ~0.4 ms a call on one thread, serial at any thread count. Where a
batch tensor checker is registered (the runtime's C tensor guard module, tensorcheck.py: exact
Python type, dtype, device, layout, requires_grad, sizes and strides of every tensor in one call,
~40 ns each), a graph with static input shapes checks all its tensor inputs with it: on a pass
every input is a plain tensor or Parameter of its declared dtype and shape with contiguous
strides, so the per-input checks and the kernels' `.contiguous()` calls are skipped; on a failure
the wrapper runs them all as before (same errors, same copies; the checks as one loop,
`InputCheck.each`).

The spec is learned from a call whose inputs all have their declared dtype, shape and device,
contiguous strides and a checked type: tried on the first call, then, while calls do not fit,
on calls 2, 4, 8, 16, ... (a first call with a transposed input alone still learns on the
next; a caller always passing strided inputs pays an attempt ever more rarely). Until then
(and where no checker is registered) every call takes the per-input path.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.ir import TensorType

_TYPES = (torch.Tensor, torch.nn.Parameter)
_provider: list[Callable[[], Any]] = []


def register_checker(provider: Callable[[], Any]) -> None:
    """`provider()` gives a module with `check(types, tensors, spec_bytes) -> bool` and
    `read(t) -> (ndim, dtype, device type, device index, layout, requires_grad, sizes,
    strides) | None` (tensorcheck.py's), or None where it is not available."""
    _provider[:] = [provider]


def _checker() -> Any:
    return _provider[0]() if _provider else None


def _never(types: Any, ts: Any, spec: Any) -> bool:
    return False


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out = [1] * len(shape)
    for d in reversed(range(len(shape) - 1)):
        out[d] = out[d + 1] * max(int(shape[d + 1]), 1)
    return tuple(out)


class InputCheck:
    """`check(types, tensors, spec)`: the generated call's one check of its tensor inputs
    (attributes read by the generated source, no Python frame once learned)."""

    def __init__(self, declared: list[TensorType], what: list[str],
                 bad: Callable[[str, Any, Any], None], copies: Sequence[int] = ()):
        self.copies = list(copies)  # the inputs `each` returns made contiguous (kernels')
        self.declared = declared
        self.what = what  # each input's name in errors ('input %x')
        self.bad = bad  # raises the wrapper's error
        self.shapes = [tuple(int(d) for d in t.shape) for t in declared]
        self.types: tuple[type, ...] = ()
        self.spec = b""
        self.check: Callable[[Any, tuple[Any, ...], bytes], bool] = self._learn
        self.learned = False
        self._wait = 0  # calls left before the next attempt to learn (`_later`)
        self._tries = 0

    def each(self, ts: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The per-input checks, where the batch check did not pass: every input a tensor,
        then each of its declared dtype and shape (the wrapper's own checks, in its order);
        then the inputs only kernels read (`copies`), contiguous."""
        for t, want, what in zip(ts, self.declared, self.what, strict=True):
            if not isinstance(t, torch.Tensor):
                self.bad(what, t, want)
        for t, want, shape, what in zip(ts, self.declared, self.shapes, self.what, strict=True):
            if t.dtype is not want.dtype.torch or t.shape != shape:
                self.bad(what, t, want)
        if not self.copies:
            return None
        return tuple(ts[k].contiguous() for k in self.copies)

    def _later(self, types: Any, ts: tuple[Any, ...], spec: Any) -> bool:
        """The check until learned, after a call that did not fit: the next attempt after
        as many calls as were made before it (2, 4, 8, ...)."""
        self._wait -= 1
        return self._learn(types, ts, spec) if self._wait <= 0 else False

    def _retry(self) -> bool:
        self._tries += 1
        self._wait = 1 << (self._tries - 1)
        self.check = self._later
        return False

    def _learn(self, types: Any, ts: tuple[Any, ...], spec: Any) -> bool:
        """The spec from these inputs where each is as declared and contiguous (then later
        calls take the C check; where they do not fit, a later call tries again); False
        either way (this call runs the per-input checks)."""
        self.check = _never
        mod = _checker()
        if mod is None or len(ts) != len(self.declared):
            return False
        words: list[int] = []
        for t, want, shape in zip(ts, self.declared, self.shapes, strict=True):
            if type(t) not in _TYPES or t.layout is not torch.strided \
                    or t.dtype is not want.dtype.torch or t.device != torch.device(want.device):
                return self._retry()
            got = mod.read(t)
            if got is None:
                return self._retry()
            nd, dt, dv, di, ly, rg, sizes, strides = got
            if nd != len(shape) or sizes != shape or strides != contiguous_strides(shape):
                return self._retry()
            words += [nd, dt, dv, di, ly, rg, *sizes, *strides]
        self.types = tuple(type(t) for t in ts)
        self.spec = struct.pack(f"={len(words)}q", *words)
        if mod.check(self.types, ts, self.spec) is not True:
            return False
        self.check = mod.check
        self.learned = True
        return False


__all__ = ["InputCheck", "contiguous_strides", "register_checker"]
