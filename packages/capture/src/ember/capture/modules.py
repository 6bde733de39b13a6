"""nn.Module calls and containers (ModuleList, Sequential, ModuleDict, ParameterList).

Calling a module inlines its `forward` with `self` bound to the module (hooks are refused and
guarded absent). Indexing module containers reads their child tables through sources, so each
child is guarded by identity and its parameters become graph inputs named by their path.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

from torch import nn

from ember.capture.compiled import original
from ember.capture.errors import UserError, unhandled
from ember.capture.guards import Guard, GuardKind
from ember.capture.lookups import guard_class_attr
from ember.capture.mro import lookup_type_attr
from ember.capture.sources import AttrSource
from ember.capture.variables import (
    ConstVar,
    DictVar,
    FunctionVar,
    ModuleVar,
    TupleVar,
    Var,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                "_backward_pre_hooks")


def has_own_hooks(m: nn.Module) -> bool:
    """Whether hooks are registered on `m` itself (not on nn.Module globally)."""
    return any(getattr(m, t, None) for t in _HOOK_TABLES)


def _global_hooks() -> bool:
    from torch.nn.modules import module as m

    return any(bool(getattr(m, name, None)) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks", "_global_module_registration_hooks"))


def call_module(tx: Tracer, mod: ModuleVar, args: list[Var], kwargs: dict[str, Var]) -> Var:
    m = mod.value
    if has_own_hooks(m):
        raise unhandled(f"hooks on module {type(m).__qualname__}")
    if _global_hooks():
        raise unhandled("global nn.Module hooks")
    tx.guard(Guard(GuardKind.NO_GLOBAL_HOOKS, None))  # one registered later must recompile
    if mod.source is not None:
        tx.guard(Guard(GuardKind.NO_HOOKS, mod.source))
    orig = original(tx, mod)  # a module ember compiled: its original is traced (compiled.py)
    if isinstance(orig, ModuleVar):
        return call_module(tx, orig, args, kwargs)
    call = type(m).__call__
    # `__call__` is looked up on the type only (a special method); `forward` as `self.forward`
    # is, so an instance attribute shadows it: both guarded, as patching either changes the call
    guard_class_attr(tx, type(m), "__call__")
    if call is not nn.Module.__call__ and isinstance(call, types.FunctionType):
        return tx.call(FunctionVar(call), [mod, *args], kwargs)
    if "forward" in m.__dict__:
        from ember.capture.attrs import getattr_var

        return tx.call(getattr_var(tx, mod, "forward"), args, kwargs)
    guard_class_attr(tx, type(m), "forward", mod.source, m)
    fwd = type(m).forward
    if fwd is nn.Module.forward or getattr(fwd, "__name__", "") == "_forward_unimplemented":
        raise UserError(NotImplementedError(f"Module [{type(m).__name__}] is missing the "
                                            f"required \"forward\" function"))
    if not isinstance(fwd, types.FunctionType):
        raise unhandled(f"forward of {type(m).__qualname__} is not a Python function")
    return tx.call(FunctionVar(fwd), [mod, *args], kwargs)


def _table(tx: Tracer, mod: ModuleVar, name: str) -> DictVar:
    table = mod.value.__dict__[name]
    v = tx.wrap(table, AttrSource(mod.source, name) if mod.source is not None else None)
    if not isinstance(v, DictVar):
        raise unhandled(f"{type(mod.value).__qualname__}.{name} is a "
                        f"{type(table).__name__}, not a dict")
    return v


def module_getitem(tx: Tracer, mod: ModuleVar, key: Var) -> Var:
    m = mod.value
    if isinstance(m, nn.ModuleDict | nn.ParameterDict):
        table = _table(tx, mod, "_modules" if isinstance(m, nn.ModuleDict) else "_parameters")
        if not isinstance(key, ConstVar) or key.value not in table.items:
            raise UserError(KeyError(getattr(key, "value", key)))
        return table.items[key.value]
    if isinstance(m, nn.ModuleList | nn.Sequential | nn.ParameterList):
        table = _table(tx, mod, "_parameters" if isinstance(m, nn.ParameterList) else "_modules")
        items = list(table.items.values())
        if isinstance(key, ConstVar) and isinstance(key.value, int):
            try:
                return items[key.value]
            except IndexError:
                raise UserError(IndexError(f"index {key.value} is out of range")) from None
        if isinstance(key, ConstVar) and isinstance(key.value, slice):
            if isinstance(m, nn.Sequential):
                raise unhandled("slicing an nn.Sequential (it builds a new module)")
            return TupleVar(items[key.value])
        raise unhandled(f"indexing a {type(m).__name__} with {key.describe()}")
    f = lookup_type_attr(type(m), "__getitem__")
    if f is not None and isinstance(f, types.FunctionType):
        return tx.call(FunctionVar(f), [mod, key])
    raise unhandled(f"indexing module {type(m).__qualname__}")

