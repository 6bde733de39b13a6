"""The opcode table: one handler per CPython opcode, registered with the versions it applies to.

Handlers live in one module per family (stack, loads and stores, arithmetic and comparison,
containers, calls and functions, control flow, attributes, exceptions). `table()` assembles the
handlers for one Python version and checks each name against that version's `dis.opmap`; an
opcode without a handler is unhandled, by name, when capture meets it. Opcodes that are known and
deliberately not handled are listed in `NOT_HANDLED` with the reason.
"""

from __future__ import annotations

import dis
import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ember.capture.frame import PY_VERSION, Frame, Instr
from ember.capture.variables import NULL, MethodVar, NullVar, Var

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

PY311 = (3, 11)
PY312 = (3, 12)
PY313 = (3, 13)
ALL = frozenset({PY311, PY312, PY313})
SUPPORTED = tuple(sorted(ALL))  # the Pythons with an opcode table
ONLY_311 = frozenset({PY311})
ONLY_312 = frozenset({PY312})
ONLY_313 = frozenset({PY313})  # the 3.13-only code paths: search for ONLY_313 to review them
SINCE_312 = frozenset({PY312, PY313})  # opcodes 3.12 introduced that 3.13 kept
UNTIL_312 = frozenset({PY311, PY312})  # opcodes 3.13 removed (or made pseudo-instructions)
# 3.13 moved the NULL of a plain call after the callable: `callable, NULL|self, args`.
NULL_AFTER_CALLABLE = PY_VERSION >= PY313

# A handler returns None to continue, or a Return to end the frame.
Handler = Callable[["Tracer", Frame, Instr], Any]


class Return:
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


_REGISTRY: dict[tuple[str, tuple[int, int]], Handler] = {}


def handler(*names: str, versions: Iterable[tuple[int, int]] = ALL
            ) -> Callable[[Handler], Handler]:
    """Register `fn` as the handler of each opcode in `names` for each of `versions`."""
    vs = frozenset(versions)

    def deco(fn: Handler) -> Handler:
        for name in names:
            for v in vs:
                if (name, v) in _REGISTRY:
                    raise ValueError(f"opcode {name} already has a handler for {v}")
                _REGISTRY[(name, v)] = fn
        return fn

    return deco


NOT_HANDLED: dict[str, str] = {
    "LOAD_BUILD_CLASS": "a class statement inside a compiled function",
    "SETUP_ANNOTATIONS": "annotations of a module or class body",
    "IMPORT_STAR": "`from m import *` inside a function",
    "LOAD_NAME": "name lookup of a module or class body",
    "STORE_NAME": "name binding of a module or class body",
    "DELETE_NAME": "name binding of a module or class body",
    "DELETE_GLOBAL": "deleting a global (side effects come with graph breaks)",
    "GET_AWAITABLE": "async code",
    "GET_AITER": "async code",
    "GET_ANEXT": "async code",
    "BEFORE_ASYNC_WITH": "async code",
    "END_ASYNC_FOR": "async code",
    "ASYNC_GEN_WRAP": "async code",
    "MATCH_CLASS": "a match statement",
    "MATCH_MAPPING": "a match statement",
    "MATCH_SEQUENCE": "a match statement",
    "MATCH_KEYS": "a match statement",
    "GET_LEN": "a match statement",
    "PREP_RERAISE_STAR": "except*",
    "CHECK_EG_MATCH": "except*",
    "PRINT_EXPR": "the interactive interpreter",
}


FAMILIES = ("stack", "loads", "operators", "containers", "calls", "control", "attrs",
            "exceptions")


def _load_families() -> None:
    for name in FAMILIES:  # registration happens on import
        importlib.import_module(f"ember.capture.opcodes.{name}")


def table(version: tuple[int, int] = PY_VERSION) -> dict[str, Handler]:
    """The handlers for one Python version, checked against `dis.opmap` when it is ours."""
    _load_families()
    out = {name: fn for (name, v), fn in _REGISTRY.items() if v == version}
    if version == PY_VERSION:
        unknown = sorted(n for n in out if n not in dis.opmap)
        if unknown:
            raise AssertionError(f"opcode handlers for names this Python does not have: "
                                 f"{', '.join(unknown)}")
    return out


def push_with_null(frame: Frame, v: Var) -> None:
    """Push a callable with the NULL that marks a plain (not a method) call: below it on 3.11
    and 3.12, above it on 3.13."""
    if NULL_AFTER_CALLABLE:
        frame.push(v)
        frame.push(NULL)
    else:
        frame.push(NULL)
        frame.push(v)


def callee(first: Var, second: Var) -> Var:
    """What CALL calls, from the two stack slots below its arguments (bottom first)."""
    if NULL_AFTER_CALLABLE:  # 3.13: [callable, NULL] or [method, self]
        return first if isinstance(second, NullVar) else MethodVar(first, second)
    # 3.11, 3.12: [NULL, callable] or [method, self]
    return second if isinstance(first, NullVar) else MethodVar(first, second)


def registered() -> dict[tuple[str, tuple[int, int]], Handler]:
    _load_families()
    return dict(_REGISTRY)
