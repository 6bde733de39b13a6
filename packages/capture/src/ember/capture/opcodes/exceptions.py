"""Raising and handling exceptions: try/except/finally, with-cleanup, assert.

A user exception unwinds through the frames' exception tables (`Frame.handle`) to its handler,
whose bytecode runs here. An exception nothing catches ends capture (unhandled), and the frame
runs eagerly, where Python raises it for real.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.capture.errors import UserError, unhandled
from ember.capture.frame import Frame, Instr
from ember.capture.opcodes import ALL, handler
from ember.capture.variables import ConstVar

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


@handler("LOAD_ASSERTION_ERROR", versions=ALL)
def load_assertion_error(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(ConstVar(AssertionError))


@handler("PUSH_EXC_INFO", versions=ALL)
def push_exc_info(tx: Tracer, frame: Frame, inst: Instr) -> None:
    exc = frame.pop()
    frame.push(frame.exc_stack[-1] if frame.exc_stack else ConstVar(None))
    frame.exc_stack.append(exc)
    frame.push(exc)


@handler("POP_EXCEPT", versions=ALL)
def pop_except(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.pop()
    if frame.exc_stack:
        frame.exc_stack.pop()


@handler("CHECK_EXC_MATCH", versions=ALL)
def check_exc_match(tx: Tracer, frame: Frame, inst: Instr) -> None:
    typ = frame.pop()
    exc = frame.peek()
    if not (isinstance(typ, ConstVar) and isinstance(exc, ConstVar)):
        raise unhandled("an except clause on a non-constant type")
    frame.push(ConstVar(isinstance(exc.value, typ.value)))


def _raise(value: object) -> UserError:
    if isinstance(value, type) and issubclass(value, BaseException):
        value = value()
    if not isinstance(value, BaseException):
        return UserError(TypeError("exceptions must derive from BaseException"))
    return UserError(value)


@handler("RERAISE", versions=ALL)
def reraise(tx: Tracer, frame: Frame, inst: Instr) -> None:
    exc = frame.pop()
    if not isinstance(exc, ConstVar):
        raise unhandled("re-raising a non-constant exception")
    raise _raise(exc.value)


@handler("RAISE_VARARGS", versions=ALL)
def raise_varargs(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    if inst.arg == 0:
        if not frame.exc_stack:
            raise UserError(RuntimeError("No active exception to reraise"))
        cur = frame.exc_stack[-1]
        assert isinstance(cur, ConstVar), f"re-raising a {cur.describe()}"
        raise _raise(cur.value)
    cause = frame.pop() if inst.arg == 2 else None
    exc = frame.pop()
    if not isinstance(exc, ConstVar):
        raise unhandled(f"raising a {exc.describe()}")
    err = _raise(exc.value)
    if isinstance(cause, ConstVar):
        c = cause.value
        err.exc.__cause__ = c() if isinstance(c, type) else c
    raise err


@handler("WITH_EXCEPT_START", versions=ALL)
def with_except_start(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # Stack: [exit, lasti, prev_exc, exc]: call exit(type, value, traceback).
    exc = frame.peek()
    exit_fn = frame.peek(4)
    assert isinstance(exc, ConstVar), f"__exit__ given a {exc.describe()}"
    e = exc.value
    frame.push(tx.call(exit_fn, [ConstVar(type(e)), exc, ConstVar(e.__traceback__)]))
