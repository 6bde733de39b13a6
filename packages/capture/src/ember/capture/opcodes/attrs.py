"""Attribute loads and stores, method loads and super()."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from ember.capture.attrs import getattr_var, setattr_var
from ember.capture.errors import unhandled
from ember.capture.frame import Frame, Instr
from ember.capture.opcodes import ALL, ONLY_311, SINCE_312, handler, push_with_null
from ember.capture.variables import ConstVar, MethodVar, SuperVar, Var

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


def _push_method(frame: Frame, attr: Var) -> None:
    """The method-call form: [function, self] for a bound method, else the attribute with its
    NULL ([NULL, attribute] before 3.13, [attribute, NULL] on 3.13)."""
    if isinstance(attr, MethodVar):
        frame.push(attr.func)
        frame.push(attr.obj)
    else:
        push_with_null(frame, attr)


@handler("LOAD_ATTR", versions=ONLY_311)
def load_attr_311(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(getattr_var(tx, frame.pop(), inst.argval))


@handler("LOAD_METHOD", versions=ONLY_311)
def load_method(tx: Tracer, frame: Frame, inst: Instr) -> None:
    _push_method(frame, getattr_var(tx, frame.pop(), inst.argval))


@handler("LOAD_ATTR", versions=SINCE_312)
def load_attr_312(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.12, 3.13: the low bit of the argument selects the method form (LOAD_METHOD is gone).
    assert inst.arg is not None
    attr = getattr_var(tx, frame.pop(), inst.argval)
    if inst.arg & 1:
        _push_method(frame, attr)
    else:
        frame.push(attr)


@handler("LOAD_SUPER_ATTR", versions=SINCE_312)
def load_super_attr(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.12, 3.13: super().name (and super(C, self).name) without building the super object:
    # stack [super, class, self]; bit 0: method form; bit 1: the two-argument form.
    assert inst.arg is not None
    obj, cls, sup = frame.pop(), frame.pop(), frame.pop()
    if not (isinstance(sup, ConstVar) and sup.value is builtins.super):
        raise unhandled("LOAD_SUPER_ATTR with a shadowed super", inst.opname)
    if not (isinstance(cls, ConstVar) and isinstance(cls.value, type)):
        raise unhandled("super() of a non-constant class", inst.opname)
    attr = getattr_var(tx, SuperVar(cls.value, obj), inst.argval)
    if inst.arg & 1:
        _push_method(frame, attr)
    else:
        frame.push(attr)


@handler("STORE_ATTR", versions=ALL)
def store_attr(tx: Tracer, frame: Frame, inst: Instr) -> None:
    obj, value = frame.pop(), frame.pop()
    setattr_var(tx, obj, inst.argval, value)


@handler("DELETE_ATTR", versions=ALL)
def delete_attr(tx: Tracer, frame: Frame, inst: Instr) -> None:
    obj = frame.pop()
    from ember.capture.variables import NewObjectVar

    if isinstance(obj, NewObjectVar) and inst.argval in obj.attrs:
        del obj.attrs[inst.argval]
        return
    raise unhandled(f"deleting attribute {inst.argval!r} of {obj.describe()}")
