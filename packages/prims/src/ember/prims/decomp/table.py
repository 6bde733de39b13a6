"""The decomposition table: aten op name -> a plain Python function over `DecompContext`.

A decomposition's parameters are named as in the aten schema (`self`, `other`, `alpha`, ...);
arguments are bound by the schema, defaults filled in from it, so a decomposition never cares
whether the IR passed an argument positionally or by keyword. It returns a Value or a
list/tuple of Values, one per result of the aten op.

Tables are values: `DECOMPOSITIONS.copy().replace(op, fn)` is a variant that differs in one op
(the original is untouched), and `register_decomposition_table(name, table)` makes it
selectable as `decompose{table=NAME}` or `compile(options={"decompositions": NAME})`. Plugins
add tables through the entry point group `ember.decompositions`. Inside one table a second
decomposition for an op stays an error (an accidental duplicate), unless `override=True`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

import torch

from ember.ir import DType, Value
from ember.ir.plugins import load_entry_points
from ember.ir.torch_ops import resolve
from ember.prims.decomp.context import DecompContext, DecompositionError

DecompFn = Callable[..., Any]


class DecompositionTable:
    def __init__(self, name: str = "", fns: Mapping[str, DecompFn] | None = None) -> None:
        self.name = name  # for messages and explain notes; the registry's name is the key
        self._fns: dict[str, DecompFn] = dict(fns or {})

    def register(self, *ops: str, override: bool = False) -> Callable[[DecompFn], DecompFn]:
        """Decorator: `fn` decomposes each of `ops` (full overload names, aten.add.Tensor).
        An op that already has a decomposition is an error unless `override=True`."""

        def deco(fn: DecompFn) -> DecompFn:
            for op in ops:
                if op in self._fns and not override:
                    raise ValueError(f"{op} already has a decomposition "
                                     f"({self._fns[op].__module__}.{self._fns[op].__name__}); "
                                     f"to change it, register with override=True or use "
                                     f"table.copy().replace(op, fn)")
                if resolve(op) is None:
                    raise ValueError(f"{op} is not a torch operator")
                self._fns[op] = fn
            return fn

        return deco

    def copy(self, name: str = "") -> DecompositionTable:
        """An independent table with the same decompositions (changing one leaves the other)."""
        return DecompositionTable(name, self._fns)  # unnamed: registering it names it

    def replace(self, op: str, fn: DecompFn) -> DecompositionTable:
        """Decompose `op` with `fn` instead (it must have a decomposition here; `register`
        adds new ones). Returns the table, so `DECOMPOSITIONS.copy().replace(...)` chains."""
        if op not in self._fns:
            raise ValueError(f"{op} has no decomposition in this table to replace; add one "
                             f"with table.register({op!r})")
        self._fns[op] = fn
        return self

    def remove(self, op: str) -> DecompositionTable:
        """Drop `op`'s decomposition (with decompose{keep_unsupported=true} the op stays)."""
        if self._fns.pop(op, None) is None:
            raise ValueError(f"{op} has no decomposition in this table")
        return self

    def __len__(self) -> int:
        return len(self._fns)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._fns))

    def __repr__(self) -> str:
        return f"DecompositionTable({self.name or 'unnamed'}, {len(self._fns)} ops)"

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


DECOMPOSITIONS = DecompositionTable("default")
register_decomposition = DECOMPOSITIONS.register


class TableWarning(UserWarning):
    """An `ember.decompositions` entry point could not be loaded: its tables are missing."""


class DecompositionTables:
    """Decomposition tables by name; "default" is DECOMPOSITIONS. Plugins add tables through
    the entry point group `ember.decompositions` (loaded once, on the first lookup, as the
    `ember.passes` group is): an entry point names a `DecompositionTable`, registered under the
    entry point's name, or a callable that takes this registry and adds tables to it."""

    def __init__(self) -> None:
        self._tables: dict[str, DecompositionTable] = {}
        self._plugins_loaded = False
        self._loaded_eps: set[tuple[str, str]] = set()

    def add(self, name: str, table: DecompositionTable, *, replace: bool = False
            ) -> DecompositionTable:
        if not isinstance(table, DecompositionTable):
            raise TypeError(f"decomposition table {name}: {type(table).__name__} is not a "
                            f"DecompositionTable")
        if not name or any(c in name for c in " \t{},="):
            raise ValueError(f"decomposition table name {name!r} cannot be written as "
                             f"decompose{{table=NAME}}")
        if name == "default" and table is not DECOMPOSITIONS:
            raise ValueError("the table 'default' is ember's own; register yours under "
                             "another name")
        if name in self._tables and not replace:
            raise ValueError(f"decomposition table {name} is already registered (pass "
                             f"replace=True to redefine it)")
        self._tables[name] = table
        if not table.name:
            table.name = name
        return table

    def get(self, name: str) -> DecompositionTable:
        self.load_plugins()
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(f"unknown decomposition table {name!r} (known: "
                           f"{', '.join(sorted(self._tables))})") from None

    def all(self) -> dict[str, DecompositionTable]:
        self.load_plugins()
        return dict(sorted(self._tables.items()))

    def name_of(self, table: DecompositionTable) -> str | None:
        """The name `table` (this very object) is registered under, if any."""
        return next((n for n, t in self._tables.items() if t is table), None)

    def load_plugins(self, *, refresh: bool = False) -> None:
        """Read the `ember.decompositions` group once (`refresh=True` reads it again and
        loads only entry points not loaded before)."""
        if self._plugins_loaded and not refresh:
            return
        self._plugins_loaded = True

        def register(ep: Any, obj: Any) -> None:
            if isinstance(obj, DecompositionTable):
                if ep.name not in self._tables:
                    self.add(ep.name, obj)
            elif callable(obj):
                obj(self)
            else:
                raise TypeError(f"{type(obj).__name__} is neither a DecompositionTable nor a "
                                f"callable")

        if not load_entry_points("ember.decompositions",
                                 entry_points(group="ember.decompositions"), self._loaded_eps,
                                 register, TableWarning):
            self._plugins_loaded = False


_TABLES = DecompositionTables()
_TABLES.add("default", DECOMPOSITIONS)


def decomposition_tables() -> DecompositionTables:
    return _TABLES


def register_decomposition_table(name: str, table: DecompositionTable, *,
                                 replace: bool = False) -> DecompositionTable:
    """Make `table` selectable by `name` (decompose{table=NAME}, compile's "decompositions")."""
    return _TABLES.add(name, table, replace=replace)


def decomposition_table(name: str) -> DecompositionTable:
    """The table registered as `name` (KeyError listing the known names otherwise)."""
    return _TABLES.get(name)


def values_of(out: Any) -> list[Value]:
    if isinstance(out, Value):
        return [out]
    if isinstance(out, (list, tuple)) and all(isinstance(v, Value) for v in out):
        return list(out)
    raise DecompositionError(f"a decomposition returned {out!r}, not values")


# The table `decompose` uses when its pipeline stage names none: compile() sets it for the
# duration of its pipeline (options={"decompositions": ...}); a context variable, so threads
# compiling at once each see their own.
_ACTIVE: contextvars.ContextVar[DecompositionTable | None] = contextvars.ContextVar(
    "ember_decompositions", default=None)


@contextlib.contextmanager
def using_decompositions(table: DecompositionTable) -> Iterator[DecompositionTable]:
    """Within the block, `decompose` stages without a `table=` option use `table`."""
    token = _ACTIVE.set(table)
    try:
        yield table
    finally:
        _ACTIVE.reset(token)


def active_table() -> DecompositionTable:
    t = _ACTIVE.get()
    return DECOMPOSITIONS if t is None else t  # (an empty table is falsy: no `or`)
