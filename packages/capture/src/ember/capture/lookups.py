"""Guards on the Python definitions a capture followed: the functions it inlined and the class
attribute lookups that found them.

A graph inlines a function's code with its default values, so it is valid only while that
function object keeps its `__code__`, `__defaults__` and `__kwdefaults__` (all assignable), and
while the lookups that led to it (`self.f`, `obj.prop`, `Cls.method`, a module's `forward`)
still find it: the class and its bases may be patched, and an instance attribute shadows a
method. Values follow wrap's rules: a defaults tuple by identity (it is immutable, so its
scalars need nothing more), its other values (a tensor, a list) by their own guards, the
kw-defaults dict (mutable) by keys and values; only where the capture bound a default. Functions and classes of torch and the standard
library are not guarded (TRUSTED_MODULES: they are not monkeypatched between calls); a closure
cell's contents are guarded where they are read (`CellSource`).
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from ember.capture.guards import ClassLookup, Guard, GuardKind
from ember.capture.sources import AttrSource, GetItemSource, HeldSource, Source
from ember.capture.variables import Var
from ember.capture.wrap import SCALARS, is_trusted_module, wrap

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


def function_defaults(tx: Tracer, f: types.FunctionType
                      ) -> tuple[Sequence[Var], Mapping[str, Var]]:
    """The defaults and keyword-only defaults `f` is inlined with, and a guard on its code
    object (unless `f` is torch's or the standard library's). A default is read, and guarded,
    only when the call binds it: a call that passes every argument does not depend on them."""
    if is_trusted_module(f.__module__):
        return ([wrap(tx, v, None) for v in f.__defaults__ or ()],
                {k: wrap(tx, v, None) for k, v in (f.__kwdefaults__ or {}).items()})
    tx.guard(Guard(GuardKind.ID_MATCH, AttrSource(HeldSource(f), "__code__"), f.__code__))
    return _Defaults(tx, f), _KwDefaults(tx, f)


class _Defaults(Sequence[Var]):
    """`f.__defaults__`, wrapped on first use: the tuple by identity (it is immutable, so its
    scalars need nothing more), a value of another kind (a tensor, a list) by its own guards."""

    def __init__(self, tx: Tracer, f: types.FunctionType):
        self.tx, self.f = tx, f
        self.raw = f.__defaults__ or ()
        self.src = AttrSource(HeldSource(f), "__defaults__")
        self.wrapped: dict[int, Var] = {}

    def __len__(self) -> int:
        return len(self.raw)

    @overload
    def __getitem__(self, i: int) -> Var: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Var]: ...

    def __getitem__(self, i: int | slice) -> Var | Sequence[Var]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self.raw))[i]]
        if i not in self.wrapped:
            self.tx.guard(Guard(GuardKind.ID_MATCH, self.src, self.raw))
            v = self.raw[i]
            self.wrapped[i] = wrap(self.tx, v, None if type(v) in SCALARS
                                   else GetItemSource(self.src, i))
        return self.wrapped[i]


class _KwDefaults(Mapping[str, Var]):
    """`f.__kwdefaults__` (a mutable dict), each value guarded when its parameter takes it."""

    def __init__(self, tx: Tracer, f: types.FunctionType):
        self.tx, self.f = tx, f
        self.raw: dict[str, Any] = dict(f.__kwdefaults__ or {})
        self.src = AttrSource(HeldSource(f), "__kwdefaults__")
        self.wrapped: dict[str, Var] = {}

    def __len__(self) -> int:
        return len(self.raw)

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __contains__(self, k: object) -> bool:
        return k in self.raw

    def __getitem__(self, k: str) -> Var:
        if k not in self.wrapped:
            self.tx.guard(Guard(GuardKind.TYPE_MATCH, self.src, dict))
            self.tx.guard(Guard(GuardKind.DICT_KEYS, self.src, tuple(self.raw)))
            self.wrapped[k] = wrap(self.tx, self.raw[k], GetItemSource(self.src, k))
        return self.wrapped[k]


def guard_function(tx: Tracer, f: types.FunctionType) -> None:
    """Guard all of `f`'s code and defaults, used or not (its signature was read)."""
    if is_trusted_module(f.__module__):
        return
    fsrc = HeldSource(f)
    tx.guard(Guard(GuardKind.ID_MATCH, AttrSource(fsrc, "__code__"), f.__code__))
    d, kd = f.__defaults__, f.__kwdefaults__
    dsrc, ksrc = AttrSource(fsrc, "__defaults__"), AttrSource(fsrc, "__kwdefaults__")
    tx.guard(Guard(GuardKind.ID_MATCH, dsrc, d) if d is not None
             else Guard(GuardKind.CONSTANT_MATCH, dsrc, None))
    for i, v in enumerate(d or ()):
        if type(v) not in SCALARS:
            wrap(tx, v, GetItemSource(dsrc, i))
    if kd is None:
        tx.guard(Guard(GuardKind.CONSTANT_MATCH, ksrc, None))
    else:
        wrap(tx, kd, ksrc)


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
