"""New bytecode for graph breaks: the break function and resume functions (3.11 to 3.13).

Built with the `bytecode` assembler (it encodes jumps, the exception table, the line table and
the stack size for the running Python). Two kinds of code objects are made:

* a **resume function** is a copy of the original function's code with a prologue in front:
  the prologue rebuilds the value stack the original had at the resume point (values passed in
  as arguments, NULLs pushed back, iterators re-made with GET_ITER, grad-mode `with` blocks
  re-entered with BEFORE_WITH so the copied exception table finds their `__exit__`) and jumps
  to the resume instruction. Its arguments are those stack values and the live locals, under
  their own names, so the copied code reads them unchanged.
* a **break function** runs the break instruction(s) of the original in plain Python (a call,
  a conditional jump on a tensor) with the values they consume as arguments, then calls the
  resume function for each successor (passed in as the first arguments) and returns its result.
"""

from __future__ import annotations

import dis
import types
from dataclasses import dataclass
from typing import Any, cast

import torch
from bytecode import Bytecode, CompilerFlags, Instr, Label

from ember.capture.errors import unhandled
from ember.capture.frame import PY_VERSION, code_info

_PSEUDO_SKIP = ("EXTENDED_ARG", "CACHE")
COND_JUMPS = frozenset({
    "POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE"})


@dataclass(frozen=True)
class Slot:
    """One entry of a rebuilt value stack.

    kind: "value" (an argument), "null" (CPython's NULL below a callable), "iter" (an iterator,
    passed as the list of its remaining items), "ctx" (the `__exit__` of a grad-mode `with`,
    re-entered: `factory(*args)` then BEFORE_WITH).
    """

    kind: str
    factory: Any = None
    args: tuple[Any, ...] = ()


def abstract(code: types.CodeType) -> tuple[Bytecode, list[int]]:
    """The abstract bytecode of `code` and, per instruction of `code_info(code).instrs`, its
    position in that list (pseudo-instructions such as labels and try blocks are skipped)."""
    bc = Bytecode.from_code(code)
    real = [i for i, ins in enumerate(bc) if isinstance(ins, Instr)]
    ours = code_info(code).instrs
    pos: list[int] = []
    j = 0
    for ins in ours:
        if ins.opname in _PSEUDO_SKIP:
            pos.append(-1)
            continue
        got = bc[real[j]] if j < len(real) else None
        if not isinstance(got, Instr) or got.name != ins.opname:
            raise unhandled(f"the bytecode assembler disagrees with dis at offset {ins.offset}")
        pos.append(real[j])
        j += 1
    return bc, pos


def _call(fn: Instr, args: list[Instr], lineno: int) -> list[Instr]:
    """A plain call: load the callable with `fn` and its arguments with `args`, then CALL.
    The NULL that marks a plain call goes below the callable (3.11, 3.12) or above it (3.13)."""
    null = Instr("PUSH_NULL", lineno=lineno)
    out = [fn, null] if PY_VERSION >= (3, 13) else [null, fn]
    out += args
    if PY_VERSION < (3, 12):
        out.append(Instr("PRECALL", len(args), lineno=lineno))
    return out + [Instr("CALL", len(args), lineno=lineno)]


def _push_slot(slot: Slot, name: str, lineno: int) -> list[Instr]:
    if slot.kind == "null":
        return [Instr("PUSH_NULL", lineno=lineno)]
    if slot.kind == "value":
        return [Instr("LOAD_FAST", name, lineno=lineno)]
    if slot.kind == "iter":
        return [Instr("LOAD_FAST", name, lineno=lineno), Instr("GET_ITER", lineno=lineno)]
    if slot.kind == "ctx":
        out = _call(Instr("LOAD_CONST", _const(slot.factory), lineno=lineno),
                    [Instr("LOAD_CONST", _const(a), lineno=lineno) for a in slot.args], lineno)
        return out + [Instr("BEFORE_WITH", lineno=lineno), Instr("POP_TOP", lineno=lineno)]
    raise AssertionError(slot.kind)


def _const(value: Any) -> Any:
    # code objects made at run time may hold any object as a constant (never marshalled)
    return value


def slot_arg(i: int) -> str:
    return f"___stack{i}"


def resume_code(code: types.CodeType, target: int, stack: list[Slot], local_names: list[str],
                name: str) -> types.CodeType:
    """A resume function: `code` entered at instruction `target` (an index of
    `code_info(code).instrs`) with the value stack `stack` and the locals `local_names`.

    Arguments: one per "value"/"iter" slot (`___stackN`), then the locals by name.
    """
    bc, pos = abstract(code)
    at = pos[target]
    if at < 0:
        raise unhandled("resuming at an EXTENDED_ARG")
    lineno = code_info(code).instrs[target].line
    label = Label()
    bc.insert(at, label)
    first = next(i for i, ins in enumerate(bc)
                 if isinstance(ins, Instr) and ins.name == "RESUME")
    prologue: list[Any] = []
    args: list[str] = []
    for i, slot in enumerate(stack):
        if slot.kind in ("value", "iter"):
            args.append(slot_arg(i))
        prologue += _push_slot(slot, slot_arg(i), lineno)
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    bc[first + 1:first + 1] = prologue
    if PY_VERSION >= (3, 13):
        _split_local_pairs(bc)
    bc.argnames = args + list(local_names)
    bc.argcount = len(bc.argnames)
    bc.posonlyargcount = 0
    bc.kwonlyargcount = 0
    bc.flags = CompilerFlags(bc.flags & ~(CompilerFlags.VARARGS | CompilerFlags.VARKEYWORDS))
    bc.name = name
    bc.qualname = name
    return bc.to_code()


# 3.13's superinstructions over two locals, and the two instructions each one stands for
_LOCAL_PAIRS = {"LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
                "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
                "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST")}


def _split_local_pairs(bc: Bytecode) -> None:
    """Replace 3.13's two-local superinstructions by their two instructions. They pack both
    local indices in 4 bits each; a resume function's stack arguments come first and push the
    indices past 15, and the `bytecode` package splits them only past 16 (`> 16` where 4 bits
    end at 15): it packs 16 into the 4-bit field, which reads a wrong local. Still so in 0.19.1,
    the newest release, and on its main branch (checked 2026-12-02);
    test_resume_bytecode.py's `test_the_bytecode_package_still_mispacks_local_16` says when an
    installed `bytecode` packs it right and this can go."""
    i = 0
    while i < len(bc):
        ins = bc[i]
        if isinstance(ins, Instr) and ins.name in _LOCAL_PAIRS:
            a, b = _LOCAL_PAIRS[ins.name]
            first, second = cast(tuple[str, str], ins.arg)  # the two locals' names
            bc[i:i + 1] = [Instr(a, first, location=ins.location),
                           Instr(b, second, location=ins.location)]
            i += 2
        else:
            i += 1


@dataclass(frozen=True)
class BreakPlan:
    """What a break function does.

    consumed: the stack slots the break instructions consume ("null" or "value"), bottom first;
    instrs: the indices (into `code_info(code).instrs`) of the break instructions;
    lower: how many values below the consumed ones are passed through to the resume function;
    outs: how many values the break instructions leave on the stack (per successor: the
    fallthrough, then the jump target of a conditional jump);
    nlocals: how many locals are passed through;
    grad: the grad mode to run the break instructions under (None: leave it as it is), and
    restore: the grad mode to restore before resuming.
    """

    consumed: tuple[str, ...]
    instrs: tuple[int, ...]
    lower: int
    outs: tuple[int, ...]
    nlocals: int
    grad: bool | None = None
    restore: bool = True


def break_code(code: types.CodeType, plan: BreakPlan, name: str) -> types.CodeType:
    """The break function: arguments `(resume_0[, resume_1], consumed values..., lower
    values..., locals...)`; it runs the break instructions and returns `resume_k(lower values...,
    results..., locals...)` for the successor k taken."""
    bc_orig, pos = abstract(code)
    infos = code_info(code).instrs
    lineno = infos[plan.instrs[-1]].line
    nsucc = len(plan.outs)
    resumes = [f"___resume{k}" for k in range(nsucc)]
    names = [f"___in{i}" for i in range(len(plan.consumed))]
    consumed = [n for n, kind in zip(names, plan.consumed, strict=True) if kind != "null"]
    lower = [f"___lower{i}" for i in range(plan.lower)]
    locs = [f"___local{i}" for i in range(plan.nlocals)]
    out: list[Any] = [Instr("RESUME", 0, lineno=lineno)]
    for kind, arg in zip(plan.consumed, names, strict=True):
        out.append(Instr("PUSH_NULL", lineno=lineno) if kind == "null"
                   else Instr("LOAD_FAST", arg, lineno=lineno))
    if plan.grad is not None:
        out += _set_grad(plan.grad, lineno)
    jump_label = Label()
    for idx in plan.instrs:
        src = bc_orig[pos[idx]]
        assert isinstance(src, Instr)
        if src.name in COND_JUMPS:
            if PY_VERSION >= (3, 13) and src.name in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE"):
                # 3.13's jumps take exact bools: the value consumed is the one before TO_BOOL
                # (opcodes.control.to_bool leaves it to the jump)
                out.append(Instr("TO_BOOL", lineno=lineno))
            out.append(Instr(src.name, jump_label, lineno=lineno))
        else:
            out.append(Instr(src.name, src.arg, lineno=lineno) if src.require_arg()
                       else Instr(src.name, lineno=lineno))
    for k in range(nsucc):
        if k == 1:
            out.append(jump_label)
        if plan.grad is not None:
            out += _set_grad(plan.restore, lineno)
        res = [f"___res{k}_{i}" for i in range(plan.outs[k])]
        out += [Instr("STORE_FAST", r, lineno=lineno) for r in reversed(res)]
        args = lower + res + locs
        out += _call(Instr("LOAD_FAST", resumes[k], lineno=lineno),
                     [Instr("LOAD_FAST", a, lineno=lineno) for a in args], lineno)
        out.append(Instr("RETURN_VALUE", lineno=lineno))
    bc = Bytecode(out)
    bc.argnames = resumes + consumed + lower + locs
    bc.argcount = len(bc.argnames)
    bc.name = bc.qualname = name
    bc.filename = code.co_filename
    bc.first_lineno = lineno
    bc.flags = CompilerFlags(CompilerFlags.OPTIMIZED | CompilerFlags.NEWLOCALS)
    return bc.to_code()


def _set_grad(mode: bool, lineno: int) -> list[Instr]:
    # torch.set_grad_enabled(mode) switches the mode when constructed (not only as a context)
    return [*_call(Instr("LOAD_CONST", _const(torch.set_grad_enabled), lineno=lineno),
                   [Instr("LOAD_CONST", mode, lineno=lineno)], lineno),
            Instr("POP_TOP", lineno=lineno)]


def stack_effect(opname: str, arg: int | None, jump: bool) -> int:
    op = dis.opmap[opname]
    return dis.stack_effect(op, arg if op >= dis.HAVE_ARGUMENT else None, jump=jump)
