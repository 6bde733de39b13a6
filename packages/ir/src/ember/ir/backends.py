"""IR backends: named ways to run a module's graph, for `ember run --backend` and `ember check`.

A backend prepares a module once (lowering, compiling) and returns a runner that takes the
graph name and its inputs and gives a `RunResult`. ember.ir registers `reference` (the
interpreter, op by op); lower layers register theirs (ember.prims: `prims`; the inductor:
`inductor`); third parties through the entry point group `ember.ir_backends`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ember.ir.graph import Module
from ember.ir.interpreter import Interpreter, RunResult

Runner = Callable[[str | None, Sequence[Any]], RunResult]


@dataclass(frozen=True)
class Backend:
    name: str
    summary: str
    prepare: Callable[[Module], Runner]


class BackendRegistry:
    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._plugins_loaded = False

    def add(self, b: Backend) -> Backend:
        if b.name in self._backends:
            raise ValueError(f"backend {b.name} is already registered")
        self._backends[b.name] = b
        return b

    def get(self, name: str) -> Backend:
        self._load_plugins()
        try:
            return self._backends[name]
        except KeyError:
            raise KeyError(f"unknown backend {name!r} (known: "
                           f"{', '.join(sorted(self._backends))})") from None

    def all(self) -> dict[str, Backend]:
        self._load_plugins()
        return dict(sorted(self._backends.items()))

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group="ember.ir_backends"):
            obj = ep.load()
            if isinstance(obj, Backend) and obj.name not in self._backends:
                self.add(obj)


def _reference(module: Module) -> Runner:
    interp = Interpreter(module)
    return lambda graph, inputs: interp.run(inputs, graph)


_DEFAULT = BackendRegistry()
_DEFAULT.add(Backend("reference", "the reference interpreter: each op's reference, op by op",
                     _reference))


def default_backends() -> BackendRegistry:
    return _DEFAULT
