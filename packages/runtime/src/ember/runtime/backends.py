"""Backends for compiled functions: what runs a captured graph.

`compile(fn, backend=B)` takes the same backends as `ember run --backend B`: the protocol of
ember.ir.backends (`name`, `summary`, `prepare(module, example_inputs, options) -> Runner`,
optional `supports_training` and `pipeline`), by registered name (`ember backends`, including
third parties' from the `ember.backends` entry point group) or as a backend object. Every one
runs under compile()'s policy (compile.py): fallbacks to eager counted in explain(), notes,
EMBER_DUMP.

Registered here: "eager" runs the aten graph op by op with ember.ir's interpreter (real aten
operators, so autograd flows through them as in eager PyTorch); "aot_eager" decomposes to prims
and interprets them (in compile(), a training graph as its partitioned forward and backward).
"inductor" (the default; registered by ember.inductor) is wired in compile.py, as is any
backend with a `pipeline`: `pipeline_backend()` makes one from a pipeline string.

A callable `backend(module, example_inputs) -> runner(inputs) -> results` (the form before the
protocol) is accepted too, as a backend named after the callable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ember.prims  # noqa: F401  (registers the prims backend)
from ember.ir import Interpreter, InterpretError, Module, RunResult
from ember.ir.backends import Backend as IRBackend
from ember.ir.backends import BackendProtocol, check_backend, default_backends
from ember.ir.backends import Runner as IRRunner

Runner = Callable[[Sequence[Any]], list[Any]]  # a compiled graph: its inputs -> its results
# the callable form of a backend compile() took before the protocol
BackendFn = Callable[[Module, Sequence[Any]], Runner]
Backend = BackendFn  # (its former name here)


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


def _eager_ir(module: Module) -> IRRunner:
    interp = Interpreter(module, check_types=False)

    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        try:
            return interp.run(inputs, graph)
        except InterpretError as e:  # as eager_backend: the op's own exception
            if e.node is not None and isinstance(e.__cause__, Exception):
                raise e.__cause__ from None
            raise

    return run


def _aot_eager_ir(module: Module) -> IRRunner:
    # outside compile() (no training graphs to partition) aot_eager is prims, interpreted
    return default_backends().get("prims").prepare(module)


class CompiledRunner:
    """A runner of a compiled (kernels.*) module that carries it as `compiled`, the attribute
    compile() dumps as NAME.kernels.ir."""

    def __init__(self, compiled: Module, run: IRRunner):
        self.compiled = compiled
        self._run = run

    def __call__(self, graph: str | None, inputs: Sequence[Any]) -> RunResult:
        return self._run(graph, inputs)


def _compiled_runner(module: Module, pipeline: str) -> IRRunner:
    from ember.inductor.backend import compile_module, compiled_runner

    compiled = compile_module(module, pipeline)
    return CompiledRunner(compiled, compiled_runner(compiled, module))


def pipeline_backend(name: str, summary: str, pipeline: str, *,
                     supports_training: bool = True) -> IRBackend:
    """A backend that is a pass pipeline ending in kernels (`codegen-cpp`, `plan-buffers`):
    `ember run --backend NAME` runs the pipeline and the compiled module; compile() runs it
    under the inductor's policy (options decompositions, verify_each and dump_each apply, the
    compiled module is dumped as NAME.kernels.ir, fallbacks are the inductor's)."""
    def prepare(module: Module, example_inputs: Sequence[Any] | None,
                options: Mapping[str, Any]) -> IRRunner:
        return _compiled_runner(module, pipeline)

    return IRBackend(name, summary, prepare, supports_training=supports_training,
                     pipeline=pipeline)


def _register() -> None:
    reg = default_backends()
    have = set(reg._backends)  # (not .all(): that would load plugins at import time)
    if "eager" not in have:
        reg.add(IRBackend("eager", "the captured aten graph op by op on real aten operators "
                          "(compile(): autograd flows through them)", _eager_ir))
    if "aot_eager" not in have:
        reg.add(IRBackend("aot_eager", "prims on the reference interpreter (compile(): a "
                          "training graph as its partitioned forward and backward)",
                          _aot_eager_ir, supports_training=True))


_register()


def _legacy(fn: BackendFn) -> BackendProtocol:
    """The protocol's backend for a callable `fn(module, example_inputs) -> runner(inputs)`."""
    def prepare(module: Module, example_inputs: Sequence[Any] | None,
                options: Mapping[str, Any]) -> IRRunner:
        run = fn(module, list(example_inputs or ()))

        def runner(graph: str | None, inputs: Sequence[Any]) -> RunResult:
            return RunResult(list(run(inputs)), {})

        return runner

    name = getattr(fn, "__name__", None) or "custom"
    return IRBackend(name, f"the callable {name}", prepare)


PLANNED: tuple[str, ...] = ()  # named backends not built yet (they run the eager backend)


def resolve(backend: str | BackendProtocol | BackendFn) -> tuple[BackendProtocol, str | None]:
    """(the backend, a note when a planned backend falls back to eager). A name is looked up
    in the registry (plugins included); an object is checked against the protocol."""
    if isinstance(backend, str):
        if backend in PLANNED:
            return default_backends().get("eager"), (
                f"backend {backend!r} is not built yet: the eager backend (the captured aten "
                f"graph run op by op) ran the graphs")
        try:
            return default_backends().get(backend), None
        except KeyError:
            known = [*default_backends().all(), *PLANNED]
            raise ValueError(f"unknown backend {backend!r}; available: {', '.join(known)}, a "
                             f"backend object (ember.ir.backends.Backend) or a callable"
                             ) from None
    if isinstance(backend, BackendProtocol):
        return check_backend(backend), None
    if callable(backend):
        return _legacy(backend), None
    raise TypeError(f"backend must be a name, a backend object or a callable, not "
                    f"{type(backend).__name__}")
