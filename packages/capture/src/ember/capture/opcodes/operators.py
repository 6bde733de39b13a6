"""Arithmetic, comparison, subscripts, slices (3.12) and string formatting."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

from ember.capture import pyops
from ember.capture.errors import unhandled
from ember.capture.frame import PY_VERSION, Frame, Instr
from ember.capture.opcodes import ALL, ONLY_311, ONLY_313, SINCE_312, UNTIL_312, handler
from ember.capture.opcodes.control import next_is_truth_jump
from ember.capture.torchcalls import unwrap
from ember.capture.variables import ConstVar, Var

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


@handler("BINARY_OP", versions=ALL)
def binary_op(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    b, a = frame.pop(), frame.pop()
    n = len(pyops.NB_OPS)
    if inst.arg < n:
        frame.push(pyops.binary(tx, pyops.NB_OPS[inst.arg][1], a, b))
    elif inst.arg < 2 * n:
        i = inst.arg - n
        frame.push(pyops.binary(tx, pyops.NB_OPS[i][1], a, b, pyops.NB_INPLACE[i]))
    else:
        raise unhandled(f"BINARY_OP {inst.arg}", inst.opname)


@handler("UNARY_NEGATIVE", versions=ALL)
def unary_negative(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(pyops.unary(tx, operator.neg, frame.pop()))


@handler("UNARY_POSITIVE", versions=ONLY_311)  # 3.12: CALL_INTRINSIC_1 INTRINSIC_UNARY_POSITIVE
def unary_positive(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(pyops.unary(tx, operator.pos, frame.pop()))


@handler("UNARY_INVERT", versions=ALL)
def unary_invert(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(pyops.unary(tx, operator.invert, frame.pop()))


@handler("UNARY_NOT", versions=ALL)
def unary_not(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(ConstVar(not pyops.truth(tx, frame.pop())))


@handler("COMPARE_OP", versions=ALL)
def compare_op(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # dis decodes the operator in every version (3.12 moved it to arg >> 4, 3.13 to arg >> 5).
    b, a = frame.pop(), frame.pop()
    op = inst.argval
    if op not in pyops.COMPARE:
        raise unhandled(f"COMPARE_OP {op!r}", inst.opname)
    r = pyops.compare(tx, op, a, b)
    # 3.13: bit 16 converts the result to bool (the TO_BOOL of a condition); before a jump it
    # is left to the jump, as TO_BOOL is (see control.to_bool)
    if PY_VERSION >= (3, 13) and (inst.arg or 0) & 16 and not next_is_truth_jump(frame):
        r = ConstVar(pyops.truth(tx, r))
    frame.push(r)


@handler("IS_OP", versions=ALL)
def is_op(tx: Tracer, frame: Frame, inst: Instr) -> None:
    b, a = frame.pop(), frame.pop()
    frame.push(ConstVar(pyops.identical(a, b) != bool(inst.arg)))


@handler("CONTAINS_OP", versions=ALL)
def contains_op(tx: Tracer, frame: Frame, inst: Instr) -> None:
    container, item = frame.pop(), frame.pop()
    frame.push(ConstVar(pyops.contains(tx, item, container) != bool(inst.arg)))


@handler("BINARY_SUBSCR", versions=ALL)
def binary_subscr(tx: Tracer, frame: Frame, inst: Instr) -> None:
    key, obj = frame.pop(), frame.pop()
    frame.push(pyops.getitem(tx, obj, key))


@handler("STORE_SUBSCR", versions=ALL)
def store_subscr(tx: Tracer, frame: Frame, inst: Instr) -> None:
    key, obj, value = frame.pop(), frame.pop(), frame.pop()
    pyops.setitem(tx, obj, key, value)


@handler("DELETE_SUBSCR", versions=ALL)
def delete_subscr(tx: Tracer, frame: Frame, inst: Instr) -> None:
    key, obj = frame.pop(), frame.pop()
    pyops.delitem(tx, obj, key)


def _slice(start: object, stop: object) -> ConstVar:
    if not (isinstance(start, ConstVar) and isinstance(stop, ConstVar)):
        raise unhandled("a slice bound that is not a constant")
    return ConstVar(slice(start.value, stop.value))


@handler("BINARY_SLICE", versions=SINCE_312)
def binary_slice(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.12: container[start:stop] without BUILD_SLICE.
    stop, start, obj = frame.pop(), frame.pop(), frame.pop()
    frame.push(pyops.getitem(tx, obj, _slice(start, stop)))


@handler("STORE_SLICE", versions=SINCE_312)
def store_slice(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.12: container[start:stop] = value.
    stop, start, obj, value = frame.pop(), frame.pop(), frame.pop(), frame.pop()
    pyops.setitem(tx, obj, _slice(start, stop), value)


_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


def _formatted(value: Var, conv: int, spec: Var) -> ConstVar:
    """f-string formatting: `conv` (0 none, 1 str, 2 repr, 3 ascii), then format(v, spec)."""
    if not (pyops.deep_const(value) and isinstance(spec, ConstVar)):
        raise unhandled(f"formatting a {value.describe()} into a string (needs its data)")
    v = unwrap(value)
    fn = _CONVERSIONS[conv]
    if fn is not None:
        v = pyops.real(fn, v)
    return ConstVar(pyops.real(format, v, spec.value) if spec.value is not None else v)


@handler("FORMAT_VALUE", versions=UNTIL_312)
def format_value(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    spec = frame.pop() if inst.arg & 0x04 else ConstVar("")
    value = frame.pop()
    frame.push(_formatted(value, inst.arg & 0x03, spec))


# 3.13 splits FORMAT_VALUE: CONVERT_VALUE (!s, !r, !a), then FORMAT_SIMPLE or FORMAT_WITH_SPEC.
@handler("CONVERT_VALUE", versions=ONLY_313)
def convert_value(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    frame.push(_formatted(frame.pop(), inst.arg, ConstVar(None)))


@handler("FORMAT_SIMPLE", versions=ONLY_313)
def format_simple(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(_formatted(frame.pop(), 0, ConstVar("")))


@handler("FORMAT_WITH_SPEC", versions=ONLY_313)
def format_with_spec(tx: Tracer, frame: Frame, inst: Instr) -> None:
    spec = frame.pop()
    frame.push(_formatted(frame.pop(), 0, spec))


@handler("BUILD_STRING", versions=ALL)
def build_string(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    parts = frame.popn(inst.arg)
    texts = [p.value for p in parts if isinstance(p, ConstVar) and isinstance(p.value, str)]
    if len(texts) != len(parts):
        raise unhandled("BUILD_STRING of non-constant parts", inst.opname)
    frame.push(ConstVar("".join(texts)))
