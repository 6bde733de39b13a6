"""The IR backend `torch-inductor`: ember's captured aten graph compiled by torch's own inductor.

`ember.runtime.compile(model, backend="torch-inductor")` captures with ember (bytecode ->
functionalized aten graph, guards, write-back of mutated inputs by ember's runtime), then this
backend exports the graph to FX (`fx_export.to_fx`, one FX node per IR node) and hands it to
`torch._inductor.compile` (TorchInductor's stable entry point for FX graphs captured without
TorchDynamo). Same capture, other code generator: one layer A/B-tested against torch's.
`ember run --backend torch-inductor` replays a dumped graph the same way.

The backend registers through the `ember.backends` entry point group, so importing this
module stays cheap: torch._inductor is imported at the first compilation, which happens at the
first call (inductor needs example inputs; the IR backend API gives only the module). Compiled
code is specialized to its inputs' shapes, strides, dtypes and devices and to the grad mode, so
it is cached per such signature.

Never silent: a main graph that cannot be exported to FX fails `prepare` (ExportError), and a
graph torch's inductor cannot compile fails its run (TorchInductorError), each naming the
reason. Under `compile()` these are the "backend" and "runtime" fallbacks every backend gets:
eager PyTorch runs the graph, a FallbackWarning says why once and explain() counts it. Under
`ember run`/`ember check` they are one-line errors: a check of "torch-inductor" never compares
the reference interpreter with itself.

Training: the backend does not declare `supports_training`: compile() hands it a graph that
records gradients as it is, and torch's inductor (AOTAutograd inside `torch._inductor.compile`)
returns a differentiable function, so gradients are eager's (test_interop_suites.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from ember.ir import Module, RunResult
from ember.ir.backends import Backend, Runner
from ember.runtime.interop_torch.fx_export import to_fx

Compiled = Callable[[list[Any]], Sequence[Any]]


def signature(inputs: Sequence[Any]) -> tuple[Hashable, ...]:
    """What torch's compiled code is specialized to: per input its layout, or its value."""
    sig: list[Hashable] = [torch.is_grad_enabled()]
    for x in inputs:
        if isinstance(x, torch.Tensor):
            sig.append((tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad))
        else:
            sig.append((type(x), x))
    return tuple(sig)


class TorchInductorError(RuntimeError):
    """torch's inductor could not compile a graph (the reason is in the message)."""


def compile_graph(module: Module, graph: str | None, inputs: Sequence[Any]) -> Compiled:
    """torch inductor's compiled function for one graph, called with a list of inputs."""
    from torch._inductor import compile as inductor_compile  # heavy: only when first needed

    gm = to_fx(module, graph)
    fn = inductor_compile(gm, list(inputs))
    # "same behavior as gm": called with the arguments (its `_boxed_call`, copied from an inner
    # function by functools.wraps, does not describe the outer one)
    return lambda args: fn(*args)


def prepare(module: Module) -> Runner:
    to_fx(module)  # the main graph exports, or prepare fails now with the reason (ExportError)
    cache: dict[tuple[str, tuple[Hashable, ...]], Compiled] = {}
    failed: dict[str, str] = {}  # graph -> why torch's inductor could not take it

    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        g = module.graph(graph)
        if g.name in failed:
            raise TorchInductorError(failed[g.name])
        key = (g.name, signature(inputs))
        fn = cache.get(key)
        if fn is None:
            try:
                fn = cache[key] = compile_graph(module, g.name, inputs)
            except Exception as e:
                failed[g.name] = (f"torch's inductor cannot compile graph @{g.name}: "
                                  f"{type(e).__name__}: {' '.join(str(e).split())[:500]}")
                raise TorchInductorError(failed[g.name]) from e
        results = list(fn(list(inputs)))
        updated = dict(g.input_updates)
        outputs = [x for i, x in enumerate(results) if i not in updated.values()]
        return RunResult(outputs, {p: results[r] for p, r in updated.items()})

    return run


TORCH_INDUCTOR = Backend(
    "torch-inductor",
    "the aten graph exported to torch.fx and compiled by torch's own inductor (A/B reference)",
    prepare)
