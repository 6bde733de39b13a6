"""A compiled function's cache entries, and what a call that no entry matches (a miss) does.

An entry is a capture's generated guard check plus what to run when it holds: the captured
graph through the backend (`GraphEntry`), the original function eagerly where capture stopped
at an unsupported construct (`EagerEntry`), or the graph up to a graph break and the break
(breaks.py's `BreakEntry`). A miss names the failing guard of the last entry (a
recompilation, explain()'s reason), gives up at the cache limit (the function runs eagerly
from then on, one "cache limit" fallback), and otherwise captures again, compiles the graph
(ops with effects outside the graph allowed: the user's own code called them), records and
dumps it, adds the entry and runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import Captured, Unhandled, capture, describe
from ember.capture.resume import Broken
from ember.ir import Module
from ember.ir.effects import allow_effects
from ember.ir.interpreter import SymbolAssertionError
from ember.ir.registry import default_registry
from ember.runtime import logs
from ember.runtime.backends import Backend, Runner, eager_backend
from ember.runtime.breaks import BreakEntry, run_with_effects
from ember.runtime.dump import dump_capture, dump_compiled, dump_outputs, dump_stages
from ember.runtime.fallbacks import record
from ember.runtime.guards import CallCode
from ember.runtime.history import Fallback, GraphRecord
from ember.runtime.training import needs_training
from ember.runtime.writeback import Epilogue, backend_module

if TYPE_CHECKING:
    from ember.runtime.compile import CompiledFunction


class CaptureError(RuntimeError):
    """fullgraph=True and capture met a construct it does not cover."""

    def __init__(self, unhandled: Unhandled):
        super().__init__(f"ember could not capture the whole function: {unhandled.reason} "
                         f"at {unhandled.where}")
        self.unhandled = unhandled


class GraphEntry:
    def __init__(self, cap: Captured, runner: Runner):
        self.code = CallCode(cap.guards, cap.input_sources, cap.output)
        self.runner = runner
        self.captured = cap
        self.epilogue = Epilogue(cap)  # input write-back, outputs as eager's (views, strides)
        self.matches = self.epilogue.matches
        self.mutated = [u.param for u in cap.updates]

    def feed(self, inputs: list[Any]) -> list[Any]:
        """The inputs the graph runs on. Where autograd records the call, a mutated input
        (BatchNorm's running stats) is passed as a clone: autograd may save what the graph
        read, and the write-back into the caller's tensor must not bump the version of a
        tensor autograd saved (eager's in-place update happens after its op saved a copy)."""
        if not self.mutated or not needs_training(inputs):
            return inputs
        out = list(inputs)
        for p in self.mutated:
            if isinstance(out[p], torch.Tensor):
                out[p] = out[p].clone()
        return out

    def run(self, S: Any, A: tuple[Any, ...], K: dict[str, Any], inputs: list[Any]) -> Any:
        outs = self.runner(self.feed(inputs))
        return self.resume(outs, S, A, K, inputs)

    def resume(self, outs: list[Any], S: Any, A: tuple[Any, ...], K: dict[str, Any],
               inputs: list[Any]) -> Any:
        """The caller's return value from the graph's results (and side effects applied)."""
        results = self.epilogue(outs, inputs)
        if self.captured.effects:
            return run_with_effects(self.code, self.captured, results, S, A, K)
        assert self.code.output is not None
        return self.code.output(results, S, A, K)


class EagerEntry:
    def __init__(self, unhandled: Unhandled, call: Callable[..., Any]):
        self.code = CallCode(list(unhandled.guards), [], None)
        self.call = call
        self.unhandled = unhandled

    def matches(self, inputs: list[Any]) -> bool:
        return True

    def run(self, S: Any, A: tuple[Any, ...], K: dict[str, Any], inputs: list[Any]) -> Any:
        return self.call(*A, **K)


Entry = GraphEntry | EagerEntry | BreakEntry


def miss(cf: CompiledFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call no entry of `cf` matched (the module docstring says what it does)."""
    S = cf.self_obj
    if cf._gave_up:
        return cf.eager(*args, **kwargs)
    if cf.entries:
        reasons = [r for e in cf.entries if (r := e.code.failure(S, args, kwargs))]
        reason = reasons[-1] if reasons else "no cache entry matched"
        if len(cf.entries) >= cf.cache_limit:
            cf._gave_up = True
            msg = (f"{cf.name} was recompiled {cf.cache_limit} times (the cache "
                   f"limit); it runs eagerly from now on. Last reason: {reason}")
            cf.history.note("ember: " + msg)
            cf._fallback("cache limit", msg, graph=None)
            return cf.eager(*args, **kwargs)
        cf.history.recompilations.append(reason)
        if logs.recompiles.isEnabledFor(logging.INFO):
            logs.recompiles.info("recompiling %s (%s:%d): %s", cf._root[0], *cf._root[1:],
                                 reason)
    got = capture(cf.target, args, kwargs, dynamic=cf.dyn_policy)
    if isinstance(got, Captured):  # later sizes are compared with these (automatic dynamic)
        for src, x in zip(got.input_sources, got.input_examples, strict=True):
            cf.dyn_policy.observe(describe(src), x)
    brk = got if isinstance(got, Broken) else None
    res: Captured | Unhandled
    if brk is not None:  # the graph up to a graph break, then the break and a resume
        if cf.fullgraph:
            raise CaptureError(brk.unhandled)
        u = brk.unhandled
        cf.history.breaks.append(Fallback(u.reason, u.file, u.line, u.stack))
        if logs.graph_breaks.isEnabledFor(logging.INFO):
            via = "".join(f"\n  via {s}" for s in u.stack) \
                if logs.graph_breaks.isEnabledFor(logging.DEBUG) else ""
            logs.graph_breaks.info("graph break in %s at %s:%d: %s%s", cf._root[0],
                                   u.file, u.line, u.reason, via)
        res = brk.captured
    else:
        assert not isinstance(got, Broken)
        res = got
    if isinstance(res, Unhandled):
        if cf.fullgraph:
            raise CaptureError(res)
        record(cf.history, Fallback(res.reason, res.file, res.line, res.stack),
               cf._root[0])
        entry: Entry = EagerEntry(res, cf.eager)
        cf.entries.append(entry)
        return entry.run(S, args, kwargs, [])
    # nothing captured before a break, or in a resume function: no graph to speak of
    empty = (brk is not None or cf._child) and not res.graph.nodes
    backend = eager_backend if empty else cf.backend
    cf._last_compiled, cf._last_stages, cf._last_producer = None, [], ""
    cf._last_training = []
    cf._graph_no = None if empty else len(cf.history.graphs)
    cf._no_grad_results = {u.result for u in res.updates if not u.grad}
    cf._capturing = res
    runner = compile_graph(cf, backend, backend_module(res), res.input_examples)
    cf._capturing = None  # (it holds the first call's inputs)
    graph_entry = GraphEntry(res, runner) if brk is None else BreakEntry(
        brk, runner, [cf.child(r) for r in brk.resumes], cf.callee)
    cf.entries.append(graph_entry)
    inputs = graph_entry.code.guard(S, args, kwargs)
    if not isinstance(inputs, list):
        raise RuntimeError(f"ember: the guards of a fresh capture of {cf.name} fail on "
                           f"the call that produced them: "
                           f"{graph_entry.code.failure(S, args, kwargs)}")
    dumped = None if empty else dump_capture(res, inputs, cf.opts.dump_dir)
    if dumped is not None and cf._last_compiled is not None:
        dump_compiled(dumped, cf._last_compiled, res.graph, cf._last_producer)
    if dumped is not None and cf._last_stages:
        dump_stages(dumped, cf._last_stages, cf._last_producer)
    for td in cf._last_training:
        if dumped is not None:
            td.write(dumped)
    if not empty:
        cf.history.graphs.append(GraphRecord(
            res.graph.name, str(res.module), res.op_counts, [g.text() for g in res.guards],
            [describe(s) for s in res.input_sources], str(dumped) if dumped else None))
        if logs.guards.isEnabledFor(logging.INFO):
            g = cf.history.graphs[-1]
            logs.guards.info("%s: graph %d @%s: %d guard(s)%s", cf._root[0],
                             len(cf.history.graphs) - 1, g.name, len(g.guards),
                             "".join(f"\n  {t}" for t in g.guards))
    try:
        outs = runner(graph_entry.feed(inputs) if isinstance(graph_entry, GraphEntry)
                      else inputs)
    except SymbolAssertionError as err:
        return cf._assert_failed(err, args, kwargs)
    if dumped is not None:
        dump_outputs(dumped, outs, res.graph)
    return graph_entry.resume(outs, S, args, kwargs, inputs)


def compile_graph(cf: CompiledFunction, backend: Backend, module: Module,
                  examples: Sequence[Any]) -> Runner:
    """The backend's runner for a captured graph. Ops with effects outside the graph (a
    custom op taking unreviewed text, say) are allowed here: a captured graph holds only
    operators the user's own code called, as eager would (IR files need --allow-effects)."""
    if not has_effects(module):
        return _prepare_graph(cf, backend, module, examples)
    with allow_effects():
        runner = _prepare_graph(cf, backend, module, examples)

    def run(inputs: Sequence[Any]) -> list[Any]:
        with allow_effects():
            return runner(inputs)

    return run


def _prepare_graph(cf: CompiledFunction, backend: Backend, module: Module,
                   examples: Sequence[Any]) -> Runner:
    """The backend's runner for a captured graph; where a backend other than ember's
    inductor (which handles its own) raises, the eager backend's, as a fallback."""
    if backend is cf.backend and not cf.pipelined:
        try:
            return backend(module, examples)
        except Exception as e:
            ops = cf._missing(module, e)
            why = f"no decomposition for {', '.join(ops)}" if ops else \
                f"backend {cf.backend_name!r} failed: {type(e).__name__}: {e}"
            cf.history.note(f"graph @{module.graph().name}: {why}; the eager backend ran it")
            cf._fallback("missing ops" if ops else "backend", why, ops=ops)
            return eager_backend(module, examples)
    return backend(module, examples)


def has_effects(module: Module) -> bool:
    """Whether a captured graph calls an op with effects outside the graph (effects.py)."""
    reg = default_registry()
    for g in module.graphs.values():
        for n in g.nodes:
            d = reg.lookup(n.op)
            if d is not None and d.effect is not None:
                return True
    return False


__all__ = ["CaptureError", "EagerEntry", "Entry", "GraphEntry", "compile_graph", "has_effects",
           "miss"]
