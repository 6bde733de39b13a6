"""Backends: named ways to run a module's graph, one protocol for `ember run --backend B`,
`ember check`, `ember minimize` and `ember.runtime.compile(fn, backend=B)`.

The protocol (`BackendProtocol`; `Backend` is the dataclass that implements it):

    name: str                 what `--backend` and `compile(backend=)` call it
    summary: str              one line, listed by `ember backends`
    prepare(module, example_inputs=None, options=None) -> Runner
                              lower/compile the module once; `example_inputs` are the first
                              call's inputs of its main graph (None from the CLI), `options`
                              a read-only mapping (compile()'s options; empty from the CLI)
    Runner(graph, inputs) -> RunResult
                              run one graph (None: the module's main graph) on inputs

and optional capabilities, read with `getattr`:

    supports_training: bool   compile() may hand it a graph that records gradients; it runs
                              its forward and backward graphs (default False: compile() runs
                              such a graph on it as is, autograd through the ops it calls)
    pipeline: str | None      the backend *is* a pass pipeline ending in kernels: compile()
                              runs that pipeline under the inductor's policy (options
                              decompositions/verify_each/dump_each, C++ built and cached,
                              fallbacks, EMBER_DUMP's NAME.kernels.ir)

A runner may carry `compiled: Module`, the module it runs: compile() dumps it beside the
captured graph as NAME.kernels.ir (EMBER_DUMP). compile() gives every backend the same policy:
a prepare() that raises is a "backend" fallback to eager, a run that raises where eager does
not is a "runtime" fallback, both counted in explain() with a note.

ember.ir registers `reference` (the interpreter, op by op); lower layers register theirs
(ember.prims: `prims`; the inductor: `inductor`; ember.runtime: `eager`, `aot_eager`); third
parties through the entry point group `ember.backends` (each entry point names a backend, or a
callable that registers into the registry). The older group `ember.ir_backends` is read too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from ember.ir.graph import Module
from ember.ir.interpreter import Interpreter, RunResult
from ember.ir.plugins import load_entry_points

Runner = Callable[[str | None, Sequence[Any]], RunResult]
GROUPS = ("ember.backends", "ember.ir_backends")  # the second: its name before issue 13


@runtime_checkable
class BackendProtocol(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str: ...

    def prepare(self, module: Module, example_inputs: Sequence[Any] | None = None,
                options: Mapping[str, Any] | None = None) -> Runner: ...


class BackendPluginWarning(UserWarning):
    """An `ember.backends` entry point could not be loaded: its backends are missing."""


def _arity(fn: Callable[..., Any]) -> int:
    """How many of (module, example_inputs, options) `fn` takes: the protocol's first form
    took the module alone, and backends written that way keep working."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 3
    for n in (3, 2):
        try:
            sig.bind(*([None] * n))
            return n
        except TypeError:
            pass
    return 1


@dataclass(frozen=True)
class Backend:
    """A backend from a prepare function: `prepare(module, example_inputs, options)`, or
    `prepare(module)` alone."""

    name: str
    summary: str
    prepare_fn: Callable[..., Runner]
    supports_training: bool = False
    pipeline: str | None = None

    def prepare(self, module: Module, example_inputs: Sequence[Any] | None = None,
                options: Mapping[str, Any] | None = None) -> Runner:
        args = (module, example_inputs, options or {})
        return self.prepare_fn(*args[:_arity(self.prepare_fn)])


def check_backend(obj: Any) -> BackendProtocol:
    """`obj` if it implements the protocol, else a TypeError saying what is missing."""
    missing = [a for a in ("name", "summary", "prepare") if not hasattr(obj, a)]
    if missing or not callable(obj.prepare):
        raise TypeError(f"{type(obj).__name__} is not an ember backend (it needs name, summary "
                        f"and prepare(module, example_inputs, options); missing: "
                        f"{', '.join(missing) or 'a callable prepare'})")
    if not isinstance(obj.name, str) or not obj.name:
        raise TypeError(f"a backend's name must be a non-empty str, not {obj.name!r}")
    assert isinstance(obj, BackendProtocol)
    return obj


class BackendRegistry:
    def __init__(self) -> None:
        self._backends: dict[str, BackendProtocol] = {}
        self._plugins_loaded = False
        self._loaded_eps: set[tuple[str, str]] = set()

    def add(self, b: object) -> BackendProtocol:
        be = check_backend(b)
        if be.name in self._backends:
            raise ValueError(f"backend {be.name} is already registered")
        self._backends[be.name] = be
        return be

    def get(self, name: str) -> BackendProtocol:
        self.load_plugins()
        try:
            return self._backends[name]
        except KeyError:
            raise KeyError(f"unknown backend {name!r} (known: "
                           f"{', '.join(sorted(self._backends))})") from None

    def all(self) -> dict[str, BackendProtocol]:
        self.load_plugins()
        return dict(sorted(self._backends.items()))

    def load_plugins(self, *, refresh: bool = False) -> None:
        """Load third-party backends from the entry point groups, once (`refresh=True` looks
        again and loads only entry points not loaded before). A broken entry point is skipped
        with a `BackendPluginWarning`: it must not take the other backends down."""
        if self._plugins_loaded and not refresh:
            return
        self._plugins_loaded = True

        def register(ep: Any, obj: Any) -> None:
            if isinstance(obj, BackendProtocol):
                if obj.name not in self._backends:
                    self.add(obj)
            elif callable(obj):
                obj(self)
            else:
                check_backend(obj)

        for group in GROUPS:
            if not load_entry_points(group, entry_points(group=group), self._loaded_eps,
                                     register, BackendPluginWarning):
                self._plugins_loaded = False

    # the registry's first name for load_plugins
    _load_plugins = load_plugins


def _reference(module: Module) -> Runner:
    interp = Interpreter(module)
    return lambda graph, inputs: interp.run(inputs, graph)


_DEFAULT = BackendRegistry()
_DEFAULT.add(Backend("reference", "the reference interpreter: each op's reference, op by op",
                     _reference))


def default_backends() -> BackendRegistry:
    return _DEFAULT
