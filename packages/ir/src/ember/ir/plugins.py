"""Shared rules of ember's entry-point registries (passes, backends, decomposition and lowering
tables)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint
from typing import Any


def still_importing(ep: EntryPoint | object) -> bool:
    """True while `ep`'s module is being imported further up the stack: a plugin that imports
    ember makes a registry look up its plugins before the plugin's own module has run to the
    end. Loading the entry point then would fail (a partially initialized module); the registry
    leaves it for its next lookup instead."""
    name = getattr(ep, "module", None) or str(getattr(ep, "value", "")).partition(":")[0]
    module = sys.modules.get(name) if name else None
    spec = getattr(module, "__spec__", None)
    return module is not None and bool(getattr(spec, "_initializing", False))


def load_entry_points(group: str, eps: Iterable[Any], loaded: set[tuple[str, str]],
                      register: Callable[[Any, Any], None], warning: type[Warning]) -> bool:
    """Load the entry points `eps` of `group` not loaded before (`loaded`: their (name, value),
    updated), handing each loaded object to `register(ep, obj)`. One whose module is still
    importing is left for a later call; one that fails to load or register is skipped with
    `warning` naming it (a broken plugin must not take the others down). Returns False when
    some entry point was left for later."""
    complete = True
    for ep in eps:
        key = (ep.name, str(getattr(ep, "value", "")))
        if key in loaded:
            continue
        if still_importing(ep):  # its module is importing ember: look again next time
            complete = False
            continue
        loaded.add(key)
        try:
            register(ep, ep.load())
        except Exception as e:
            # stacklevel: the caller of the registry's load_plugins
            warnings.warn(f"{group} entry point {ep.name} ({key[1]}) failed to load: "
                          f"{type(e).__name__}: {e}", warning, stacklevel=3)
    return complete
