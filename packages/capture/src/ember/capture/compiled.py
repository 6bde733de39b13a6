"""Objects ember already compiled, called inside a captured frame.

A compiled module used as a submodule of a compiled model (`outer[1] = compile(m)`), or a
compiled function called by a compiled function: capture traces what was compiled, never
ember's runtime wrapper around it (whose guard checks and cache are not capturable and would
break the outer graph), as TorchDynamo inlines an OptimizedModule's `_orig_mod`. The runtime
sits above capture, so its wrapper classes are recognised by a class attribute,
`_ember_original`: the name of the instance attribute holding the original (`_orig_mod` for a
compiled module, `target` for a compiled function). The original is read through that
attribute's source, so it is guarded by identity like any other module or function, and its
parameters are graph inputs named by that path (`self.1._orig_mod.weight`). Inside the outer
graph the outer compile's options apply; the wrapper's own (backend, mode, dynamic) apply where
it is called on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.capture.sources import AttrSource
from ember.capture.variables import ObjectVar, Var

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

ORIGINAL = "_ember_original"


def original_attr(value: Any) -> str | None:
    """The attribute holding what `value` compiled, where `value` is an ember wrapper."""
    name = getattr(type(value), ORIGINAL, None)
    return name if isinstance(name, str) else None


def original(tx: Tracer, var: Var) -> Var | None:
    """The symbolic original behind a compiled wrapper `var` (a module is an ObjectVar too);
    None for anything else."""
    if not isinstance(var, ObjectVar):
        return None
    name = original_attr(var.value)
    if name is None:
        return None
    src = AttrSource(var.source, name) if var.source is not None else None
    return tx.wrap(getattr(var.value, name), src)
