"""Calls, function creation, returns and generators."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

from ember.capture import pyops
from ember.capture.builtins import iterate
from ember.capture.errors import UserError, unhandled
from ember.capture.frame import PY_VERSION, Frame, Instr
from ember.capture.opcodes import ALL, ONLY_311, ONLY_312, Return, handler
from ember.capture.variables import (
    Cell,
    CellRefVar,
    ConstVar,
    DictVar,
    IteratorVar,
    MethodVar,
    NestedFunctionVar,
    NullVar,
    Var,
    items_of,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


@handler("PRECALL", versions=ONLY_311)
def precall(tx: Tracer, frame: Frame, inst: Instr) -> None:
    return None  # 3.11 only: a specialization point before CALL


@handler("KW_NAMES", versions=ALL)
def kw_names(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None  # an index into co_consts (dis does not decode it in 3.11)
    frame.kw_names = tuple(frame.code.co_consts[inst.arg])


@handler("CALL", versions=ALL)
def call(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # Stack: [NULL, callable, args...] or [method, self, args...] (3.11 and 3.12).
    assert inst.arg is not None
    args = frame.popn(inst.arg)
    names = frame.kw_names or ()
    frame.kw_names = None
    second, first = frame.pop(), frame.pop()
    fn: Var = second if isinstance(first, NullVar) else MethodVar(first, second)
    npos = len(args) - len(names)
    kwargs = dict(zip(names, args[npos:], strict=True))
    frame.push(tx.call(fn, args[:npos], kwargs))


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
    fn = frame.pop()
    null = frame.pop()
    if not isinstance(null, NullVar):  # 3.11/3.12 push NULL below the callable here
        fn = MethodVar(null, fn)
    items = items_of(args)
    frame.push(tx.call(fn, list(items) if items is not None else iterate(tx, args), kwargs))


@handler("MAKE_FUNCTION", versions=ALL)
def make_function(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    code_var = frame.pop()
    assert isinstance(code_var, ConstVar) and isinstance(code_var.value, types.CodeType)
    code: types.CodeType = code_var.value
    closure: list[Cell | object] | None = None
    defaults: list[Var] | None = None
    kwdefaults: dict[str, Var] | None = None
    if inst.arg & 0x08:
        cells = items_of(frame.pop())
        assert cells is not None
        closure = [c.cell if isinstance(c, CellRefVar) else c for c in cells]
    if inst.arg & 0x04:
        frame.pop()  # annotations
    if inst.arg & 0x02:
        kw = frame.pop()
        if isinstance(kw, DictVar):
            kwdefaults = {str(k): v for k, v in kw.items.items()}
        elif isinstance(kw, ConstVar) and isinstance(kw.value, dict):
            kwdefaults = {k: ConstVar(v) for k, v in kw.value.items()}
    if inst.arg & 0x01:
        d = items_of(frame.pop())
        assert d is not None
        defaults = list(d)
    frame.push(NestedFunctionVar(code, frame.globals, code.co_qualname, defaults, kwdefaults,
                                 closure))


@handler("RETURN_VALUE", versions=ALL)
def return_value(tx: Tracer, frame: Frame, inst: Instr) -> Return:
    return Return(frame.pop())


@handler("RETURN_CONST", versions=ONLY_312)
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
        frame.push(it)  # END_SEND pops it from under the result
    frame.push(it.returned if it.returned is not None else ConstVar(None))
    frame.jump(inst.argval)


@handler("END_SEND", versions=ONLY_312)
def end_send(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    frame.pop()
    frame.push(v)
