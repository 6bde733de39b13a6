"""Jumps, conditional branches, loops and `with` blocks."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

from ember.capture import contexts, pyops
from ember.capture.errors import unhandled
from ember.capture.frame import PY_VERSION, Frame, Instr
from ember.capture.mro import lookup_type_attr
from ember.capture.opcodes import ALL, ONLY_311, ONLY_313, PY313, SINCE_312, handler
from ember.capture.variables import (
    ConstVar,
    ContextVar,
    FunctionVar,
    IteratorVar,
    MethodVar,
    NewObjectVar,
    ObjectVar,
    Var,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", versions=ALL)
def jump(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.jump(inst.argval)


def _is_none(v: Var) -> bool:
    return isinstance(v, ConstVar) and v.value is None


def _pop_jump(tx: Tracer, frame: Frame, inst: Instr) -> None:
    v = frame.pop()
    name = inst.opname
    if name.endswith("_NOT_NONE"):
        take = not _is_none(v)
    elif name.endswith("_NONE"):
        take = _is_none(v)
    elif name.endswith("_TRUE"):
        take = pyops.truth(tx, v)
    else:
        take = not pyops.truth(tx, v)
    if take:
        frame.jump(inst.argval)


# 3.11 has forward and backward forms; 3.12 and 3.13 have one form per condition.
handler("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_NONE",
        "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE", versions=ONLY_311)(_pop_jump)
handler("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
        versions=SINCE_312)(_pop_jump)


def next_is_truth_jump(frame: Frame) -> bool:
    """Whether the next instruction (past EXTENDED_ARGs) is POP_JUMP_IF_TRUE/FALSE."""
    instrs = frame.info.instrs
    i = frame.index
    while i < len(instrs) and instrs[i].opname == "EXTENDED_ARG":
        i += 1
    return i < len(instrs) and instrs[i].opname in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE")


@handler("TO_BOOL", versions=ONLY_313)
def to_bool(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.13: bool(v) before POP_JUMP_IF_* (which then take exact bools) and UNARY_NOT. Before
    # a jump the value stays as it is and the jump decides its truth, as on 3.12: a branch on a
    # tensor then breaks the graph at the jump, whose break function converts it again.
    if next_is_truth_jump(frame):
        return
    frame.push(ConstVar(pyops.truth(tx, frame.pop())))


@handler("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP", versions=ONLY_311)
def jump_or_pop(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.11 only (3.12 compiles `a and b` with COPY + POP_JUMP_IF_*).
    v = frame.peek()
    t = pyops.truth(tx, v)
    if t == (inst.opname == "JUMP_IF_TRUE_OR_POP"):
        frame.jump(inst.argval)
    else:
        frame.pop()


@handler("GET_ITER", versions=ALL)
def get_iter(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(pyops.get_iter(tx, frame.pop()))


@handler("FOR_ITER", versions=ALL)
def for_iter(tx: Tracer, frame: Frame, inst: Instr) -> None:
    it = frame.peek()
    if not isinstance(it, IteratorVar):
        raise unhandled(f"FOR_ITER over {it.describe()}", inst.opname)
    v = it.next()
    if v is not None:
        frame.push(v)
        return
    frame.pop()
    frame.jump(inst.argval)
    if PY_VERSION >= (3, 12):
        # 3.12: exhaustion continues after the END_FOR that closes the loop; 3.13: after the
        # END_FOR and the POP_TOP that follows it (the iterator is popped already).
        instrs = frame.info.instrs
        if instrs[frame.index].opname == "END_FOR":
            frame.index += 1
            if PY_VERSION >= PY313 and instrs[frame.index].opname == "POP_TOP":
                frame.index += 1


@handler("BEFORE_WITH", versions=ALL)
def before_with(tx: Tracer, frame: Frame, inst: Instr) -> None:
    ctx = frame.pop()
    if isinstance(ctx, ContextVar):
        res = contexts.enter(tx, ctx)
        frame.push(contexts.ExitVar(ctx))
        frame.push(res)
        return
    if isinstance(ctx, ObjectVar | NewObjectVar):
        enter = lookup_type_attr(ctx.python_type(), "__enter__")
        exit_ = lookup_type_attr(ctx.python_type(), "__exit__")
        if isinstance(enter, types.FunctionType) and isinstance(exit_, types.FunctionType):
            res = tx.call(FunctionVar(enter), [ctx])
            frame.push(MethodVar(FunctionVar(exit_), ctx))
            frame.push(res)
            return
    raise unhandled(f"`with` on {ctx.describe()}")


