"""Running a capture that was split at a graph break, and replaying Python side effects.

A `Broken` capture (`ember.capture.resume`) becomes a cache entry that, when its guards hold:
runs the graph so far through the backend; rebuilds the values live at the break (the stack
values the break instruction consumes, the stack below them, the live locals) and applies the
side effects recorded before the break; then calls the break function — new bytecode that runs
the break instruction(s) in plain Python and returns the result of the resume function for the
successor taken. Each resume function is itself compiled by ember (`CompiledFunction.child`):
its own captures, guards, cache, and breaks. A callee whose body broke is passed through
ember's compile wrapper (`CompiledFunction.callee`), so it is captured on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember.capture.resume import Broken
from ember.capture.side_effects import apply
from ember.runtime.backends import Runner
from ember.runtime.guards import CallCode
from ember.runtime.writeback import Epilogue


class BreakEntry:
    def __init__(self, brk: Broken, runner: Runner, resumes: list[Callable[..., Any]],
                 callee: Callable[[Any], Any]):
        cap = brk.captured
        self.code = CallCode(cap.guards, cap.input_sources, cap.output)
        self.runner = runner
        self.captured = cap
        self.epilogue = Epilogue(cap)
        self.matches = self.epilogue.matches
        self.brk = brk
        self.resumes = resumes
        self.callee = callee

    def run(self, S: Any, A: tuple[Any, ...], K: dict[str, Any], inputs: list[Any]) -> Any:
        outs = self.runner(inputs)
        return self.resume(outs, S, A, K, inputs)

    def resume(self, outs: list[Any], S: Any, A: tuple[Any, ...], K: dict[str, Any],
               inputs: list[Any]) -> Any:
        """After the graph ran: side effects, the break instruction(s), the resume function."""
        brk = self.brk
        assert self.code.output is not None
        values = self.code.output(self.epilogue(outs, inputs), S, A, K)
        apply(brk.effects, values[brk.nargs:])
        args = list(values[:brk.nargs])
        for i in brk.wrap:
            args[i] = self.callee(args[i])
        grad = torch.is_grad_enabled()
        try:
            return brk.break_fn(*self.resumes, *args)
        except BaseException:
            # the break function switches grad mode around the break instruction inside a
            # no_grad block; an exception from there must not leave it switched
            torch.set_grad_enabled(grad)
            raise


def run_with_effects(code: CallCode, cap: Any, results: list[Any], S: Any, A: tuple[Any, ...],
                     K: dict[str, Any]) -> Any:
    """A whole capture's return value, after applying its side effects."""
    assert code.output is not None
    values = code.output(results, S, A, K)
    apply(cap.effects, values[1:])
    return values[0]
