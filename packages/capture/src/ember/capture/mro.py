"""Class attribute lookup along the MRO, as `type.__getattribute__` finds an attribute before
any descriptor runs: the one copy used by attribute access, operators, calls and side effects."""

from __future__ import annotations

from typing import Any

MISSING: Any = object()  # `lookup`'s default: "no class along the MRO defines the name"


def lookup(cls: type, name: str, default: Any = MISSING) -> Any:
    """The raw attribute `name` of a class, found along its MRO without invoking descriptors
    (`default` when no class defines it)."""
    for klass in cls.__mro__:
        d = klass.__dict__
        if name in d:
            return d[name]
    return default


def lookup_type_attr(cls: type, name: str) -> Any:
    """`lookup` with None for a missing name (for special methods, where None is not one)."""
    return lookup(cls, name, None)
