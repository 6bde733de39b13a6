"""Graph breaks: split the compiled function's frame at a construct capture does not cover.

When capture meets such a construct (a branch on a tensor's value, `.item()`, `print`, a call
into code it cannot trace) while the compiled function's own frame is executing instruction I,
`capture` restarts and stops right before I (deterministically: it counts that frame's
instructions). The state there — the value stack and the live locals — is consistent, and it
becomes the `Broken` result:

* the graph so far, whose outputs are the tensors among those values and among the side effects;
* the side effects so far (`ember.capture.side_effects`), replayed after the graph;
* a **break function** (new bytecode, `bytecode_gen.break_code`) that runs instruction I (with the
  KW_NAMES/PRECALL before a CALL) in plain Python on the values it consumes, and then calls
* a **resume function** per successor of I (one, or two for a conditional jump): the original
  code entered after I with the stack and locals rebuilt (`bytecode_gen.resume_code`). The
  runtime compiles it with ember in turn: it gets its own graph, guards and cache, and breaks
  again if it must.

A break inside an inlined call splits the outer frame at the call site: the call runs in the
break function, and when the callee is a user function or module the runtime passes it through
ember's compile wrapper, so the callee is captured on its own (and breaks on its own).

What cannot be split falls back to running the whole call eagerly, as before: a break inside
try/except or a `with` other than grad-mode ones (no_grad, enable_grad, set_grad_enabled), in a
generator, under autocast, or with a live value that cannot be rebuilt from Python.
"""

from __future__ import annotations

import dis
import inspect
import re
import types
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import bytecode_gen as bg
from ember.capture.compiled import original_attr
from ember.capture.contexts import ExitVar
from ember.capture.errors import CaptureUnhandled, Unhandled, unhandled
from ember.capture.frame import PY_VERSION, CodeInfo, Frame, code_info
from ember.capture.outputs import OutputSpecs
from ember.capture.result import (
    Captured,
    OutSeq,
    OutSource,
    OutSpec,
)
from ember.capture.side_effects import Effect, collect, value_spec
from ember.capture.variables import (
    ContextVar,
    FunctionVar,
    IteratorVar,
    ModuleVar,
    NullVar,
    Var,
)
from ember.capture.wrap import is_trusted_module

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

# Instructions a break can run in plain Python: name -> (values consumed, values produced).
# Calls and conditional jumps are handled apart; anything else is not split.
_SIMPLE: dict[str, tuple[int, int]] = {
    "BINARY_OP": (2, 1), "BINARY_SUBSCR": (2, 1), "COMPARE_OP": (2, 1), "CONTAINS_OP": (2, 1),
    "IS_OP": (2, 1), "UNARY_NEGATIVE": (1, 1), "UNARY_NOT": (1, 1), "UNARY_INVERT": (1, 1),
    "STORE_SUBSCR": (3, 0), "STORE_ATTR": (2, 0), "GET_ITER": (1, 1), "BINARY_SLICE": (3, 1),
    "TO_BOOL": (1, 1),  # 3.13, where no jump follows (`not t`)
}
# CALL_KW: 3.13's call with keywords (names on the stack); CALL_FUNCTION_EX: f(*a, **kw) (a
# break under `model(**inputs)` ran the whole model eagerly, uncaptured, when it was not here)
_CALLS = ("CALL", "CALL_KW", "CALL_FUNCTION_EX")
_GRAD_CTX = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)


@dataclass
class Broken:
    """A capture split at a graph break (see the module docstring).

    The graph's output spec is a tuple of values: first the break function's arguments after
    the resume functions (`nargs` of them), then per side effect its target and its new value.
    `wrap` lists the positions (among those arguments) of a callee to run through ember's
    compile wrapper.
    """

    captured: Captured
    effects: list[Effect]
    break_fn: types.FunctionType
    resumes: list[types.FunctionType]
    nargs: int
    wrap: list[int]
    unhandled: Unhandled  # the construct, its line and the inlined calls


@dataclass(frozen=True)
class Site:
    """Where to split: the break instructions [start, end] of the top frame, and how many of its
    instructions had started before `start` (the restart stops there)."""

    start: int
    end: int
    step: int


def find_site(code: types.CodeType, e: CaptureUnhandled) -> Site | None:
    """The break site for an unhandled construct met at `e.top_index` of the top frame."""
    if not e.breakable or e.top_index is None or code.co_flags & (
            inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        return None
    instrs = code_info(code).instrs
    end = start = e.top_index
    op = instrs[end].opname
    if op in _CALLS:
        while start > 0 and instrs[start - 1].opname in ("PRECALL", "KW_NAMES"):
            start -= 1
    elif not (op in _SIMPLE or op in bg.COND_JUMPS or op == "CALL_FUNCTION_EX"
              or _plain_load_attr(instrs[end])):
        return None
    return Site(start, end, e.top_step - (end - start))


def _plain_load_attr(ins: Any) -> bool:
    # LOAD_ATTR without the 3.12 method bit: one value in, one out (the method form may push
    # NULL, which a break function cannot pass on)
    return bool(ins.opname == "LOAD_ATTR" and (PY_VERSION < (3, 12) or not (ins.arg or 0) & 1))


def _effect(ins: Any) -> tuple[int, tuple[int, ...]]:
    """(values consumed, values produced per successor) of a break instruction."""
    op = ins.opname
    if op == "CALL":
        return ins.arg + 2, (1,)
    if op == "CALL_KW":
        return ins.arg + 3, (1,)
    if op == "CALL_FUNCTION_EX":
        return 3 + (ins.arg & 1), (1,)
    if op in bg.COND_JUMPS:
        return 1, (0, 0)
    if op == "LOAD_ATTR":
        return 1, (1,)
    n_in, n_out = _SIMPLE[op]
    return n_in, (n_out,)


def split(tx: Tracer, frame: Frame, fn: types.FunctionType, site: Site, un: Unhandled,
          entry_grad: bool) -> Broken:
    """Build the `Broken` result from the top frame stopped before the break site."""
    info = frame.info
    instrs = info.instrs
    last = instrs[site.end]
    if tx.autocast or tx.open_grad_changes:
        raise unhandled("a graph break under autocast or set_grad_enabled outside `with`")
    if frame.exc_stack:
        raise unhandled("a graph break inside an `except` block")
    n_in, outs = _effect(last)
    stack = list(frame.stack)
    if len(stack) < n_in:
        raise unhandled("a graph break with fewer stack values than the instruction reads")
    _check_blocks(info, site, stack)
    lower_vars, consumed_vars = stack[:len(stack) - n_in], stack[len(stack) - n_in:]
    succ = [site.end + 1]
    if last.opname in bg.COND_JUMPS:
        succ.append(info.index_of[last.argval])
    for s in succ:
        _check_resume_target(info, s)
    live = _live_cells_and_locals(info, frame, succ)

    specs = OutputSpecs(tx, "a graph break with a {what} live (it cannot be rebuilt outside "
                              "the graph)")
    call_args: list[OutSpec] = []
    consumed_kinds: list[str] = []
    wrap: list[int] = []
    for i, v in enumerate(consumed_vars):
        if isinstance(v, NullVar):
            consumed_kinds.append("null")
            continue
        consumed_kinds.append("value")
        if last.opname in _CALLS and _is_callee(consumed_vars, i) and _wrappable(v):
            wrap.append(len(call_args))
        call_args.append(specs.value(v))
    lower_slots: list[bg.Slot] = []
    for v in lower_vars:
        slot = _slot(v)
        lower_slots.append(slot)
        if slot.kind == "value":
            call_args.append(specs.value(v))
        elif slot.kind == "iter":
            assert isinstance(v, IteratorVar), f"iterator slot holds a {v.describe()}"
            call_args.append(specs.fresh_list(_remaining(v)))
    nlower = sum(1 for s in lower_slots if s.kind in ("value", "iter"))
    for name in live:
        call_args.append(specs.value(frame.locals[name]))
    effects = collect(tx)
    values = list(call_args)
    for eff in effects:
        values.append(OutSource(eff.target))
        values.append(value_spec(eff, specs.value))

    grad = tx.grad_enabled if tx.grad_enabled != entry_grad else None
    plan = bg.BreakPlan(tuple(consumed_kinds), tuple(range(site.start, site.end + 1)), nlower,
                        outs, len(live), grad, entry_grad)
    resumes = []
    for k, target in enumerate(succ):
        slots = lower_slots + [bg.Slot("value")] * outs[k]
        resumes.append(_resume_fn(fn, info, target, slots, live))
    name = f"__break_{fn.__code__.co_name}_at_{last.line}"
    brk = types.FunctionType(_cached_break(fn.__code__, plan, name), fn.__globals__, name)
    captured = specs.finish(OutSeq(tuple, tuple(values)), fn.__code__)
    return Broken(captured, effects, brk, resumes, len(call_args), wrap, un)


# -- checks ---------------------------------------------------------------------------------
def _with_entry(info: CodeInfo, target: int) -> bool:
    i = info.index_of.get(target)
    if i is None or i + 1 >= len(info.instrs):
        return False
    return (info.instrs[i].opname == "PUSH_EXC_INFO"
            and info.instrs[i + 1].opname == "WITH_EXCEPT_START")


def _check_blocks(info: CodeInfo, site: Site, stack: list[Var]) -> None:
    """The break instructions run outside the frame's exception table: allowed only inside
    `with` blocks of grad-mode contexts (re-entered around them), not in try/except."""
    for idx in range(site.start, site.end + 1):
        off = info.instrs[idx].offset
        for e in info.exc_table:
            if not e.start <= off < e.end:
                continue
            if not _with_entry(info, e.target):
                raise unhandled("a graph break inside try/except or finally")
            ctx = stack[e.depth - 1] if 0 < e.depth <= len(stack) else None
            if not (isinstance(ctx, ExitVar) and _grad_ctx(ctx) is not None):
                raise unhandled("a graph break inside a `with` block other than no_grad, "
                                "enable_grad or set_grad_enabled")


def _check_resume_target(info: CodeInfo, index: int) -> None:
    if index >= len(info.instrs):
        raise unhandled("a graph break at the end of the bytecode")


def _grad_ctx(v: ExitVar) -> bg.Slot | None:
    ctx = v.ctx
    if not isinstance(ctx, ContextVar) or ctx.state.kind != "grad":
        return None
    if ctx.cls is torch.set_grad_enabled:
        return bg.Slot("ctx", torch.set_grad_enabled, (ctx.state.grad,))
    if ctx.cls in (torch.no_grad, torch.enable_grad):
        return bg.Slot("ctx", ctx.cls)
    return None


def _slot(v: Var) -> bg.Slot:
    if isinstance(v, NullVar):
        return bg.Slot("null")
    if isinstance(v, ExitVar):
        slot = _grad_ctx(v)
        if slot is None:
            raise unhandled("a graph break inside a `with` block other than no_grad, "
                            "enable_grad or set_grad_enabled")
        return slot
    if isinstance(v, IteratorVar):
        return bg.Slot("iter")
    return bg.Slot("value")


def _is_callee(consumed: list[Var], i: int) -> bool:
    """Stack [NULL, callable, args...] (3.11, 3.12), [callable, NULL, args...] (3.13) or
    [function, self, args...]: the callable's position."""
    return i == (1 if PY_VERSION < (3, 13) and isinstance(consumed[0], NullVar) else 0)


def _wrappable(v: Var) -> bool:
    """A callee that capture would have inlined: user code, compiled on its own."""
    if isinstance(v, FunctionVar):
        from ember.capture.builtins import handler_for

        return not is_trusted_module(v.fn.__module__ or "") and handler_for(v.fn) is None
    if isinstance(v, ModuleVar):  # (a module ember compiled already runs its own cache)
        return not is_trusted_module(type(v.value).__module__) and original_attr(v.value) is None
    return False


# -- liveness -------------------------------------------------------------------------------
_READS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST")
_PAIRS = ("LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST")
_ENDS = ("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
         "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")


def _live_in(info: CodeInfo) -> list[set[str]]:
    """Per instruction, the locals that may be read before being written (backward dataflow)."""
    instrs = info.instrs
    n = len(instrs)
    succs: list[list[int]] = []
    jumps = set(dis.hasjrel) | set(dis.hasjabs)
    for i, ins in enumerate(instrs):
        s = []
        if ins.opname not in _ENDS and i + 1 < n:
            s.append(i + 1)
        if dis.opmap.get(ins.opname, -1) in jumps and ins.argval in info.index_of:
            s.append(info.index_of[ins.argval])
        for e in info.exc_table:
            if e.start <= ins.offset < e.end:
                s.append(info.index_of[e.target])
        succs.append(s)
    live: list[set[str]] = [set() for _ in range(n)]
    changed = True
    while changed:
        changed = False
        for i in range(n - 1, -1, -1):
            ins = instrs[i]
            out: set[str] = set()
            for j in succs[i]:
                out |= live[j]
            if ins.opname == "STORE_FAST":
                out = out - {ins.argval}
            elif ins.opname in _READS:
                out = out | {ins.argval}
            elif ins.opname in _PAIRS:  # 3.13's superinstructions: argval is (first, second)
                first, second = ins.argval
                if ins.opname == "LOAD_FAST_LOAD_FAST":
                    out = out | {first, second}
                elif ins.opname == "STORE_FAST_STORE_FAST":
                    out = out - {first, second}
                else:  # STORE_FAST_LOAD_FAST: stores first, then reads second
                    out = (out | {second}) - {first}
            if out != live[i]:
                live[i] = out
                changed = True
    return live


_LIVE: weakref.WeakKeyDictionary[types.CodeType, list[set[str]]] = weakref.WeakKeyDictionary()


def _live_cells_and_locals(info: CodeInfo, frame: Frame, succ: list[int]) -> list[str]:
    live = _LIVE.get(info.code)
    if live is None:
        live = _LIVE[info.code] = _live_in(info)
    names: set[str] = set()
    for s in succ:
        names |= live[s]
    out = [n for n in info.code.co_varnames if n in names and n in frame.locals]
    for c in info.code.co_cellvars:
        cell = frame.cells.get(c)
        if cell is not None and cell.contents is not None:
            raise unhandled(f"a graph break with closure variable {c!r} live")
    return out


def _remaining(it: IteratorVar) -> list[Var]:
    seq = it.over.items if it.over is not None else it.items
    return list(seq[it.pos:])


# -- values ---------------------------------------------------------------------------------
# -- code objects, made once per site -------------------------------------------------------
_RESUME: weakref.WeakKeyDictionary[types.CodeType, dict[Any, types.CodeType]] = \
    weakref.WeakKeyDictionary()
_BREAK: weakref.WeakKeyDictionary[types.CodeType, dict[Any, types.CodeType]] = \
    weakref.WeakKeyDictionary()
_FUNCS: weakref.WeakValueDictionary[Any, types.FunctionType] = weakref.WeakValueDictionary()


def _resume_fn(fn: types.FunctionType, info: CodeInfo, target: int, slots: list[bg.Slot],
               live: list[str]) -> types.FunctionType:
    code = fn.__code__
    key = (target, tuple(slots), tuple(live))
    per = _RESUME.setdefault(code, {})
    rc = per.get(key)
    if rc is None:
        line = info.instrs[target].line
        base = re.sub(r"^__resume_(.*)_at_\d+$", r"\1", code.co_name)
        rc = per[key] = bg.resume_code(code, target, slots, live, f"__resume_{base}_at_{line}")
    fkey = (id(rc), id(fn.__globals__), id(fn.__closure__))
    f = _FUNCS.get(fkey)
    if f is None or f.__code__ is not rc:
        f = types.FunctionType(rc, fn.__globals__, rc.co_name, None, fn.__closure__)
        f.__qualname__ = rc.co_name
        _FUNCS[fkey] = f
    return f


def _cached_break(code: types.CodeType, plan: bg.BreakPlan, name: str) -> types.CodeType:
    per = _BREAK.setdefault(code, {})
    bc = per.get(plan)
    if bc is None:
        bc = per[plan] = bg.break_code(code, plan, name)
    return bc
