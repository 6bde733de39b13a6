"""Building and unpacking tuples, lists, sets, dicts and slices."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.capture.builtins import iterate
from ember.capture.containers import mutate, update_dict
from ember.capture.errors import UserError, unhandled
from ember.capture.frame import Frame, Instr
from ember.capture.opcodes import ALL, ONLY_311, SINCE_312, handler
from ember.capture.variables import (
    ConstVar,
    DictVar,
    ListVar,
    SetVar,
    TupleVar,
    Var,
    set_key,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


def make_tuple(items: list[Var]) -> Var:
    consts = [i.value for i in items if isinstance(i, ConstVar)]
    if len(consts) == len(items):
        return ConstVar(tuple(consts))
    return TupleVar(items)


@handler("BUILD_TUPLE", versions=ALL)
def build_tuple(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    frame.push(make_tuple(frame.popn(inst.arg)))


@handler("BUILD_LIST", versions=ALL)
def build_list(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    frame.push(ListVar(frame.popn(inst.arg)))


@handler("BUILD_SET", versions=ALL)
def build_set(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    frame.push(SetVar(frame.popn(inst.arg)))


@handler("BUILD_MAP", versions=ALL)
def build_map(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    flat = frame.popn(2 * inst.arg)
    frame.push(DictVar({set_key(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}))


@handler("BUILD_CONST_KEY_MAP", versions=ALL)
def build_const_key_map(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    keys = frame.pop()
    values = frame.popn(inst.arg)
    assert isinstance(keys, ConstVar)
    frame.push(DictVar(dict(zip(keys.value, values, strict=True))))


@handler("BUILD_SLICE", versions=ALL)
def build_slice(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    parts = frame.popn(inst.arg)
    consts = [p.value for p in parts if isinstance(p, ConstVar)]
    if len(consts) != len(parts):
        raise unhandled("a slice bound that is not a constant (a tensor?)")
    frame.push(ConstVar(slice(*consts)))


def _target(frame: Frame, inst: Instr) -> Var:
    assert inst.arg is not None
    return frame.peek(inst.arg)


@handler("LIST_APPEND", versions=ALL)
def list_append(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    lst = _target(frame, inst)
    assert isinstance(lst, ListVar)
    lst.items.append(v)


@handler("LIST_EXTEND", versions=ALL)
def list_extend(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    lst = _target(frame, inst)
    assert isinstance(lst, ListVar)
    lst.items.extend(iterate(tx, v))


@handler("SET_ADD", versions=ALL)
def set_add(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    s = _target(frame, inst)
    assert isinstance(s, SetVar)
    s.items[set_key(v)] = v


@handler("SET_UPDATE", versions=ALL)
def set_update(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    s = _target(frame, inst)
    assert isinstance(s, SetVar)
    for x in iterate(tx, v):
        s.items[set_key(x)] = x


@handler("MAP_ADD", versions=ALL)
def map_add(tx: Tracer, frame: Frame, inst: Instr) -> None:
    value, key = frame.pop(), frame.pop()
    d = _target(frame, inst)
    assert isinstance(d, DictVar)
    d.items[set_key(key)] = value


@handler("DICT_UPDATE", "DICT_MERGE", versions=ALL)
def dict_update(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    d = _target(frame, inst)
    assert isinstance(d, DictVar)
    if inst.opname == "DICT_MERGE" and isinstance(v, DictVar):
        dup = set(d.items) & set(v.items)
        if dup:
            raise UserError(TypeError(f"got multiple values for keyword argument "
                                      f"{sorted(map(str, dup))[0]!r}"))
    mutate(d)
    update_dict(tx, d, v)


@handler("LIST_TO_TUPLE", versions=ONLY_311)  # 3.12: CALL_INTRINSIC_1 INTRINSIC_LIST_TO_TUPLE
def list_to_tuple(tx: Tracer, frame: Frame, inst: Instr) -> None:
    lst = frame.pop()
    assert isinstance(lst, ListVar)
    frame.push(make_tuple(list(lst.items)))


INTRINSIC_UNARY_POSITIVE = 5
INTRINSIC_LIST_TO_TUPLE = 6


@handler("CALL_INTRINSIC_1", versions=SINCE_312)
def call_intrinsic_1(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.12+: a few former opcodes became intrinsics (numbering from CPython's pycore_intrinsics.h).
    import operator

    from ember.capture import pyops

    if inst.arg == INTRINSIC_UNARY_POSITIVE:
        frame.push(pyops.unary(tx, operator.pos, frame.pop()))
    elif inst.arg == INTRINSIC_LIST_TO_TUPLE:
        lst = frame.pop()
        assert isinstance(lst, ListVar)
        frame.push(make_tuple(list(lst.items)))
    else:
        raise unhandled(f"CALL_INTRINSIC_1 {inst.argrepr or inst.arg}", inst.opname)


@handler("UNPACK_SEQUENCE", versions=ALL)
def unpack_sequence(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    items = iterate(tx, frame.pop())
    if len(items) != inst.arg:
        raise UserError(ValueError(f"expected {inst.arg} values to unpack, got {len(items)}"))
    for v in reversed(items):
        frame.push(v)


@handler("UNPACK_EX", versions=ALL)
def unpack_ex(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = iterate(tx, frame.pop())
    if len(items) < before + after:
        raise UserError(ValueError(f"not enough values to unpack (expected at least "
                                   f"{before + after}, got {len(items)})"))
    middle = ListVar(items[before:len(items) - after])
    out = items[:before] + [middle] + items[len(items) - after:]
    for v in reversed(out):
        frame.push(v)
