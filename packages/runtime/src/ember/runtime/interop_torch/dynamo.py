"""`torch.compile(model, backend="ember")`: ember as a TorchDynamo backend.

torch finds the backend through the `torch_dynamo_backends` entry point group (ember-runtime's
pyproject.toml; torch reads the group in `torch._dynamo.backends.registry`), so it is listed by
`torch._dynamo.list_backends()` once ember-runtime is installed, with nothing imported up front.

TorchDynamo hands the backend an FX GraphModule and example inputs. The FX -> ember IR importer
is ember's own capture run on the GraphModule (`ember.runtime.compile(gm, fullgraph=True)`):
the GraphModule's generated `forward` is ordinary straight-line Python calling torch functions,
tensor methods and submodules, which is what capture reads, and capture records what those calls
really run at the ATen level on fake tensors. Chosen over walking the FX nodes under ember's
recorder because capture already gives everything a correct graph needs, for real models:
  - every FX node kind: torch functions and `torch._C` bindings, tensor methods, `call_module`
    (parameters and buffers become graph inputs), `operator.getitem`, Python scalars;
  - mutation: in-place ops on inputs and buffers (Dynamo keeps them, e.g. `x.add_(y)` or
    BatchNorm's running statistics) are functionalized into `input_updates`, which ember's
    runtime writes back into the caller's tensors; outputs that are views of inputs are replayed
    as views;
  - guards and the cache (a new shape recaptures), `explain` records and EMBER_DUMP, because the
    graph goes through exactly the path of `ember.runtime.compile`.
A separate FX walker would have to rebuild input sources, functionalization and the output plan.

The captured graph is compiled with ember's default pipeline (backend "inductor": prims, then
C++ kernels). Fallback policy, never silent: if capture cannot take the graph
(`CaptureError`), the GraphModule runs eagerly from then on; if ember's inductor cannot compile
it (or its code fails), ember's eager backend runs the captured graph. Both warn with the reason,
and the reason is kept on the `EmberGraph` (see `compiled_graphs()`).

Options (`torch.compile(m, backend="ember", options={...})`): "backend" picks ember's backend
(any name `ember.runtime.compile` takes: "inductor", "eager", "prims", "torch-inductor"),
"cache_limit" bounds ember's recompilations per graph; `mode` is passed through. Other keys are
an error naming the known ones.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ember.runtime.compile import CompiledFunction
from ember.runtime.entries import CaptureError
from ember.runtime.fallbacks import record
from ember.runtime.history import Fallback

OPTIONS = ("backend", "cache_limit")
# compile.py's note for a graph that ember's eager backend ran instead of the inductor's code
EAGER_RAN = "the eager backend ran it"


# Calls Dynamo keeps in graphs that compute nothing: torch's API-usage logging (made when a
# module is built inside forward). Capture rightly refuses unknown torch._C calls, so the importer
# drops these (their results are never used) before capture reads the code.
BOOKKEEPING = (torch._C._log_api_usage_once,)


def drop_bookkeeping(gm: fx.GraphModule) -> int:
    """Remove unused bookkeeping calls from `gm` (in place); how many."""
    dead = [n for n in gm.graph.nodes
            if n.op == "call_function" and n.target in BOOKKEEPING and not n.users]
    for n in dead:
        gm.graph.erase_node(n)
    if dead:
        gm.recompile()
    return len(dead)


class EmberGraph:
    """What `backend="ember"` returns for one Dynamo graph: calls run ember's compiled code."""

    def __init__(self, gm: fx.GraphModule, *, backend: str = "inductor", mode: str | None = None,
                 cache_limit: int | None = None):
        self.gm = gm
        self.dropped = drop_bookkeeping(gm)
        # Dynamo's GraphModules generate their code lazily, at the first call through torch's
        # wrapper; `.code` generates it now, so capture reads the real `forward` (called
        # directly: nn.Module.__call__ and FX's call wrapper add nothing for a graph).
        gm.code  # noqa: B018
        opts = {} if cache_limit is None else {"cache_limit": cache_limit}
        self.compiled = CompiledFunction(gm.forward, backend=backend, fullgraph=True, mode=mode,
                                         options=opts)
        self.fallback: str | None = None  # why the GraphModule runs eagerly, if it does
        self._seen = 0  # notes already looked at for fallbacks

    @property
    def eager_reasons(self) -> list[str]:
        """Every reason ember did not run its compiled code (capture or code generation)."""
        notes = [n for n in self.compiled.history.notes if EAGER_RAN in n]
        return ([self.fallback] if self.fallback else []) + notes

    @property
    def ran_compiled(self) -> bool:
        """At least one graph was captured and ember ran it with nothing falling back."""
        return bool(self.compiled.history.graphs) and not self.eager_reasons

    def __call__(self, *args: Any) -> Any:
        if self.fallback is not None:
            return self.gm.forward(*args)
        try:
            out = self.compiled(*args)
        except CaptureError as e:  # raised before anything ran: running eagerly is safe
            self.fallback = str(e)
            # counted as compile()'s own capture fallbacks are (explain() of g.compiled), with
            # this warning in place of the FallbackWarning: it names the FX graph
            history = self.compiled.history
            history.warned.add("capture")
            code = self.gm.forward.__code__
            record(history, Fallback(f"{e}; the FX graph runs eagerly", code.co_filename,
                                     code.co_firstlineno, kind="capture"), self.compiled.name)
            warnings.warn(f"ember backend: {e}; the FX graph runs eagerly", stacklevel=2)
            return self.gm.forward(*args)
        notes = self.compiled.history.notes
        if len(notes) > self._seen:
            for n in notes[self._seen:]:
                if EAGER_RAN in n:
                    warnings.warn(f"ember backend: {n} (not ember's compiled code)",
                                  stacklevel=2)
            self._seen = len(notes)
        return out


_GRAPHS: list[weakref.ref[EmberGraph]] = []


def compiled_graphs() -> list[EmberGraph]:
    """The graphs the ember backend compiled that are still alive (Dynamo holds them), oldest
    first: for tests and debugging (`g.ran_compiled`, `g.eager_reasons`, `g.compiled.history`)."""
    _GRAPHS[:] = [r for r in _GRAPHS if r() is not None]
    return [g for r in _GRAPHS if (g := r()) is not None]


def ember_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
                  options: dict[str, Any] | None = None) -> EmberGraph:
    """The TorchDynamo backend: `gm` compiled by ember (lazily, at the first call: capture
    needs the real call's inputs, which Dynamo passes on every call anyway)."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ValueError(f"ember backend: unknown option(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(OPTIONS)}")
    backend = opts.get("backend", "inductor")
    if not isinstance(backend, str):
        raise TypeError(f"ember backend: option 'backend' is a backend name, not "
                        f"{type(backend).__name__}")
    limit = opts.get("cache_limit")
    g = EmberGraph(gm, backend=backend, mode=mode, cache_limit=None if limit is None
                   else int(limit))
    _GRAPHS.append(weakref.ref(g))
    return g


def reset() -> None:
    """Forget the graph records (torch._dynamo.reset() drops the graphs themselves)."""
    _GRAPHS.clear()


ember_backend.reset = reset  # type: ignore[attr-defined]  # torch calls a backend's reset()


__all__ = ["EmberGraph", "compiled_graphs", "ember_backend"]
