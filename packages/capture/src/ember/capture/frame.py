"""Symbolic frames: decoded instructions, the value stack, locals, cells and the exception table.

Instructions come from `dis` (opcode names and decoded arguments, jump targets as offsets) for
the running Python; 3.11, 3.12 and 3.13 differ in opcodes and stack layouts (opcodes/), not in
this structure. CPython 3.11+ has no block stack: try/except and `with` unwind through the
code's exception table, which a frame consults when the user's code raises during symbolic
execution.
"""

from __future__ import annotations

import dis
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

from ember.capture.errors import UserError, unhandled
from ember.capture.variables import Cell, ConstVar, Var

PY_VERSION: tuple[int, int] = (sys.version_info[0], sys.version_info[1])


@dataclass(frozen=True)
class Instr:
    opname: str
    arg: int | None
    argval: Any
    argrepr: str
    offset: int
    line: int
    col: int | None


@dataclass(frozen=True)
class ExcEntry:
    start: int
    end: int  # exclusive
    target: int
    depth: int
    lasti: bool


@dataclass
class CodeInfo:
    code: types.CodeType
    instrs: list[Instr]
    index_of: dict[int, int]
    exc_table: list[ExcEntry]


_INFO: weakref.WeakKeyDictionary[types.CodeType, CodeInfo] = weakref.WeakKeyDictionary()


def code_info(code: types.CodeType) -> CodeInfo:
    """Decoded instructions of a code object (cached per code object)."""
    info = _INFO.get(code)
    if info is None:
        instrs: list[Instr] = []
        line = code.co_firstlineno
        for ins in dis.get_instructions(code):
            pos = ins.positions
            if pos is not None and pos.lineno is not None:
                line = pos.lineno
            col = pos.col_offset + 1 if pos is not None and pos.col_offset is not None else None
            instrs.append(Instr(ins.opname, ins.arg, ins.argval, ins.argrepr, ins.offset, line,
                                col))
        table: Any = dis.Bytecode(code)
        entries = [ExcEntry(e.start, e.end, e.target, e.depth, e.lasti)
                   for e in table.exception_entries]
        info = CodeInfo(code, instrs, {ins.offset: i for i, ins in enumerate(instrs)}, entries)
        _INFO[code] = info
    return info


@dataclass(eq=False)
class Frame:
    """The state of one symbolically executed call."""

    info: CodeInfo
    globals: dict[str, Any]
    locals: dict[str, Var]
    cells: dict[str, Cell]
    fn_module: str = ""
    trusted: bool = False  # torch's own code: its globals are not guarded
    stack: list[Var] = field(default_factory=list)
    index: int = 0
    kw_names: tuple[str, ...] | None = None
    yields: list[Var] | None = None  # a generator collects what it yields
    exc_stack: list[Var] = field(default_factory=list)
    current: Instr | None = None

    @property
    def code(self) -> types.CodeType:
        return self.info.code

    @property
    def builtins(self) -> dict[str, Any]:
        b = self.globals.get("__builtins__", __builtins__)
        return b if isinstance(b, dict) else b.__dict__

    # -- the stack ------------------------------------------------------------------------
    def push(self, v: Var) -> None:
        self.stack.append(v)

    def pop(self) -> Var:
        if not self.stack:
            raise unhandled("stack underflow in symbolic execution (an opcode handler bug)")
        return self.stack.pop()

    def popn(self, n: int) -> list[Var]:
        if n == 0:
            return []
        if len(self.stack) < n:
            raise unhandled("stack underflow in symbolic execution (an opcode handler bug)")
        out = self.stack[-n:]
        del self.stack[-n:]
        return out

    def peek(self, i: int = 1) -> Var:
        return self.stack[-i]

    # -- control flow ---------------------------------------------------------------------
    def jump(self, offset: int) -> None:
        try:
            self.index = self.info.index_of[offset]
        except KeyError:
            raise unhandled(f"jump to offset {offset}, which is not an instruction") from None

    def handle(self, err: UserError, at: Instr) -> bool:
        """Route a user exception to this frame's handler for `at`, as CPython does."""
        for e in self.info.exc_table:
            if e.start <= at.offset < e.end:
                del self.stack[e.depth:]
                if e.lasti:
                    self.push(ConstVar(at.offset))
                self.push(ConstVar(err.exc))
                self.jump(e.target)
                return True
        return False

    def location(self) -> tuple[str, int]:
        line = self.current.line if self.current is not None else self.code.co_firstlineno
        return self.code.co_filename, line
