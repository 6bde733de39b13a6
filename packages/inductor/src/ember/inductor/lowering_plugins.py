"""Lowering tables from plugins: the entry point group `ember.lowerings`.

A lowering table maps prims to their loop-IR rules (ember.inductor.lowering.LOWERINGS is the
default; `register_lowering_table` adds one by name, selected with `lower-loops{table=NAME}`).
A third-party package ships one through the group, as decomposition tables ship through
`ember.decompositions`: an entry point names a dict (prim -> rule), registered under the entry
point's name, or a callable that takes `register_lowering_table` and registers its tables.
The group is read on the first lookup of a table that is not registered (lower-loops, compile's
pipeline check, `ember passes`), once; a broken entry point is skipped with a
LoweringPluginWarning naming it (it must not take the other tables down).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from ember.inductor.lowering import (
    LOWERING_TABLES,
    TABLE_LOADERS,
    Rule,
    register_lowering_table,
)
from ember.ir.plugins import load_entry_points

GROUP = "ember.lowerings"
_loaded: set[tuple[str, str]] = set()  # entry points already loaded (name, value)


class LoweringPluginWarning(UserWarning):
    """An `ember.lowerings` entry point could not be loaded: its tables are missing."""


def load_lowering_plugins() -> None:
    """Register the tables of the `ember.lowerings` entry points not loaded before."""
    def register(ep: Any, obj: Any) -> None:
        if isinstance(obj, dict):
            if ep.name not in LOWERING_TABLES:
                register_lowering_table(ep.name, obj)
        elif callable(obj):
            obj(register_lowering_table)
        else:
            raise TypeError(f"{type(obj).__name__} is neither a lowering table (a dict of "
                            f"prim -> rule) nor a callable")

    load_entry_points(GROUP, entry_points(group=GROUP), _loaded, register,
                      LoweringPluginWarning)


def lowering_tables() -> dict[str, dict[str, Rule]]:
    """Every registered lowering table, the plugins' included."""
    load_lowering_plugins()
    return dict(sorted(LOWERING_TABLES.items()))


def lowering_table(name: str) -> dict[str, Rule] | None:
    """The table registered as `name` (plugins looked up on a miss), or None."""
    rules = LOWERING_TABLES.get(name)
    if rules is None:
        load_lowering_plugins()
        rules = LOWERING_TABLES.get(name)
    return rules


TABLE_LOADERS.append(load_lowering_plugins)  # lower-loops{table=NAME} reads plugins
