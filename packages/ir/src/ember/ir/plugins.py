"""Shared rule of ember's entry-point registries (passes, backends, decomposition tables)."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint


def still_importing(ep: EntryPoint | object) -> bool:
    """True while `ep`'s module is being imported further up the stack: a plugin that imports
    ember makes a registry look up its plugins before the plugin's own module has run to the
    end. Loading the entry point then would fail (a partially initialized module); the registry
    leaves it for its next lookup instead."""
    name = getattr(ep, "module", None) or str(getattr(ep, "value", "")).partition(":")[0]
    module = sys.modules.get(name) if name else None
    spec = getattr(module, "__spec__", None)
    return module is not None and bool(getattr(spec, "_initializing", False))
