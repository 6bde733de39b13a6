"""Sources: where a value read during capture comes from, relative to the call.

A compiled call sees `S` (the bound `self`, or None), `A` (positional arguments) and `K` (keyword
arguments). Every source prints as a Python expression over those and over named objects that
the generated guard and input code holds (`expr`), and as a readable graph-parameter name
(`name`, e.g. `l_self_linear_weight`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

MODULE_TABLES = ("_modules", "_parameters", "_buffers")

# `ref(obj, hint)` returns the name under which the generated code can reach `obj`.
RefFn = Callable[[Any, str], str]


class Source:
    """Base class. Sources are immutable and hashable (compared structurally)."""

    def expr(self, ref: RefFn) -> str:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def base(self) -> Source | None:
        return None


@dataclass(frozen=True)
class SelfSource(Source):
    """The bound object of the compiled call (a module, or the `self` of a bound method)."""

    def expr(self, ref: RefFn) -> str:
        return "S"

    def name(self) -> str:
        return "l_self"


@dataclass(frozen=True)
class ArgSource(Source):
    """Positional argument `index` of the call (bound to parameter `param`, for naming)."""

    index: int
    param: str

    def expr(self, ref: RefFn) -> str:
        return f"A[{self.index}]"

    def name(self) -> str:
        return f"l_{self.param}"


@dataclass(frozen=True)
class KwargSource(Source):
    key: str

    def expr(self, ref: RefFn) -> str:
        return f"K[{self.key!r}]"

    def name(self) -> str:
        return f"l_{self.key}"


@dataclass(frozen=True)
class AttrSource(Source):
    of: Source
    attr: str

    def expr(self, ref: RefFn) -> str:
        return f"{self.of.expr(ref)}.{self.attr}"

    def name(self) -> str:
        if self.attr in MODULE_TABLES:  # self._modules['0'] reads as self.0, as in state_dict
            return self.of.name()
        return f"{self.of.name()}_{self.attr}"

    def base(self) -> Source | None:
        return self.of


@dataclass(frozen=True)
class ModuleMemberSource(Source):
    """An nn.Module's child, parameter or buffer, read from its dict (`_modules` etc.) directly:
    the same object `getattr` finds, without going through `Module.__getattr__` at guard time."""

    of: Source
    table: str  # "_modules", "_parameters" or "_buffers"
    key: str

    def expr(self, ref: RefFn) -> str:
        return f"{self.of.expr(ref)}.{self.table}[{self.key!r}]"

    def name(self) -> str:
        return f"{self.of.name()}_{self.key}"

    def base(self) -> Source | None:
        return self.of


@dataclass(frozen=True)
class GetItemSource(Source):
    of: Source
    key: Any  # a constant: int, str, an enum, a class, a typing form (`Optional[int]`)

    def expr(self, ref: RefFn) -> str:
        return f"{self.of.expr(ref)}[{key_expr(self.key, ref)}]"

    def name(self) -> str:
        return f"{self.of.name()}_{self.key}"

    def base(self) -> Source | None:
        return self.of


def key_expr(key: Any, ref: RefFn) -> str:
    """A constant key in generated guard code: a literal for ints, strings, bools, None, or a
    reference to the object (an enum member's or a typing form's repr is not Python)."""
    if type(key) in (int, str, bool, bytes, type(None)):
        return repr(key)
    return ref(key, "Key")


@dataclass(frozen=True)
class DictItemSource(Source):
    """`dict.__getitem__(of, key)`: an entry of a dict subclass read past its own __getitem__
    (a transformers ModelOutput maps keys in one), as dict's methods read it."""

    of: Source
    key: Any  # a str or int constant

    def expr(self, ref: RefFn) -> str:
        return f"{ref(dict.__getitem__, 'F')}({self.of.expr(ref)}, {key_expr(self.key, ref)})"

    def name(self) -> str:
        return f"{self.of.name()}_{self.key}"

    def base(self) -> Source | None:
        return self.of


@dataclass(frozen=True)
class CallSource(Source):
    """The result of calling the object at `of` with no arguments (a weakref's referent)."""

    of: Source

    def expr(self, ref: RefFn) -> str:
        return f"{self.of.expr(ref)}()"

    def name(self) -> str:
        return self.of.name()

    def base(self) -> Source | None:
        return self.of


@dataclass(frozen=True)
class TypeSource(Source):
    of: Source

    def expr(self, ref: RefFn) -> str:
        return f"type({self.of.expr(ref)})"

    def name(self) -> str:
        return f"{self.of.name()}_type"

    def base(self) -> Source | None:
        return self.of


@dataclass(frozen=True, eq=False)
class GlobalSource(Source):
    """`name` in a function's globals dict (held by reference: it is the module's namespace)."""

    globals: dict[str, Any] = field(repr=False)
    key: str = ""
    module: str = ""

    def expr(self, ref: RefFn) -> str:
        return f"{ref(self.globals, 'G')}[{self.key!r}]"

    def name(self) -> str:
        return f"g_{self.key}"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, GlobalSource) and other.globals is self.globals
                and other.key == self.key)

    def __hash__(self) -> int:
        return hash((id(self.globals), self.key))


@dataclass(frozen=True, eq=False)
class CellSource(Source):
    """The contents of a closure cell of a function reached during capture."""

    cell: Any = field(repr=False)
    var: str = ""

    def expr(self, ref: RefFn) -> str:
        return f"{ref(self.cell, 'Cell')}.cell_contents"

    def name(self) -> str:
        return f"cell_{self.var}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CellSource) and other.cell is self.cell

    def __hash__(self) -> int:
        return hash(id(self.cell))


@dataclass(frozen=True, eq=False)
class ConstantSource(Source):
    """An object held by the compiled code itself: a tensor constant lifted to a graph input,
    a default argument value."""

    value: Any = field(repr=False)
    label: str = "const"

    def expr(self, ref: RefFn) -> str:
        return ref(self.value, "C")

    def name(self) -> str:
        return f"c_{self.label}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstantSource) and other.value is self.value

    def __hash__(self) -> int:
        return hash(id(self.value))


@dataclass(frozen=True, eq=False)
class HeldSource(Source):
    """A function or class the compiled code holds by reference: an inlined function (its
    `__code__`, `__defaults__`, ... are guarded through it), a class whose attribute lookup
    capture followed (its `__dict__` entries are)."""

    value: Any = field(repr=False)

    def expr(self, ref: RefFn) -> str:
        return ref(self.value, "H")

    def name(self) -> str:
        return f"h_{held_name(self.value)}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeldSource) and other.value is self.value

    def __hash__(self) -> int:
        return hash(id(self.value))


def held_name(obj: Any) -> str:
    """`M.f` for a function or class, without the `make.<locals>.` of one defined in a
    function (readable in guard text; the guard itself holds the object)."""
    name = str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
               or type(obj).__name__)
    return name.rsplit("<locals>.", 1)[-1]


@dataclass(frozen=True)
class ContextVarSource(Source):
    """The current value of a `contextvars.ContextVar` (None when it has none)."""

    var: Any = field(repr=False)

    def expr(self, ref: RefFn) -> str:
        return f"{ref(self.var, 'CV')}.get(None)"

    def name(self) -> str:
        return f"cv_{self.var.name}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ContextVarSource) and other.var is self.var

    def __hash__(self) -> int:
        return hash(id(self.var))


@dataclass(frozen=True)
class LocalSource(Source):
    """A local variable of generated code holding an already evaluated source."""

    var: str

    def expr(self, ref: RefFn) -> str:
        return self.var

    def name(self) -> str:
        return self.var


def rebase(source: Source, subst: dict[Source, Source]) -> Source:
    """`source` with every prefix found in `subst` replaced (to reuse hoisted locals)."""
    if source in subst:
        return subst[source]
    base = source.base()
    if base is None:
        return source
    return replace(cast(Any, source), of=rebase(base, subst))  # type: ignore[no-any-return]


def prefixes(source: Source) -> list[Source]:
    """`source` and the sources it is read through, innermost (the call's S/A/K) first."""
    out = []
    s: Source | None = source
    while s is not None:
        out.append(s)
        s = s.base()
    return out[::-1]


_BAD = re.compile(r"[^A-Za-z0-9_]+")


def param_name(source: Source) -> str:
    """A graph-parameter name for a source: `l_self_linear_weight`, `l_x`, `c_tensor`."""
    text = _BAD.sub("_", source.name()).strip("_") or "arg"
    if not (text[0].isalpha() or text[0] == "_"):
        text = "v_" + text
    return text


def describe(source: Source) -> str:
    """A readable path for messages: `self.linear.weight`, `x`, `xs[2]`, `SCALE`."""
    if isinstance(source, SelfSource):
        return "self"
    if isinstance(source, ArgSource):
        return source.param
    if isinstance(source, KwargSource):
        return source.key
    if isinstance(source, AttrSource):
        return f"{describe(source.of)}.{source.attr}"
    if isinstance(source, ModuleMemberSource):
        return f"{describe(source.of)}.{source.key}"
    if isinstance(source, GetItemSource):
        if isinstance(source.of, AttrSource) and source.of.attr in MODULE_TABLES:
            return f"{describe(source.of.of)}.{source.key}"  # state_dict style: self.layers.0
        return f"{describe(source.of)}[{source.key!r}]"
    if isinstance(source, DictItemSource):
        return f"{describe(source.of)}[{source.key!r}]"
    if isinstance(source, TypeSource):
        return f"type({describe(source.of)})"
    if isinstance(source, CallSource):
        return f"{describe(source.of)}()"
    if isinstance(source, GlobalSource):
        return f"{source.module}.{source.key}" if source.module else source.key
    if isinstance(source, CellSource):
        return f"<closure {source.var}>"
    if isinstance(source, ConstantSource):
        return f"<constant {source.label}>"
    if isinstance(source, HeldSource):
        return held_name(source.value)
    if isinstance(source, ContextVarSource):
        return f"<ContextVar {source.var.name}>"
    if isinstance(source, ArgsSource):
        return "*args"
    if isinstance(source, KwargsSource):
        return "**kwargs"
    return type(source).__name__


@dataclass(frozen=True)
class ArgsSource(Source):
    """The tuple of positional arguments itself."""

    def expr(self, ref: RefFn) -> str:
        return "A"

    def name(self) -> str:
        return "args"


@dataclass(frozen=True)
class KwargsSource(Source):
    """The dict of keyword arguments itself."""

    def expr(self, ref: RefFn) -> str:
        return "K"

    def name(self) -> str:
        return "kwargs"
