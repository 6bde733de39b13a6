"""The op database: the center of ember's verification.

One `OpEntry` per aten overload ember knows: a hypothesis strategy of valid samples (shapes with
0- and 1-sized dims, broadcasting, non-contiguous layouts, dtypes, attributes), per-dtype
tolerances wider than `torch.testing.assert_close`'s defaults only with a reason, and which
checks apply. Generic tests run every check over every entry (packages/prims/tests/
test_opdb.py); later layers add their checks (vjp, cpu kernel, triton kernel) to the same
entries. Entries are declared in the `entries_*` modules next to this one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

# The checks a later layer adds to every entry; `gaps` exempts an entry with a reason.
CHECKS = ("decomposition", "vjp", "cpu kernel", "triton kernel")

# What each later layer's check covers so far (families, skipped ops with reasons) is declared
# in that layer's data file `packages/<layer>/tests/opdb_*.toml`, read by its test and by
# coverage.py for docs/ops.md (see coverage.py: ember.testing imports no layer above prims).


@dataclass(frozen=True)
class Sample:
    """Arguments of one call of the op: tensors, Python values, dtypes, lists of these."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        def show(v: Any) -> str:
            if isinstance(v, torch.Tensor):
                lay = "" if v.is_contiguous() else f" stride={v.stride()}"
                return f"tensor({str(v.dtype)[6:]}{list(v.shape)}{lay})"
            if isinstance(v, (list, tuple)):
                return "[" + ", ".join(show(x) for x in v) + "]"
            return repr(v)
        parts = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        return f"Sample({', '.join(parts)})"


Compare = Callable[[Sample, Any, Any], None]


@dataclass(frozen=True)
class OpEntry:
    op: str  # the aten overload, e.g. "aten.add.Tensor"
    samples: Callable[[], st.SearchStrategy[Sample]]
    family: str  # pointwise, reduction, normalization, shape, ...
    # dtype -> (rtol, atol) where the default assert_close tolerance is too tight, and why
    tol: Mapping[torch.dtype, tuple[float, float]] = field(default_factory=dict)
    tol_reason: str = ""
    # traced with symbolic sizes too (False for ops whose size arguments are literals)
    symbolic: bool = True
    # a custom comparison (e.g. sort indices under ties); default: assert_close per output
    compare: Compare | None = None
    # checks that do not apply yet, with the reason: {"vjp": "not built yet"}
    gaps: Mapping[str, str] = field(default_factory=dict)
    # what stands in for calling the op eagerly where eager cannot run here (a CUDA-only
    # kernel on a CPU machine): sample -> expected outputs; say why where it is set
    reference: Callable[[Sample], list[Any]] | None = None
    # which of the op's results the test graph returns (default: all); a scalar result that a
    # decomposition gives as a literal cannot be a graph output
    results: tuple[int, ...] | None = None

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float] | None:
        return self.tol.get(dtype)


class OpDB:
    def __init__(self) -> None:
        self._entries: dict[str, OpEntry] = {}

    def add(self, entry: OpEntry) -> OpEntry:
        if entry.tol and not entry.tol_reason:
            raise ValueError(f"{entry.op}: a wider tolerance needs a reason")
        if entry.op in self._entries:
            raise ValueError(f"{entry.op} is already in the op database")
        self._entries[entry.op] = entry
        return entry

    def __getitem__(self, op: str) -> OpEntry:
        return self._entries[op]

    def __contains__(self, op: str) -> bool:
        return op in self._entries

    def entries(self) -> list[OpEntry]:
        return [self._entries[k] for k in sorted(self._entries)]


OPDB = OpDB()


def entry(op: str, samples: Callable[[], st.SearchStrategy[Sample]], family: str,
          **kw: Any) -> OpEntry:
    return OPDB.add(OpEntry(op, samples, family, **kw))


def load_all() -> OpDB:
    """Import every `entries_*` module of this package (each adds its entries to OPDB)."""
    import ember.testing as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("entries_"):
            importlib.import_module(f"{pkg.__name__}.{info.name}")
    return OPDB
