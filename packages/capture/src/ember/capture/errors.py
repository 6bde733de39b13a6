"""How capture says no: `Unhandled` (a construct capture does not cover, with where it is) and
`UserError` (an exception the user's own code raises while it is executed symbolically)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Unhandled:
    """An explicit "not captured" result: what construct, and where in the user's source.

    `reason` names the construct (an opcode, a call, a kind of value); `file`/`line` point at the
    user's line being executed when capture stopped (the innermost inlined frame).
    """

    reason: str
    file: str = "<unknown>"
    line: int = 0
    opname: str | None = None
    stack: tuple[str, ...] = ()  # the inlined calls, outermost first: "file:line in fn"
    guards: tuple[Any, ...] = ()  # the guards established before capture stopped

    def __str__(self) -> str:
        return f"{self.reason} ({self.where})"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


class CaptureUnhandled(Exception):
    """Raised inside capture to unwind to the top with an `Unhandled`; never escapes `capture`."""

    def __init__(self, reason: str, opname: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.opname = opname
        self.file: str | None = None
        self.line = 0
        self.stack: list[str] = []
        # where the compiled function's own frame was when this happened (for a graph break):
        # the instruction index and how many of its instructions had started, this one included
        self.top_index: int | None = None
        self.top_step = 0
        self.breakable = True  # False: a graph break cannot help (capture-wide limits)

    def locate(self, file: str, line: int, fn: str, user_code: bool = True) -> None:
        """Called by each frame it unwinds through, innermost first: the innermost frame of
        user code (not torch's own) fixes the location; every frame adds to the stack."""
        if self.file is None and user_code:
            self.file, self.line = file, line
        self.stack.insert(0, f"{file}:{line} in {fn}")


def unhandled(reason: str, opname: str | None = None) -> CaptureUnhandled:
    return CaptureUnhandled(reason, opname)


class StopCapture(Exception):
    """Raised by the tracer where a restarted capture must stop: right before the break
    instruction(s) of the compiled function's own frame (see `ember.capture.resume`)."""

    def __init__(self, frame: Any):
        super().__init__("stopped at a graph break")
        self.frame = frame


class UserError(Exception):
    """An exception raised by the user's program itself during symbolic execution.

    It unwinds through the symbolic frames' exception tables (try/except in the user's code); if
    nothing catches it, capture reports it as Unhandled and the frame runs eagerly, where Python
    raises it for real.
    """

    def __init__(self, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc
        self.file: str | None = None  # where it escaped the innermost frame
        self.line = 0
        self.stack: list[str] = []
