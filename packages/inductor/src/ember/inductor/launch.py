"""The one launch path of compiled kernels, and the loaders of kernel languages.

A kernel block (`kernel @k cpp`) is built by the loader registered for its language
(`register_loader("cpp", ...)`: the CPU target's g++ loader; a Triton loader would be another
entry). A loader builds all of a module's blocks in its language at once and returns, per
kernel, a `LoadedKernel`: the callable and its ABI, `"pointer"` (each buffer passed as its data
address, inputs then outputs, buffers contiguous, then the int64 values of the size symbols
named by the call's `sizes=`) or `"tensor"` (the torch tensors themselves, then the sizes).
`kernels.call`'s reference (the interpreter) and the generated wrapper (wrapper.py) both allocate
outputs with `out_buffer` (on the call's device, reusing a dead buffer's storage where `reuse=`
names one), call `LoadedKernel.launch`/`launcher`, then `check` (an integer division by zero
flagged by the kernel raises eager's error).
"""

from __future__ import annotations

import ctypes
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.ir import Interpreter, Kernel, Module

ABIS = ("pointer", "tensor")


class LoadError(RuntimeError):
    """A module's kernel blocks cannot be loaded (no loader for their language, a build
    error, a missing symbol)."""


@dataclass
class LoadedKernel:
    fn: Any  # a ctypes function ("pointer") or a Python callable ("tensor")
    abi: str = "pointer"
    take_errors: Callable[[], Any] | None = None  # nonzero: the kernel divided by zero
    # "pointer": (fn, argument count) -> a cheaper callable of the same ints, or None (the
    # ctypes call then; targets/cpu/trampoline.py), made once per count
    fast: Callable[[Any, int], Callable[..., Any] | None] | None = None
    _callers: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)

    def launcher(self, nargs: int, nsizes: int = 0) -> Callable[..., Any]:
        """The callable to call with `nargs` buffers converted by `arg`, then `nsizes` ints
        (the values of the size symbols the kernel takes: kernels.call's sizes=)."""
        if self.abi == "pointer":
            count = nargs + nsizes
            if self.fast is not None:
                if count not in self._callers:
                    self._callers[count] = self.fast(self.fn, count)
                if self._callers[count] is not None:
                    return self._callers[count]  # type: ignore[no-any-return]
            self.fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_int64] * nsizes
            self.fn.restype = None
        return self.fn  # type: ignore[no-any-return]

    def arg(self, t: torch.Tensor) -> Any:
        return t.data_ptr() if self.abi == "pointer" else t

    def check(self) -> None:
        if self.take_errors is not None and self.take_errors():
            # eager's message for an integer division or modulo by zero on the CPU
            raise RuntimeError("ZeroDivisionError")

    def launch(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
               sizes: Sequence[int] = ()) -> None:
        bufs = [*ins, *outs]
        self.launcher(len(bufs), len(sizes))(*[self.arg(t) for t in bufs],
                                             *[int(s) for s in sizes])
        self.check()


# a language's loader: (module, its kernel blocks in that language) -> kernel name -> kernel;
# blocks that define no kernel (a prelude of helpers) are absent from the result
LoadFn = Callable[[Module, list[Kernel]], dict[str, LoadedKernel]]


@dataclass(frozen=True)
class Loader:
    lang: str
    load: LoadFn
    devices: tuple[str, ...]  # the device kinds its kernels run on
    launch_attrs: bool = False  # whether kernels.call may carry launch=[...] (grid sizes)


_LOADERS: dict[str, Loader] = {}


def register_loader(lang: str, load: LoadFn, *, devices: Sequence[str] = ("cpu",),
                    launch_attrs: bool = False) -> Loader:
    """Register the loader of a kernel language; registering a language twice is an error."""
    if lang in _LOADERS:
        raise ValueError(f"a loader for kernel language {lang!r} is already registered")
    ld = Loader(lang, load, tuple(devices), launch_attrs)
    _LOADERS[lang] = ld
    return ld


def unregister_loader(lang: str) -> None:
    """Remove a loader (tests that register their own)."""
    _LOADERS.pop(lang, None)


def loaders() -> dict[str, Loader]:
    return dict(_LOADERS)


def loader(lang: str) -> Loader:
    ld = _LOADERS.get(lang)
    if ld is None:
        raise LoadError(f"no loader is registered for kernel language {lang!r} (registered: "
                        f"{', '.join(sorted(_LOADERS)) or 'none'})")
    return ld


def load_module(m: Module) -> dict[str, LoadedKernel]:
    """Build (or find in a cache) every kernel block of a module, by its language's loader."""
    by_lang: dict[str, list[Kernel]] = {}
    for k in m.kernels.values():
        by_lang.setdefault(k.lang, []).append(k)
    table: dict[str, LoadedKernel] = {}
    for lang, blocks in by_lang.items():
        table.update(loader(lang).load(m, blocks))
    return table


_TABLES: weakref.WeakKeyDictionary[Interpreter, dict[str, LoadedKernel]] = \
    weakref.WeakKeyDictionary()


def table_for(interp: Interpreter) -> dict[str, LoadedKernel]:
    """The loaded kernels of the interpreter's module (loaded once per interpreter)."""
    table = _TABLES.get(interp)
    if table is None:
        table = _TABLES[interp] = load_module(interp.module)
    return table


def kernel(table: dict[str, LoadedKernel], name: str) -> LoadedKernel:
    k = table.get(name)
    if k is None:
        raise LoadError(f"kernel @{name}: its block defines no kernel")
    return k


def out_buffer(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str,
               old: Any = None) -> torch.Tensor:
    """A kernel's output buffer on `device`: a dead buffer's storage (`old`, named by reuse=:
    same dtype and device, contiguous, as many elements) viewed at `shape`, else a new one."""
    if isinstance(old, torch.Tensor) and old.dtype == dtype and old.is_contiguous() \
            and old.device == torch.device(device) and old.numel() == math.prod(shape):
        return old.view(list(shape))
    return torch.empty(list(shape), dtype=dtype, device=device)


def strided_view(x: torch.Tensor, shape: Sequence[int], offsets: Sequence[int],
                 coefs: Sequence[Sequence[int]]) -> torch.Tensor:
    """loop.view's strided view of `x` (result[i] = x[offsets + coefs @ i]) on x's real
    strides; bounds were checked by the type rule."""
    st = x.stride()
    strides = [sum(c[k] * s for c, s in zip(coefs, st, strict=True)) for k in range(len(shape))]
    off = x.storage_offset() + sum(o * s for o, s in zip(offsets, st, strict=True))
    return x.as_strided(list(shape), strides, off)


__all__ = ["ABIS", "LoadError", "LoadedKernel", "Loader", "kernel", "load_module", "loader",
           "loaders", "out_buffer", "register_loader", "strided_view", "table_for",
           "unregister_loader"]
