"""Loads and stores: constants, locals, cells and closures, globals, imports."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ember.capture.errors import UserError, unhandled
from ember.capture.frame import PY_VERSION, Frame, Instr
from ember.capture.guards import Guard, GuardKind
from ember.capture.opcodes import (
    ALL,
    ONLY_313,
    PY313,
    SINCE_312,
    UNTIL_312,
    handler,
    push_with_null,
)
from ember.capture.sources import ConstantSource, GlobalSource
from ember.capture.variables import NULL, Cell, CellRefVar, ConstVar, NullVar, Var

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


@handler("LOAD_CONST", versions=ALL)
def load_const(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(ConstVar(inst.argval))


def _load_local(frame: Frame, name: str) -> Var:
    code = frame.code
    if PY_VERSION >= PY313 and (name in code.co_cellvars or name in code.co_freevars):
        # 3.13: LOAD_CLOSURE became a LOAD_FAST of the cell itself (before MAKE_FUNCTION)
        return _cell_ref(frame, name)
    v = frame.locals.get(name)
    if v is None:
        raise UserError(UnboundLocalError(
            f"local variable {name!r} referenced before assignment"))
    return v


def _store_local(frame: Frame, name: str, v: Var) -> None:
    if isinstance(v, NullVar):  # 3.12+: restoring a local that was unbound
        frame.locals.pop(name, None)
    else:
        frame.locals[name] = v


@handler("LOAD_FAST", versions=ALL)
def load_fast(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(_load_local(frame, inst.argval))


# 3.12+: LOAD_FAST_CHECK is LOAD_FAST where the compiler could not prove the local is bound.
handler("LOAD_FAST_CHECK", versions=SINCE_312)(load_fast)


# 3.13's superinstructions: argval names the two locals, in the order they are used.
@handler("LOAD_FAST_LOAD_FAST", versions=ONLY_313)
def load_fast_load_fast(tx: Tracer, frame: Frame, inst: Instr) -> None:
    first, second = inst.argval
    frame.push(_load_local(frame, first))
    frame.push(_load_local(frame, second))


@handler("STORE_FAST_LOAD_FAST", versions=ONLY_313)
def store_fast_load_fast(tx: Tracer, frame: Frame, inst: Instr) -> None:
    first, second = inst.argval
    _store_local(frame, first, frame.pop())
    frame.push(_load_local(frame, second))


@handler("STORE_FAST_STORE_FAST", versions=ONLY_313)
def store_fast_store_fast(tx: Tracer, frame: Frame, inst: Instr) -> None:
    first, second = inst.argval
    _store_local(frame, first, frame.pop())
    _store_local(frame, second, frame.pop())


@handler("LOAD_FAST_AND_CLEAR", versions=SINCE_312)
def load_fast_and_clear(tx: Tracer, frame: Frame, inst: Instr) -> None:
    # 3.12 (PEP 709, inlined comprehensions): save a local (NULL when unbound) and unbind it.
    frame.push(frame.locals.pop(inst.argval, NULL))


@handler("STORE_FAST", versions=ALL)
def store_fast(tx: Tracer, frame: Frame, inst: Instr) -> None:
    _store_local(frame, inst.argval, frame.pop())


@handler("DELETE_FAST", versions=ALL)
def delete_fast(tx: Tracer, frame: Frame, inst: Instr) -> None:
    if frame.locals.pop(inst.argval, None) is None:
        raise UserError(UnboundLocalError(f"local variable {inst.argval!r} is not bound"))


def load_global_value(tx: Tracer, frame: Frame, name: str) -> Var:
    written = tx.side_effects.load_global(frame, name)  # a global written during capture
    if written is not None:
        return written
    if name in frame.globals:
        src = None if frame.trusted else GlobalSource(frame.globals, name, frame.fn_module)
        return tx.wrap(frame.globals[name], src)
    b = frame.builtins
    if name in b:
        if not frame.trusted:
            tx.guard(Guard(GuardKind.NOT_IN, ConstantSource(frame.globals, "globals"), name))
        return tx.wrap(b[name], None)
    raise UserError(NameError(f"name {name!r} is not defined"))


@handler("LOAD_GLOBAL", versions=ALL)
def load_global(tx: Tracer, frame: Frame, inst: Instr) -> None:
    assert inst.arg is not None
    v = load_global_value(tx, frame, inst.argval)
    if inst.arg & 1:  # the callable of a call: with its NULL (below it before 3.13, above after)
        push_with_null(frame, v)
    else:
        frame.push(v)


@handler("STORE_GLOBAL", versions=ALL)
def store_global(tx: Tracer, frame: Frame, inst: Instr) -> None:
    tx.side_effects.store_global(frame, inst.argval, frame.pop())  # replayed after the graph


@handler("MAKE_CELL", versions=ALL)
def make_cell(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.cells[inst.argval] = Cell(frame.locals.pop(inst.argval, None))


@handler("COPY_FREE_VARS", versions=ALL)
def copy_free_vars(tx: Tracer, frame: Frame, inst: Instr) -> None:
    return None  # the frame's free-variable cells were set up when it was made


def _cell_ref(frame: Frame, name: str) -> CellRefVar:
    cell = frame.cells.get(name)
    if cell is None:
        cell = frame.cells[name] = Cell(None)
    return CellRefVar(cell)


@handler("LOAD_CLOSURE", versions=UNTIL_312)  # 3.13: a LOAD_FAST of the cell
def load_closure(tx: Tracer, frame: Frame, inst: Instr) -> None:
    frame.push(_cell_ref(frame, inst.argval))


@handler("LOAD_DEREF", versions=ALL)
def load_deref(tx: Tracer, frame: Frame, inst: Instr) -> None:
    cell = frame.cells.get(inst.argval)
    if cell is None or cell.contents is None:
        raise UserError(NameError(f"free variable {inst.argval!r} referenced before "
                                  f"assignment"))
    frame.push(cell.contents)


@handler("STORE_DEREF", versions=ALL)
def store_deref(tx: Tracer, frame: Frame, inst: Instr) -> None:
    cell = frame.cells.get(inst.argval)
    if cell is None:
        cell = frame.cells[inst.argval] = Cell(None)
    if cell.real:
        raise unhandled(f"assigning nonlocal {inst.argval!r} of a function defined outside "
                        f"the compiled one (side effects come with graph breaks)")
    cell.contents = frame.pop()


@handler("DELETE_DEREF", versions=ALL)
def delete_deref(tx: Tracer, frame: Frame, inst: Instr) -> None:
    cell = frame.cells.get(inst.argval)
    if cell is None or cell.real:
        raise unhandled(f"deleting nonlocal {inst.argval!r}")
    cell.contents = None


@handler("IMPORT_NAME", versions=ALL)
def import_name(tx: Tracer, frame: Frame, inst: Instr) -> None:
    fromlist, level = frame.pop(), frame.pop()
    name = inst.argval
    if not (isinstance(level, ConstVar) and level.value == 0):
        raise unhandled("a relative import inside a compiled function")
    if name not in sys.modules:
        raise unhandled(f"importing {name}, which is not imported yet (importing runs code)")
    has_from = isinstance(fromlist, ConstVar) and fromlist.value
    mod = sys.modules[name] if has_from else sys.modules[name.split(".")[0]]
    frame.push(ConstVar(mod))


@handler("IMPORT_FROM", versions=ALL)
def import_from(tx: Tracer, frame: Frame, inst: Instr) -> None:
    mod = frame.peek()
    from ember.capture.attrs import getattr_var

    try:
        frame.push(getattr_var(tx, mod, inst.argval))
    except UserError:
        full = f"{getattr(getattr(mod, 'value', None), '__name__', '')}.{inst.argval}"
        if full in sys.modules:
            frame.push(ConstVar(sys.modules[full]))
        else:
            raise
