"""Backends for compiled functions: what runs a captured graph.

A backend takes the captured ir-v1 module and example inputs and returns a callable from the
graph's inputs to its outputs. "eager" runs the aten graph op by op with ember.ir's interpreter
(real aten operators, so autograd flows through them as in eager PyTorch). Any backend in the IR
backend registry (`ember backends`, e.g. "prims": the graph decomposed to prims and
interpreted) can be named too; "inductor" (the default) is wired in compile.py, which falls
back to eager with a recorded reason where the inductor cannot run a graph. Backends of the
design that are not built yet ("aot_eager") run the eager backend, and the compiled function's
explain() report says so. A callable `backend(module, example_inputs) -> runner` is accepted
too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ember.prims  # noqa: F401  (registers the prims backend)
from ember.ir import Interpreter, InterpretError, Module
from ember.ir.backends import default_backends

Runner = Callable[[Sequence[Any]], list[Any]]
Backend = Callable[[Module, Sequence[Any]], Runner]


def eager_backend(module: Module, example_inputs: Sequence[Any]) -> Runner:
    interp = Interpreter(module, check_types=False)

    def run(inputs: Sequence[Any]) -> list[Any]:
        try:
            return interp.run(inputs).outputs
        except InterpretError as e:
            # an aten op raised on these inputs (a node's error wrapping the op's): eager
            # PyTorch raises that op's exception (e.g. RuntimeError "ZeroDivisionError")
            if e.node is not None and isinstance(e.__cause__, Exception):
                raise e.__cause__ from None
            raise

    return run


def _ir_backend(name: str) -> Backend:
    def prepare(module: Module, example_inputs: Sequence[Any]) -> Runner:
        runner = default_backends().get(name).prepare(module)
        graph = module.graph().name

        def run(inputs: Sequence[Any]) -> list[Any]:
            return list(runner(graph, inputs).outputs)

        return run

    prepare.__name__ = name
    return prepare


PLANNED: tuple[str, ...] = ()  # named backends not built yet (they run the eager backend)


def resolve(backend: str | Backend) -> tuple[Backend, str, str | None]:
    """(backend function, its name, a note when a planned backend falls back to eager)."""
    if callable(backend):
        return backend, getattr(backend, "__name__", "custom"), None
    if backend == "eager":
        return eager_backend, backend, None
    if backend in default_backends().all() and backend not in PLANNED:
        return _ir_backend(backend), backend, None
    if backend in PLANNED:
        return eager_backend, backend, (f"backend {backend!r} is not built yet: the eager "
                                        f"backend (the captured aten graph run op by op) ran "
                                        f"the graphs")
    known = ["eager", "aot_eager", *default_backends().all(), *PLANNED]
    raise ValueError(f"unknown backend {backend!r}; available: {', '.join(known)} or a "
                     f"callable")
