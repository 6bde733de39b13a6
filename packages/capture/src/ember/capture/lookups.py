"""Guards on the Python definitions a capture followed: the functions it inlined and the class
attribute lookups that found them.

A graph inlines a function's code with its default values, so it is valid only while that
function object keeps its `__code__`, `__defaults__` and `__kwdefaults__` (all assignable), and
while the lookups that led to it (`self.f`, `obj.prop`, `Cls.method`, a module's `forward`)
still find it: the class and its bases may be patched, and an instance attribute shadows a
method. Values follow wrap's rules: a defaults tuple by identity (it is immutable, so its
scalars need nothing more), its other values (a tensor, a list) by their own guards, the
kw-defaults dict (mutable) by keys and values. Functions and classes of torch and the standard
library are not guarded (TRUSTED_MODULES: they are not monkeypatched between calls); a closure
cell's contents are guarded where they are read (`CellSource`).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

from ember.capture.guards import ClassLookup, Guard, GuardKind
from ember.capture.sources import AttrSource, GetItemSource, HeldSource, Source
from ember.capture.variables import DictVar, Var
from ember.capture.wrap import SCALARS, is_trusted_module, wrap

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


def function_defaults(tx: Tracer, f: types.FunctionType) -> tuple[list[Var], dict[str, Var]]:
    """The defaults and keyword-only defaults `f` is inlined with, guarded together with its
    code object (unless `f` is torch's or the standard library's)."""
    d, kd = f.__defaults__, f.__kwdefaults__
    if is_trusted_module(f.__module__):
        return ([wrap(tx, v, None) for v in d or ()],
                {k: wrap(tx, v, None) for k, v in (kd or {}).items()})
    fsrc = HeldSource(f)
    tx.guard(Guard(GuardKind.ID_MATCH, AttrSource(fsrc, "__code__"), f.__code__))
    dsrc = AttrSource(fsrc, "__defaults__")
    defaults: list[Var] = []
    if d is None:
        tx.guard(Guard(GuardKind.CONSTANT_MATCH, dsrc, None))
    else:
        tx.guard(Guard(GuardKind.ID_MATCH, dsrc, d))
        defaults = [wrap(tx, v, None if type(v) in SCALARS else GetItemSource(dsrc, i))
                    for i, v in enumerate(d)]
    ksrc = AttrSource(fsrc, "__kwdefaults__")
    if kd is None:
        tx.guard(Guard(GuardKind.CONSTANT_MATCH, ksrc, None))
        return defaults, {}
    kv = wrap(tx, kd, ksrc)
    if not isinstance(kv, DictVar):
        raise TypeError(f"{f.__qualname__}.__kwdefaults__ is a {type(kd).__name__}, not a dict")
    return defaults, dict(kv.items)


def guard_class_attr(tx: Tracer, cls: type, name: str, instance: Source | None = None,
                     obj: Any = None, start: int = 0) -> None:
    """Guard that looking `name` up along `cls.__mro__[start:]` (start > 0: `super()`) finds the
    object it finds now; with `instance` (the source of an instance of `cls` whose attribute
    this is) and `obj` (the instance), also that the instance's `__dict__` does not shadow
    it, as it would a method (a data descriptor, like a property, wins over the instance dict:
    no guard needed)."""
    mro = cls.__mro__
    before: list[type] = []
    owner: type | None = None
    found: Any = None
    for c in mro[start:]:
        if name in c.__dict__:
            owner, found = c, c.__dict__[name]
            break
        before.append(c)
    if owner is None:
        return  # not a class attribute: nothing this guard can pin
    user_before = tuple(c for c in before if not is_trusted_module(c.__module__))
    checked_owner = None if is_trusted_module(owner.__module__) else owner
    if user_before or checked_owner is not None:
        walked_more = start > 0 or owner is not cls
        tx.guard(Guard(GuardKind.CLASS_ATTR, HeldSource(cls), ClassLookup(
            name, found, checked_owner, user_before, mro if walked_more else None)))
    if instance is not None and start == 0 and not _is_data_descriptor(found) and \
            isinstance(getattr(obj, "__dict__", None), dict):
        tx.guard(Guard(GuardKind.TYPE_MATCH, instance, cls))
        tx.guard(Guard(GuardKind.NOT_IN, AttrSource(instance, "__dict__"), name))


def _is_data_descriptor(a: Any) -> bool:
    t = type(a)
    return hasattr(t, "__get__") and (hasattr(t, "__set__") or hasattr(t, "__delete__"))
