"""Side effects on Python objects during capture: tracked, never performed, replayed after the
graph.

Capture never writes a real object. A write to something from outside the frame is recorded on
its symbolic value, and later reads in the same capture see the written value:

* attribute writes (`self.calls += 1`, `obj.last = y`) on objects and nn.Modules: recorded by
  `ember.capture.attrs` (reads consult the record first);
* `list.append`/`extend`/`pop`/`__setitem__`/..., dict updates on lists and dicts passed in or read
  from objects: the symbolic container is changed and marked `mutated`;
* global writes (`STORE_GLOBAL`): recorded here, and `LOAD_GLOBAL` reads them back.

At the end of a capture (or at a graph break) `collect` turns them into `Effect`s: for each
object, its final state, applied once after the graph has run, in the order the objects were
first written: `setattr(obj, name, value)`, `globals[name] = value`, `lst[:] = items`,
`d.clear(); d.update(items)`. No user code runs between them, so applying final states is
indistinguishable from replaying every write; a `print` or any other construct that could observe
them is a graph break, and the writes before it are applied before it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.errors import unhandled
from ember.capture.mro import MISSING, lookup
from ember.capture.result import OutDict, OutSeq, OutSpec
from ember.capture.sources import ConstantSource, Source
from ember.capture.variables import ConstVar, DictVar, ListVar, ObjectVar, TensorVar, Var
from ember.capture.wrap import already_wrapped

if TYPE_CHECKING:
    from ember.capture.frame import Frame
    from ember.capture.tracer import Tracer


@dataclass(frozen=True)
class Effect:
    """One write to replay. kind: "attr" (setattr(target, name, value)), "global"
    (target[name] = value, target a globals dict held by reference), "list" (target[:] =
    value), "dict" (target.clear(); target.update(value))."""

    kind: str
    target: Source
    name: str
    value: Var

    def describe(self) -> str:
        from ember.capture.sources import describe

        where = describe(self.target)
        if self.kind == "attr":
            return f"{where}.{self.name} = ..."
        if self.kind == "global":
            return f"global {self.name} = ..."
        return f"{where} updated in place"


class SideEffects:
    """The tracer's record of global writes (attribute writes live in `attrs`)."""

    def __init__(self) -> None:
        self.globals: dict[tuple[int, str], tuple[dict[str, Any], str, Var]] = {}

    def store_global(self, frame: Frame, name: str, value: Var) -> None:
        if frame.trusted:
            raise unhandled(f"library code writing its global {name!r}")
        key = (id(frame.globals), name)
        self.globals[key] = (frame.globals, name, value)

    def load_global(self, frame: Frame, name: str) -> Var | None:
        entry = self.globals.get((id(frame.globals), name))
        return None if entry is None else entry[2]


def value_spec(eff: Effect, spec: Callable[[Var], OutSpec]) -> OutSpec:
    """What the runtime needs to apply `eff`: the new contents of a list or dict, else the value
    written (`spec` gives the output spec of one symbolic value)."""
    v = eff.value
    if eff.kind == "list":
        assert isinstance(v, ListVar), f"list effect holds a {v.describe()}"
        return OutSeq(list, tuple(spec(i) for i in v.items))
    if eff.kind == "dict":
        assert isinstance(v, DictVar), f"dict effect holds a {v.describe()}"
        return OutDict(dict, tuple(v.items), tuple(spec(i) for i in v.items.values()))
    return spec(v)


def apply(effects: list[Effect], values: Sequence[Any]) -> None:
    """Apply the effects; `values` holds, per effect, its target and then its new value."""
    for k, eff in enumerate(effects):
        target, value = values[2 * k], values[2 * k + 1]
        if eff.kind == "attr":
            setattr(target, eff.name, value)
        elif eff.kind == "global":
            target[eff.name] = value
        elif eff.kind == "list":
            target[:] = value
        else:
            target.clear()
            target.update(value)


def module_attr_writable(obj: Any, name: str, value: Var) -> bool:
    """An nn.Module attribute that a write only rebinds in its `__dict__` (a counter, a flag, a
    cached Python value): not a parameter, buffer or child module, and no tensor or module is
    assigned (those change the module's tables: functionalization's and module surgery's)."""
    if not isinstance(obj, torch.nn.Module) or isinstance(value, TensorVar | ObjectVar):
        return False
    d = obj.__dict__
    if any(name in d.get(t, ()) for t in ("_parameters", "_buffers", "_modules")):
        return False
    attr = lookup(type(obj), name)
    return attr is MISSING or not (hasattr(attr, "__set__") or hasattr(attr, "__delete__"))


def _restored(var: Var, before: Any, missing: Any) -> bool:
    """An attribute written back to the value it had before capture (a flag set and reset)."""
    return isinstance(var, ConstVar) and before is not missing and (
        var.value is before or (type(var.value) is type(before) and
                                type(before) in (int, float, str, bool) and var.value == before))


def collect(tx: Tracer) -> list[Effect]:
    """The writes of this capture to replay, in order of first write."""
    from ember.capture import attrs

    out: list[Effect] = []
    for (_, name), (obj, var, before) in attrs._WRITES.pop(tx, {}).items():
        if _restored(var, before, MISSING):
            continue
        out.append(Effect("attr", _source_of(tx, obj), name, var))
    for g, name, var in tx.side_effects.globals.values():
        out.append(Effect("global", ConstantSource(g, "globals"), name, var))
    for var, _ in tx.wrapped.values():
        if isinstance(var, ListVar | DictVar) and var.mutated and var.source is not None:
            out.append(Effect("list" if isinstance(var, ListVar) else "dict", var.source, "",
                              var))
    return out


def _source_of(tx: Tracer, obj: Any) -> Source:
    """How the runtime reaches `obj`: its source in this capture, else the object itself."""
    known = already_wrapped(tx, obj)
    if known is not None and known.source is not None:
        return known.source
    return ConstantSource(obj, type(obj).__name__)
