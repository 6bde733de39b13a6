"""Wrapping real Python values into symbolic ones, with the guards that keep them valid.

`wrap(tx, value, source)` is how every value from outside the frame enters capture (arguments,
attributes, globals, closure cells) and how results of real calls come back. With a source, it
installs the guards that make the captured graph valid for the next call: tensors on their
metadata, scalars on their value, modules and functions on their identity, containers on their
type and length. Tensors become graph inputs. The same real object reached twice gives the same
symbolic value (and an aliasing guard), so identity and graph inputs are not duplicated.
"""

from __future__ import annotations

import enum
import functools
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.customops import OP_TYPES
from ember.capture.errors import unhandled
from ember.capture.guards import Guard, GuardKind, TensorMeta
from ember.capture.sources import (
    ArgSource,
    AttrSource,
    GetItemSource,
    KwargSource,
    Source,
    describe,
)
from ember.capture.symbolic import SymInt, SymSize, int_argument
from ember.capture.variables import (
    ConstVar,
    DictVar,
    FunctionVar,
    ListVar,
    MethodVar,
    ModuleVar,
    ObjectVar,
    PartialVar,
    SetVar,
    TensorVar,
    TupleVar,
    Var,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

SCALARS = (int, float, bool, str, bytes, complex, type(None))
SYMBOLIC = (SymInt, SymSize)
# Immutable values compared with == (and a type check).
EQUAL_TYPES = (torch.Size, torch.device, range, slice, frozenset)
# Singletons or values compared by identity.
ID_TYPES = (torch.dtype, torch.layout, torch.memory_format, type, types.ModuleType,
            types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodDescriptorType,
            types.WrapperDescriptorType, types.MethodWrapperType, types.GetSetDescriptorType,
            type(Ellipsis), type(NotImplemented), torch.finfo, torch.iinfo,
            types.CodeType, *OP_TYPES)

# Python modules whose attributes and globals are not guarded: the standard library and torch
# are not monkeypatched between calls (documented in docs/capture.md).
TRUSTED_MODULES = ("torch", "math", "operator", "functools", "itertools", "collections",
                   "typing", "builtins", "numbers", "enum", "dataclasses", "abc", "types",
                   "contextlib", "copy", "inspect", "warnings", "re", "string", "cmath")


def is_trusted_module(name: str | None) -> bool:
    if not name:
        return False
    return any(name == m or name.startswith(m + ".") for m in TRUSTED_MODULES)


def wrap(tx: Tracer, value: Any, source: Source | None) -> Var:
    """The symbolic value for a real one; with a source, guarded."""
    if type(value) is int and isinstance(source, ArgSource | KwargSource):
        value = int_argument(value, describe(source))  # (a SymInt where it is dynamic)
    if type(value) in SCALARS or type(value) in SYMBOLIC:  # a size of a dynamic dim too
        if source is not None:
            tx.guard(Guard(GuardKind.CONSTANT_MATCH, source, value))
        return ConstVar(value, source)
    var = already_wrapped(tx, value)
    if var is not None:
        if source is not None and var.source is not None and var.source != source:
            tx.guard(Guard(GuardKind.SAME_OBJECT, source, other=var.source))
        return var
    var = _wrap_new(tx, value, source)
    if isinstance(var, TensorVar | ListVar | DictVar | ModuleVar | ObjectVar | SetVar):
        tx.wrapped[id(value)] = (var, value)
    return var


def already_wrapped(tx: Tracer, value: Any) -> Var | None:
    """The symbolic value this capture already made for the real object `value`, if any."""
    cached = tx.wrapped.get(id(value))
    return cached[0] if cached is not None and cached[1] is value else None


def _wrap_new(tx: Tracer, value: Any, source: Source | None) -> Var:
    g = tx.guard
    if isinstance(value, torch.Tensor):
        return lift_tensor(tx, value, source)
    if isinstance(value, torch.nn.Module):
        if source is not None:
            # a module made before a graph break and passed to the resume function on the
            # stack is a new object on every call: its type is guarded (its parameters and
            # attributes are guarded where read, as for any module)
            kind = GuardKind.TYPE_MATCH if _from_break_stack(source) else GuardKind.ID_MATCH
            g(Guard(kind, source, type(value) if kind is GuardKind.TYPE_MATCH else value))
        return ModuleVar(value, source)
    if isinstance(value, EQUAL_TYPES):
        if source is not None:
            g(Guard(GuardKind.EQUALS_MATCH, source, value))
        return ConstVar(value, source)
    if isinstance(value, ID_TYPES) or isinstance(value, enum.Enum):
        if source is not None and _stable_identity(value):
            g(Guard(GuardKind.ID_MATCH, source, value))
        return ConstVar(value, source)
    if isinstance(value, types.FunctionType):
        if source is not None:
            g(Guard(GuardKind.ID_MATCH, source, value))
        return FunctionVar(value, source)
    if _typing_form(value):  # `Optional[int]`, `list[int]`: immutable, compared with ==
        if source is not None:
            g(Guard(GuardKind.EQUALS_MATCH, source, value))
        return ConstVar(value, source)
    if isinstance(value, types.MethodType):
        fsrc = AttrSource(source, "__func__") if source is not None else None
        osrc = AttrSource(source, "__self__") if source is not None else None
        return MethodVar(wrap(tx, value.__func__, fsrc), wrap(tx, value.__self__, osrc), source)
    if isinstance(value, functools.partial):
        return _wrap_partial(tx, value, source)
    if type(value) is tuple or (isinstance(value, tuple) and hasattr(type(value), "_fields")):
        if source is not None:
            g(Guard(GuardKind.TYPE_MATCH, source, type(value)))
            g(Guard(GuardKind.LENGTH, source, len(value)))
        items = [wrap(tx, x, _item(source, i)) for i, x in enumerate(value)]
        if all(isinstance(i, ConstVar) for i in items) and type(value) is tuple:
            return ConstVar(value, source)
        return TupleVar(items, type(value), source)
    if type(value) is list:
        if source is not None:
            g(Guard(GuardKind.TYPE_MATCH, source, list))
            g(Guard(GuardKind.LENGTH, source, len(value)))
        return ListVar([wrap(tx, x, _item(source, i)) for i, x in enumerate(value)], source,
                       readonly=source is not None)
    if isinstance(value, dict) and type(value).__module__ in ("builtins", "collections"):
        if source is not None:
            g(Guard(GuardKind.TYPE_MATCH, source, type(value)))
            g(Guard(GuardKind.DICT_KEYS, source, tuple(value.keys())))
        for k in value:
            if not _constant_key(k):
                raise unhandled(f"a dict with a {type(k).__name__} key")
        return DictVar({k: wrap(tx, v, _item(source, k)) for k, v in value.items()},
                       type(value), source, readonly=source is not None)
    if isinstance(value, types.MappingProxyType) and source is None:
        # a class's or a signature's read-only mapping, made during capture: a read-only dict
        return DictVar({k: wrap(tx, v, None) for k, v in value.items()}, types.MappingProxyType,
                       None, readonly=True)
    if type(value) in (set, frozenset):
        if not all(type(x) in SCALARS for x in value):
            raise unhandled("a set of non-constant values")
        if source is not None:  # (a copy: the guard keeps its own; `set` is its type)
            g(Guard(GuardKind.EQUALS_MATCH, source, type(value)(value)))
        return SetVar([ConstVar(x) for x in value], frozen=type(value) is frozenset,
                      source=source)
    if isinstance(value, types.CellType | types.FrameType |
                  types.GeneratorType | types.TracebackType):
        raise unhandled(f"a {type(value).__name__} object")
    if isinstance(value, BaseException):
        return ConstVar(value, source)
    if source is not None:
        g(Guard(GuardKind.TYPE_MATCH, source, type(value)))
    return ObjectVar(value, source)


def _from_break_stack(source: Source) -> bool:
    """Whether `source` reads from a value the previous graph's frame had on its stack (a
    resume function's `___stackN` argument: a value made in the frame)."""
    root: Source | None = source
    while root is not None and root.base() is not None:
        root = root.base()
    return isinstance(root, ArgSource) and root.param.startswith("___stack")


def _constant_key(k: Any) -> bool:
    """A dict key capture can hold as a constant: hashed and compared (by the keys guard) by
    Python's or torch's own code, never a user-defined __eq__: scalars, enums, classes,
    dtypes/devices, `typing` forms (`Optional[int]`, `list[int]`), tuples of these."""
    if type(k) in SCALARS or isinstance(k, enum.Enum | type | torch.dtype | torch.device):
        return True
    if type(k) is tuple:
        return all(_constant_key(x) for x in k)
    return _typing_form(k)


def _typing_form(v: Any) -> bool:
    """A `typing` special form or generic alias over constant arguments (never a class: a
    class is compared by identity)."""
    if isinstance(v, type) or not (isinstance(v, types.GenericAlias | types.UnionType) or
                                   type(v).__module__ == "typing"):
        return False
    return all(_constant_key(a) for a in getattr(v, "__args__", ()))


def _wrap_partial(tx: Tracer, value: functools.partial[Any], source: Source | None) -> Var:
    """A partial from outside the frame (a global, an argument, a module's attribute): called
    as its func with its args and keywords, each guarded as a value of its own (the func by
    identity, scalars by value, tensors by metadata); `keywords` is a mutable dict."""
    if type(value) is not functools.partial:  # a subclass may override __call__
        if source is not None:
            tx.guard(Guard(GuardKind.TYPE_MATCH, source, type(value)))
        return ObjectVar(value, source)
    if source is not None:
        tx.guard(Guard(GuardKind.TYPE_MATCH, source, functools.partial))
        tx.guard(Guard(GuardKind.LENGTH, AttrSource(source, "args"), len(value.args)))
        tx.guard(Guard(GuardKind.DICT_KEYS, AttrSource(source, "keywords"),
                       tuple(value.keywords)))
    args = [wrap(tx, a, _item(AttrSource(source, "args") if source else None, i))
            for i, a in enumerate(value.args)]
    ksrc = AttrSource(source, "keywords") if source is not None else None
    kwargs = {k: wrap(tx, v, _item(ksrc, k)) for k, v in value.keywords.items()}
    func = wrap(tx, value.func, AttrSource(source, "func") if source is not None else None)
    return PartialVar(func, args, kwargs, source)


def _item(source: Source | None, key: Any) -> Source | None:
    return GetItemSource(source, key) if source is not None else None


def lift_tensor(tx: Tracer, value: torch.Tensor, source: Source | None) -> TensorVar:
    rec = tx.recorder
    if rec.is_fake(value):
        if rec.value_of(value) is None:
            raise unhandled("a tensor made outside the recorded operators")
        return TensorVar(value, rec, _tensor_cls(value))
    if source is None:
        fake = rec.lift_constant(value)
    else:
        fake = rec.lift(value, source)
        tx.guard(Guard(GuardKind.TENSOR_MATCH, source, TensorMeta.of(value)))
    return TensorVar(fake, rec, type(value), source)


def _stable_identity(value: Any) -> bool:
    """False for bound builtin methods of ordinary objects: a new object at every access."""
    if isinstance(value, types.BuiltinMethodType | types.MethodWrapperType):
        owner = getattr(value, "__self__", None)
        return owner is None or isinstance(owner, types.ModuleType | type)
    return True


def _tensor_cls(t: torch.Tensor) -> type:
    return torch.nn.Parameter if isinstance(t, torch.nn.Parameter) else torch.Tensor
