"""Calls, function creation, returns and generators."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

from ember.capture import pyops
from ember.capture.builtins import iterate
from ember.capture.errors import UserError, unhandled
from ember.capture.frame import PY_VERSION, Frame, Instr
from ember.capture.opcodes import (
    ALL,
    ONLY_311,
    ONLY_313,
    SINCE_312,
    UNTIL_312,
    Return,
    callee,
    handler,
)
from ember.capture.variables import (
    CellRefVar,
    ConstVar,
    DictVar,
    IteratorVar,
    NestedFunctionVar,
    Var,
    items_of,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


@handler("PRECALL", versions=ONLY_311)
def precall(tx: Tracer, frame: Frame, inst: Instr) -> None:
    return None  # 3.11 only: a specialization point before CALL


@handler("KW_NAMES", versions=UNTIL_312)
def kw_names(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None  # an index into co_consts (dis does not decode it in 3.11)
    frame.kw_names = tuple(frame.code.co_consts[inst.arg])


def _call(tx: Tracer, frame: Frame, nargs: int, names: tuple[str, ...]) -> None:
    # Stack: [NULL, callable, args...] (3.11, 3.12) or [callable, NULL, args...] (3.13), or
    # [method, self, args...]; the last len(names) arguments are keywords.
    args = frame.popn(nargs)
    second, first = frame.pop(), frame.pop()
    fn = callee(first, second)
    npos = len(args) - len(names)
    kwargs = dict(zip(names, args[npos:], strict=True))
    frame.push(tx.call(fn, args[:npos], kwargs))


@handler("CALL", versions=ALL)
def call(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    names = frame.kw_names or ()  # set by KW_NAMES (3.11, 3.12)
    frame.kw_names = None
    _call(tx, frame, inst.arg, names)


@handler("CALL_KW", versions=ONLY_313)
def call_kw(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.13: the keyword names are a tuple on top of the stack (KW_NAMES is gone)
    assert inst.arg is not None
    names = frame.pop()
    if not (isinstance(names, ConstVar) and isinstance(names.value, tuple)):
        raise unhandled(f"CALL_KW with keyword names from a {names.describe()}", inst.opname)
    _call(tx, frame, inst.arg, tuple(names.value))


@handler("CALL_FUNCTION_EX", versions=ALL)
def call_function_ex(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    kwargs: dict[str, Var] = {}
    if inst.arg & 1:
        kw = frame.pop()
        if not isinstance(kw, DictVar):
            raise unhandled(f"** of a {kw.describe()}")
        for k in kw.items:
            if not isinstance(k, str):
                raise UserError(TypeError("keywords must be strings"))
        kwargs = dict(kw.items)
    args = frame.pop()
    second, first = frame.pop(), frame.pop()
    fn = callee(first, second)  # 3.13 always has NULL above the callable here
    items = items_of(args)
    frame.push(tx.call(fn, list(items) if items is not None else iterate(tx, args), kwargs))


def _new_function(frame: Frame) -> NestedFunctionVar:
    code_var = frame.pop()
    assert isinstance(code_var, ConstVar) and isinstance(code_var.value, types.CodeType)
    code: types.CodeType = code_var.value
    return NestedFunctionVar(code, frame.globals, code.co_qualname, None, None, None)


def _set_function_attribute(fn: NestedFunctionVar, flag: int, value: Var) -> None:
    """MAKE_FUNCTION's flags (3.11, 3.12) and SET_FUNCTION_ATTRIBUTE's argument (3.13)."""
    if flag == 0x08:
        cells = items_of(value)
        assert cells is not None
        fn.closure = [c.cell if isinstance(c, CellRefVar) else c for c in cells]
    elif flag == 0x02:
        if isinstance(value, DictVar):
            fn.kwdefaults = {str(k): v for k, v in value.items.items()}
        elif isinstance(value, ConstVar) and isinstance(value.value, dict):
            fn.kwdefaults = {k: ConstVar(v) for k, v in value.value.items()}
    elif flag == 0x01:
        d = items_of(value)
        assert d is not None
        fn.defaults = list(d)
    # 0x04 (annotations) and 0x10 (3.13's annotate function): not needed to call it


@handler("MAKE_FUNCTION", versions=UNTIL_312)
def make_function(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    fn = _new_function(frame)
    for flag in (0x08, 0x04, 0x02, 0x01):  # the values lie in this order, top first
        if inst.arg & flag:
            _set_function_attribute(fn, flag, frame.pop())
    frame.push(fn)


@handler("MAKE_FUNCTION", versions=ONLY_313)
def make_function_313(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(_new_function(frame))  # 3.13: no flags; SET_FUNCTION_ATTRIBUTE sets them


@handler("SET_FUNCTION_ATTRIBUTE", versions=ONLY_313)
def set_function_attribute(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    fn, value = frame.pop(), frame.pop()
    assert isinstance(fn, NestedFunctionVar), f"setting an attribute of {fn.describe()}"
    _set_function_attribute(fn, inst.arg, value)
    frame.push(fn)


@handler("RETURN_VALUE", versions=ALL)
def return_value(tx: Tracer, frame: Frame, inst: Instr) -> Return:
    return Return(frame.pop())


@handler("RETURN_CONST", versions=SINCE_312)
def return_const(tx: Tracer, frame: Frame, inst: Instr) -> Return:
    return Return(ConstVar(inst.argval))  # 3.12: LOAD_CONST + RETURN_VALUE in one


@handler("RETURN_GENERATOR", versions=ALL)
def return_generator(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # A generator runs to completion at once (see Tracer.inline); the POP_TOP that follows
    # in the generator's code discards this placeholder for the generator object.
    if frame.yields is None:
        raise unhandled("a generator frame without a collector")
    frame.push(ConstVar(None))


@handler("YIELD_VALUE", versions=ALL)
def yield_value(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    if frame.yields is None:
        raise unhandled("yield outside a generator")
    if len(frame.yields) >= tx.MAX_YIELDS:
        raise unhandled(f"a generator yielding more than {tx.MAX_YIELDS} values")
    frame.yields.append(v)
    frame.push(ConstVar(None))  # what send() would have sent: next() sends None


# `yield from it` (GET_YIELD_FROM_ITER; LOAD_CONST None; SEND ... YIELD_VALUE ... JUMP back to
# SEND): generators run to completion when called, so every value `it` has left is yielded at
# once, and the SEND loop finds it exhausted and takes its return value (a generator's, or None).
@handler("GET_YIELD_FROM_ITER", versions=ALL)
def get_yield_from_iter(tx: Tracer, frame: Frame, inst: Instr) -> None:
    if frame.yields is None:
        raise unhandled("yield from outside a generator")
    it = pyops.get_iter(tx, frame.pop())
    items = it.rest()
    if len(frame.yields) + len(items) > tx.MAX_YIELDS:
        raise unhandled(f"a generator yielding more than {tx.MAX_YIELDS} values")
    frame.yields.extend(items)
    frame.push(it)


@handler("SEND", versions=ALL)
def send(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.pop()  # the value sent: None, as next() sends (YIELD_VALUE pushes None)
    it = frame.pop()
    if not isinstance(it, IteratorVar) or it.next() is not None:
        raise unhandled("send() to a generator other than by yield from")
    if PY_VERSION >= (3, 12):
        frame.push(it)  # END_SEND pops it from under the result (3.12, 3.13)
    frame.push(it.returned if it.returned is not None else ConstVar(None))
    frame.jump(inst.argval)


@handler("END_SEND", versions=SINCE_312)
def end_send(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    frame.pop()
    frame.push(v)
