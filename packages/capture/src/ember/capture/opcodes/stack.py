"""Stack manipulation and no-ops."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.capture.frame import Frame, Instr
from ember.capture.opcodes import ALL, ONLY_312, ONLY_313, handler
from ember.capture.variables import NULL

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


@handler("NOP", "RESUME", "EXTENDED_ARG", "CACHE", versions=ALL)
def nop(tx: Tracer, frame: Frame, inst: Instr) -> None:
    return None


@handler("PUSH_NULL", versions=ALL)
def push_null(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(NULL)


@handler("POP_TOP", versions=ALL)
def pop_top(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.pop()


@handler("END_FOR", versions=ONLY_312)
def end_for(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.12: END_FOR is POP_TOP; POP_TOP (FOR_ITER normally jumps past it when exhausted).
    frame.popn(2)


@handler("END_FOR", versions=ONLY_313)
def end_for_313(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.13: END_FOR is POP_TOP, and a POP_TOP of the iterator follows it.
    frame.pop()


@handler("COPY", versions=ALL)
def copy(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    frame.push(frame.peek(inst.arg))


@handler("SWAP", versions=ALL)
def swap(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    s = frame.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]
