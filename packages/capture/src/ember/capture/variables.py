"""Symbolic values: what the stack, locals and containers of a symbolic frame hold.

A `Var` stands for one Python value of the user's program. Values known at capture time are
`ConstVar`s (their real Python object); tensors are `TensorVar`s (a fake tensor plus the IR value
that computes it); containers hold `Var`s, so they may mix both. Values read from the caller's
world carry a `source` (how to reach them again at call time), which guards and graph inputs use.
Capture never mutates a real object: containers read from outside are copied into Vars and marked
read-only, and writes to them are unhandled (side effects come with graph breaks).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ember.capture.sources import Source
from ember.ir import Value


class Var:
    """Base class of symbolic values."""

    source: Source | None = None

    def python_type(self) -> type:
        raise NotImplementedError

    def describe(self) -> str:
        return self.python_type().__name__


class NullVar(Var):
    """The NULL that CPython pushes below a callable (PUSH_NULL, LOAD_GLOBAL with the low bit)."""

    def python_type(self) -> type:
        return type(None)

    def describe(self) -> str:
        return "NULL"

    def __repr__(self) -> str:
        return "NULL"


NULL = NullVar()


class ConstVar(Var):
    """A Python object known at capture time: numbers, strings, None, dtypes, sizes, torch
    functions, builtins, classes, Python modules, exceptions. Never mutated."""

    def __init__(self, value: Any, source: Source | None = None):
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        v = self.value
        name = getattr(v, "__qualname__", None) or getattr(v, "__name__", None)
        if callable(v) and isinstance(name, str):
            return name
        return repr(v) if len(repr(v)) < 40 else type(v).__name__

    def __repr__(self) -> str:
        return f"ConstVar({self.value!r})"


class ValueMap(Protocol):
    def value_of(self, fake: torch.Tensor) -> Value | None: ...


class TensorVar(Var):
    """A tensor: its fake tensor (dtype, shape, device, strides, requires_grad) and the IR value
    that currently holds its contents (an in-place update of an intermediate rebinds it)."""

    def __init__(self, fake: torch.Tensor, values: ValueMap, cls: type = torch.Tensor,
                 source: Source | None = None):
        self.fake = fake
        self._values = values
        self.cls = cls
        self.source = source

    @property
    def value(self) -> Value:
        v = self._values.value_of(self.fake)
        assert v is not None, "a TensorVar whose fake tensor has no IR value"
        return v

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"tensor %{self.value.name}"

    def __repr__(self) -> str:
        return f"TensorVar(%{self.value.name}: {self.value.type})"


class TupleVar(Var):
    """A tuple, or an instance of a tuple subclass (namedtuple, torch.return_types.*)."""

    def __init__(self, items: list[Var], cls: type = tuple, source: Source | None = None):
        self.items: list[Var] = list(items)
        self.cls = cls
        self.source = source

    def python_type(self) -> type:
        return self.cls

    def __repr__(self) -> str:
        return f"TupleVar({self.items!r})"


class ListVar(Var):
    """A list. `readonly` when it came from outside the frame (writing it is a side effect)."""

    def __init__(self, items: list[Var], source: Source | None = None, readonly: bool = False):
        self.items: list[Var] = list(items)
        self.source = source
        self.readonly = readonly
        self.mutated = False

    def python_type(self) -> type:
        return list

    def __repr__(self) -> str:
        return f"ListVar({self.items!r})"


class DictVar(Var):
    """A dict (or OrderedDict) with constant keys (the real key objects)."""

    def __init__(self, items: dict[Any, Var], cls: type = dict, source: Source | None = None,
                 readonly: bool = False):
        self.items: dict[Any, Var] = dict(items)
        self.cls = cls
        self.source = source
        self.readonly = readonly
        self.mutated = False

    def python_type(self) -> type:
        return self.cls

    def __repr__(self) -> str:
        return f"DictVar({self.items!r})"


class SetVar(Var):
    """A set of constants (frozen when `frozen`)."""

    def __init__(self, items: list[Var], frozen: bool = False, source: Source | None = None):
        self.items: dict[Any, Var] = {}
        for it in items:
            self.items[set_key(it)] = it
        self.frozen = frozen
        self.source = source

    def python_type(self) -> type:
        return frozenset if self.frozen else set


def set_key(v: Var) -> Any:
    """The hashable identity of a set element or dict key."""
    if isinstance(v, ConstVar):
        return v.value
    if isinstance(v, TensorVar):
        return ("tensor", id(v.fake))
    if isinstance(v, ObjectVar | FunctionVar):
        return ("object", id(v.value if isinstance(v, ObjectVar) else v.fn))
    if isinstance(v, TupleVar):
        return tuple(set_key(i) for i in v.items)
    from ember.capture.errors import unhandled

    raise unhandled(f"a {v.describe()} used as a set element or dict key")


class IteratorVar(Var):
    """An iterator. Over a ListVar it is live (it sees appends); otherwise over a fixed list
    (iterators of ranges, tuples, dict views, zip/enumerate/map results, generators)."""

    def __init__(self, items: list[Var], over: ListVar | None = None, kind: str = "iterator"):
        self.items = items
        self.over = over
        self.pos = 0
        self.kind = kind
        self.returned: Var | None = None  # a generator's return value (`r = yield from g`)

    def python_type(self) -> type:
        return type(iter(()))

    def next(self) -> Var | None:
        seq = self.over.items if self.over is not None else self.items
        if self.pos >= len(seq):
            return None
        self.pos += 1
        return seq[self.pos - 1]

    def rest(self) -> list[Var]:
        seq = self.over.items if self.over is not None else self.items
        out = seq[self.pos:]
        self.pos = len(seq)
        return list(out)


class FunctionVar(Var):
    """A real Python function (its bytecode is inlined when called)."""

    def __init__(self, fn: types.FunctionType, source: Source | None = None):
        self.fn = fn
        self.source = source

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"function {self.fn.__qualname__}"


class Cell:
    """A closure cell of a symbolic frame. `real` when it stands for a cell of a function made
    outside capture: writing it would be a side effect."""

    def __init__(self, contents: Var | None = None, real: bool = False):
        self.contents = contents
        self.real = real


class CellRefVar(Var):
    """LOAD_CLOSURE's result: a reference to a symbolic frame's cell (for MAKE_FUNCTION)."""

    def __init__(self, cell: Cell):
        self.cell = cell

    def python_type(self) -> type:
        return types.CellType


class NestedFunctionVar(Var):
    """A function made by MAKE_FUNCTION during capture (lambdas, nested defs, comprehensions)."""

    def __init__(self, code: types.CodeType, globals: dict[str, Any], qualname: str,
                 defaults: list[Var] | None, kwdefaults: dict[str, Var] | None,
                 closure: list[Cell | Any] | None):
        self.code = code
        self.globals = globals
        self.qualname = qualname
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure  # Cell (symbolic) or a real cell object, per free variable

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"function {self.qualname}"


class MethodVar(Var):
    """A bound method: `func` called with `obj` first."""

    def __init__(self, func: Var, obj: Var, source: Source | None = None):
        self.func = func
        self.obj = obj
        self.source = source

    def python_type(self) -> type:
        return types.MethodType

    def describe(self) -> str:
        return f"method {self.func.describe()}"


class ObjectVar(Var):
    """A real object from outside the frame (a user object, a dataclass instance), read-only."""

    def __init__(self, value: Any, source: Source | None = None):
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        return f"{type(self.value).__qualname__} object"


class ModuleVar(ObjectVar):
    """An nn.Module: parameters and buffers become graph inputs when read."""

    def describe(self) -> str:
        return f"module {type(self.value).__qualname__}"


class NewObjectVar(Var):
    """An instance of a user class created during capture (its __init__ was inlined). An
    instance of a dict subclass (transformers' ModelOutput) also holds its dict contents, which
    the dict's own methods act on; attributes live apart, as in `__dict__`."""

    def __init__(self, cls: type, attrs: dict[str, Var] | None = None):
        self.cls = cls
        self.attrs: dict[str, Var] = dict(attrs or {})
        self.dict: DictVar | None = DictVar({}) if issubclass(cls, dict) else None

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"new {self.cls.__qualname__} object"


class SuperVar(Var):
    """`super(cls, obj)`: attribute lookup starts after `cls` in the MRO of obj's type."""

    def __init__(self, cls: type, obj: Var):
        self.cls = cls
        self.obj = obj

    def python_type(self) -> type:
        return super


@dataclass
class CtxState:
    """One context manager's state change: grad mode, or autocast."""

    kind: str  # "grad", "autocast", "null"
    grad: bool = True
    device: str = "cpu"
    dtype: torch.dtype | None = None
    enabled: bool = True
    saved: Any = None


class ContextVar(Var):
    """A supported context manager (torch.no_grad(), enable_grad(), set_grad_enabled(b),
    autocast(...), contextlib.nullcontext())."""

    def __init__(self, state: CtxState, cls: type):
        self.state = state
        self.cls = cls

    def python_type(self) -> type:
        return self.cls


class PartialVar(Var):
    """functools.partial(func, *args, **kwargs)."""

    def __init__(self, func: Var, args: list[Var], kwargs: dict[str, Var],
                 source: Source | None = None):
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.source = source

    def python_type(self) -> type:
        import functools

        return functools.partial


def items_of(v: Var) -> list[Var] | None:
    """The elements of a tuple or list (constant or symbolic), else None."""
    if isinstance(v, TupleVar | ListVar):
        return v.items
    if isinstance(v, ConstVar) and isinstance(v.value, (tuple, list)):
        return [ConstVar(x) for x in v.value]
    return None
