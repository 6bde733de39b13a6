"""The tracer: capture-wide state, the instruction loop, and inlining of user functions.

One `Tracer` captures one call. It owns the recorder (the graph being built), the guards, the
symbolic grad/autocast state, and the stack of symbolic frames; handlers receive it explicitly.
User functions are inlined: their arguments are bound as CPython binds them (defaults, *args,
**kwargs, keyword-only), their closures read through cells, and their bytecode runs in a new
symbolic frame. Generators run to completion and yield a list.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from ember.capture.errors import CaptureUnhandled, StopCapture, UserError, unhandled
from ember.capture.frame import PY_VERSION, Frame, code_info
from ember.capture.guards import Guard, GuardSet
from ember.capture.lookups import function_defaults
from ember.capture.opcodes import SUPPORTED, Return, table
from ember.capture.recorder import Recorder
from ember.capture.side_effects import SideEffects
from ember.capture.sources import CellSource, Source
from ember.capture.variables import (
    Cell,
    CtxState,
    DictVar,
    FunctionVar,
    IteratorVar,
    NestedFunctionVar,
    TupleVar,
    Var,
)
from ember.capture.wrap import is_trusted_module, wrap
from ember.ir import Loc

CO_GENERATOR = inspect.CO_GENERATOR
CO_ASYNC = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class Tracer:
    MAX_DEPTH = 60  # nested inlined calls
    MAX_STEPS = 2_000_000  # instructions per capture (an unbounded loop ends here)
    MAX_YIELDS = 10_000

    def __init__(self, graph_name: str):
        self.recorder = Recorder(graph_name)
        self.recorder.where = self.current_loc
        self.guards = GuardSet()
        self.wrapped: dict[int, tuple[Var, Any]] = {}
        self.frames: list[Frame] = []
        self.table = table()
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast: list[CtxState] = []
        self.open_grad_changes = 0  # set_grad_enabled(b) called outside `with`
        self.steps = 0
        # graph breaks: instructions started in the compiled function's own frame, and (in a
        # restarted capture) the count at which to stop before the break instruction(s)
        self.top_steps = 0
        self.stop_at: int | None = None
        self.side_effects = SideEffects()

    # -- services for handlers --------------------------------------------------------------
    def guard(self, g: Guard) -> None:
        self.guards.add(g)

    def wrap(self, value: Any, source: Source | None) -> Var:
        return wrap(self, value, source)

    def call(self, fn: Var, args: list[Var], kwargs: dict[str, Var] | None = None) -> Var:
        from ember.capture.calls import call_function

        return call_function(self, fn, list(args), dict(kwargs or {}))

    def current_loc(self) -> Loc | None:
        """The user's line: the innermost frame outside torch's own code."""
        frame = next((f for f in reversed(self.frames) if not f.trusted), None)
        if frame is None:
            frame = self.frames[-1] if self.frames else None
        if frame is None or frame.current is None:
            return None
        return Loc(frame.code.co_filename, frame.current.line, frame.current.col)

    @contextlib.contextmanager
    def torch_state(self) -> Iterator[None]:
        """The symbolic grad mode and autocast state, applied while torch code runs on fakes."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(self.grad_enabled))
            for st in self.autocast:
                stack.enter_context(torch.autocast(st.device, dtype=st.dtype,
                                                   enabled=st.enabled))
            yield

    # -- running frames ---------------------------------------------------------------------
    def run_frame(self, frame: Frame) -> Var:
        if len(self.frames) >= self.MAX_DEPTH:
            raise unhandled(f"calls nested deeper than {self.MAX_DEPTH} (recursion?)")
        self.frames.append(frame)
        try:
            return self._loop(frame)
        except CaptureUnhandled as e:
            file, line = frame.location()
            e.locate(file, line, frame.code.co_name, not frame.trusted)
            raise
        finally:
            self.frames.pop()

    def _loop(self, frame: Frame) -> Var:
        instrs = frame.info.instrs
        handlers = self.table
        while True:
            if frame.index >= len(instrs):
                raise unhandled("ran past the end of the bytecode")
            inst = instrs[frame.index]
            top = frame is self.frames[0]
            if top:
                self.top_steps += 1
                if self.top_steps == self.stop_at:
                    raise StopCapture(frame)
            frame.index += 1
            frame.current = inst
            self.steps += 1
            if self.steps > self.MAX_STEPS:
                err = unhandled(f"more than {self.MAX_STEPS} instructions executed (a loop "
                                f"that does not end on constants?)")
                err.breakable = False
                raise err
            fn = handlers.get(inst.opname)
            if fn is None:
                if PY_VERSION not in SUPPORTED:  # no table at all: no graph break helps
                    err = unhandled(f"Python {PY_VERSION[0]}.{PY_VERSION[1]}: capture has "
                                    f"opcode tables for {', '.join(map(_dotted, SUPPORTED))} "
                                    f"only", inst.opname)
                    err.breakable = False
                    raise err
                raise unhandled(f"opcode {inst.opname}", inst.opname)
            try:
                r = fn(self, frame, inst)
            except CaptureUnhandled as cu:
                if top and cu.top_index is None:  # a graph break would split the frame here
                    cu.top_index, cu.top_step = frame.index - 1, self.top_steps
                raise
            except UserError as err:
                if frame.handle(err, inst):
                    continue
                if err.file is None:
                    err.file, err.line = frame.code.co_filename, inst.line
                err.stack.insert(0, f"{frame.code.co_filename}:{inst.line} in "
                                    f"{frame.code.co_name}")
                raise
            if isinstance(r, Return):
                assert isinstance(r.value, Var)
                return r.value

    # -- inlining ---------------------------------------------------------------------------
    def inline(self, fn: FunctionVar | NestedFunctionVar, args: list[Var],
               kwargs: dict[str, Var]) -> Var:
        defaults: Sequence[Var]
        kwdefaults: Mapping[str, Var]
        if isinstance(fn, FunctionVar):
            f = fn.fn
            code = f.__code__
            glb = f.__globals__
            module = f.__module__ or ""
            defaults, kwdefaults = function_defaults(self, f)  # read lazily, guarded
            closure: list[Cell | Any] = list(f.__closure__ or ())
            name = f.__qualname__
        else:
            code, glb, name = fn.code, fn.globals, fn.qualname
            module = str(glb.get("__name__", ""))
            defaults = list(fn.defaults or [])
            kwdefaults = dict(fn.kwdefaults or {})
            closure = list(fn.closure or [])
        if code.co_flags & CO_ASYNC:
            raise unhandled(f"calling async function {name}")
        local_vars = bind_arguments(code, name, args, kwargs, defaults, kwdefaults)
        cells: dict[str, Cell] = {}
        trusted = is_trusted_module(module)
        for var_name, c in zip(code.co_freevars, closure, strict=True):
            if isinstance(c, Cell):
                cells[var_name] = c
            else:
                try:
                    contents = c.cell_contents
                except ValueError:
                    cells[var_name] = Cell(None, real=True)
                    continue
                src = None if trusted else CellSource(c, var_name)
                cells[var_name] = Cell(self.wrap(contents, src), real=True)
        frame = Frame(code_info(code), glb, local_vars, cells, module, trusted)
        if code.co_flags & CO_GENERATOR:
            frame.yields = []
            it = IteratorVar(frame.yields, kind="generator")
            it.returned = self.run_frame(frame)
            return it
        return self.run_frame(frame)


def bind_arguments(code: types.CodeType, name: str, args: list[Var], kwargs: dict[str, Var],
                   defaults: Sequence[Var], kwdefaults: Mapping[str, Var]) -> dict[str, Var]:
    """Bind a call's arguments to a code object's parameters, as CPython does."""
    nargs = code.co_argcount
    nposonly = code.co_posonlyargcount
    nkwonly = code.co_kwonlyargcount
    names = code.co_varnames
    params = names[:nargs]
    kwonly = names[nargs:nargs + nkwonly]
    i = nargs + nkwonly
    varargs = names[i] if code.co_flags & inspect.CO_VARARGS else None
    if varargs is not None:
        i += 1
    varkw = names[i] if code.co_flags & inspect.CO_VARKEYWORDS else None
    out: dict[str, Var] = {}
    for p, a in zip(params, args):
        out[p] = a
    extra = args[nargs:]
    if extra:
        if varargs is None:
            raise UserError(TypeError(f"{name}() takes {nargs} positional arguments but "
                                      f"{len(args)} were given"))
    if varargs is not None:
        out[varargs] = TupleVar(list(extra))
    rest: dict[Any, Var] = {}
    for k, v in kwargs.items():
        if k in params[nposonly:] or k in kwonly:
            if k in out:
                raise UserError(TypeError(f"{name}() got multiple values for argument {k!r}"))
            out[k] = v
        elif varkw is not None:
            rest[k] = v
        else:
            raise UserError(TypeError(f"{name}() got an unexpected keyword argument {k!r}"))
    if varkw is not None:
        out[varkw] = DictVar(rest)
    first_default = nargs - len(defaults)
    for j, p in enumerate(params):
        if p not in out:
            if j >= first_default:
                out[p] = defaults[j - first_default]
            else:
                raise UserError(TypeError(f"{name}() missing required argument {p!r}"))
    for p in kwonly:
        if p not in out:
            if p in kwdefaults:
                out[p] = kwdefaults[p]
            else:
                raise UserError(TypeError(f"{name}() missing keyword-only argument {p!r}"))
    return out


def _dotted(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"
