"""Context managers capture understands: grad mode, autocast, nullcontext; and ContextVars.

Grad mode and autocast are symbolic state of the tracer, applied while torch code runs on fake
tensors. Autocast's casts are recorded as explicit `_to_copy` nodes. A `no_grad` region entered
from grad mode cuts its tensor inputs from autograd with `aten.detach` nodes (see the recorder),
so the graph, run under grad mode, computes exactly what eager computes.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.errors import unhandled
from ember.capture.variables import ConstVar, ContextVar, CtxState, Var

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

_AUTOCAST_TYPES: tuple[type, ...] = (torch.autocast, torch.amp.autocast)
for _mod in ("cpu", "cuda"):
    _amp = getattr(getattr(torch, _mod, None), "amp", None)
    if _amp is not None and isinstance(getattr(_amp, "autocast", None), type):
        _AUTOCAST_TYPES += (_amp.autocast,)

CONTEXT_TYPES: tuple[type, ...] = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled,
                                   torch.inference_mode, contextlib.nullcontext,
                                   *_AUTOCAST_TYPES)


class ExitVar(Var):
    """The bound `__exit__` that BEFORE_WITH leaves on the stack."""

    def __init__(self, ctx: Var):
        self.ctx = ctx

    def python_type(self) -> type:
        return type(lambda: None)


def make_context(tx: Tracer, cls: type, args: list[Any], kwargs: dict[str, Any]) -> ContextVar:
    """A context manager object (its constructor ran with constant arguments)."""
    if cls is torch.no_grad:
        return ContextVar(CtxState("grad", grad=False), cls)
    if cls is torch.enable_grad:
        return ContextVar(CtxState("grad", grad=True), cls)
    if cls is torch.inference_mode:
        mode = args[0] if args else kwargs.get("mode", True)
        return ContextVar(CtxState("grad", grad=not mode) if mode else CtxState("null"), cls)
    if cls is torch.set_grad_enabled:
        mode = args[0] if args else kwargs.get("mode")
        if not isinstance(mode, bool):
            raise unhandled("torch.set_grad_enabled with a non-constant mode")
        st = CtxState("grad", grad=mode, saved=tx.grad_enabled)
        _set_grad(tx, mode)  # like torch: the constructor already switches the mode
        tx.open_grad_changes += 1
        return ContextVar(st, cls)
    if cls is contextlib.nullcontext:
        return ContextVar(CtxState("null", saved=args[0] if args else None), cls)
    if cls in _AUTOCAST_TYPES:
        if cls in (torch.autocast, torch.amp.autocast):
            device = args[0] if args else kwargs.get("device_type")
            rest = args[1:]
        else:
            device = "cuda" if "cuda" in cls.__module__ else "cpu"
            rest = args
        names = ["dtype", "enabled", "cache_enabled"]
        opts = dict(zip(names, rest)) | kwargs
        if not isinstance(device, str):
            raise unhandled("autocast with a non-constant device type")
        dtype = opts.get("dtype") or torch.get_autocast_dtype(device)
        return ContextVar(CtxState("autocast", device=device, dtype=dtype,
                                   enabled=bool(opts.get("enabled", True))), cls)
    raise unhandled(f"context manager {cls.__qualname__}")


def _set_grad(tx: Tracer, mode: bool) -> None:
    if mode and not tx.recorder.entry_grad:
        raise unhandled("enabling grad inside a function called under no_grad")
    if mode != tx.grad_enabled:
        tx.grad_enabled = mode
        tx.recorder.grad_region += 1


def enter(tx: Tracer, ctx: ContextVar) -> Var:
    st = ctx.state
    if st.kind == "null":
        return st.saved if isinstance(st.saved, Var) else ConstVar(st.saved)
    if st.kind == "grad":
        if ctx.cls is torch.set_grad_enabled:
            tx.open_grad_changes -= 1
            return ConstVar(None)
        st.saved = tx.grad_enabled
        _set_grad(tx, st.grad)
        return ConstVar(None)
    if st.kind == "autocast":
        tx.autocast.append(st)
        return ConstVar(None)
    raise AssertionError(st.kind)


def exit_(tx: Tracer, ctx: ContextVar) -> Var:
    st = ctx.state
    if st.kind == "grad":
        _set_grad(tx, bool(st.saved))
    elif st.kind == "autocast":
        if not tx.autocast or tx.autocast[-1] is not st:
            raise unhandled("autocast contexts exited out of order")
        tx.autocast.pop()
    return ConstVar(False)


def call_context_method(tx: Tracer, ctx: ContextVar, name: str, args: list[Var]) -> Var:
    if name == "__enter__":
        return enter(tx, ctx)
    if name == "__exit__":
        return exit_(tx, ctx)
    raise unhandled(f"method {name} of {ctx.cls.__qualname__}")


# -- contextvars.ContextVar ------------------------------------------------------------------
# Library code sets a ContextVar around a call and resets it afterwards (transformers does, for
# its output collectors). Capture keeps such values symbolically, per tracer: `set` records the
# new value and returns a token, `get` reads it, `reset(token)` restores the previous one. A
# value still set when capture ends would be a lost side effect: capture refuses it.
_CTXVARS: weakref.WeakKeyDictionary[Tracer, dict[int, tuple[contextvars.ContextVar[Any], Var]]] \
    = weakref.WeakKeyDictionary()


class TokenVar(Var):
    """The token ContextVar.set returned during capture."""

    def __init__(self, var: contextvars.ContextVar[Any], previous: Var | None):
        self.var = var
        self.previous = previous  # None: the variable had no symbolic value before the set
        self.used = False

    def python_type(self) -> type:
        return contextvars.Token


def _cv(args: list[Var]) -> contextvars.ContextVar[Any]:
    from ember.capture.variables import ObjectVar

    if not args or not isinstance(args[0], ObjectVar) or not isinstance(
            args[0].value, contextvars.ContextVar):
        raise unhandled("a ContextVar method on something that is not a ContextVar")
    return args[0].value


def contextvar_set(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    var = _cv(args)
    state = _CTXVARS.setdefault(tx, {})
    prev = state.get(id(var))
    state[id(var)] = (var, args[1])
    return TokenVar(var, prev[1] if prev is not None else None)


def contextvar_get(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    var = _cv(args)
    entry = _CTXVARS.get(tx, {}).get(id(var))
    if entry is not None:
        return entry[1]
    from ember.capture.sources import ContextVarSource

    default = args[1] if len(args) > 1 else None
    missing = object()
    real = var.get(missing)
    if real is missing:
        if default is None:
            raise unhandled(f"reading ContextVar {var.name!r}, which has no value")
        return default
    return tx.wrap(real, ContextVarSource(var))


def contextvar_reset(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    var = _cv(args)
    token = args[1] if len(args) > 1 else None
    if not isinstance(token, TokenVar) or token.var is not var or token.used:
        raise unhandled(f"ContextVar {var.name!r} reset with a token not made during capture")
    token.used = True
    state = _CTXVARS.setdefault(tx, {})
    if token.previous is None:
        state.pop(id(var), None)
    else:
        state[id(var)] = (var, token.previous)
    return ConstVar(None)


def check_context_vars(tx: Tracer) -> None:
    """Refuse a capture that leaves a ContextVar set (a side effect capture would lose)."""
    for var, _ in _CTXVARS.pop(tx, {}).values():
        raise unhandled(f"ContextVar {var.name!r} set and not reset (a side effect)")
