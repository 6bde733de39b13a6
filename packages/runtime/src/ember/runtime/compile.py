"""`ember.runtime.compile`: the torch.compile contract over ember's capture.

A compiled function keeps a cache of entries, each a capture's generated guard check plus what
to run when it holds: the captured graph through a backend, or (when capture stopped at an
unsupported construct) the original function, eagerly (entries.py). A call runs the first entry
whose guards hold; a miss captures again (a recompilation, entries.py's `miss`), up to a cache
limit (default 8 per compiled function, i.e. per code object), after which the function runs
eagerly with one warning. This module holds the compiled function and module, and how a
backend turns a captured graph into what an entry runs.

The compiler is data: the inductor backend runs a pipeline string (default: the registered
pipeline `inductor`), and `options=` picks another pipeline, decomposition table, per-stage
verification and dumps (options.py); an unknown option or mode is a ValueError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import time
import types
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from torch import nn

import ember.inductor  # noqa: F401  (registers the IR backend "inductor")
from ember.autograd.partition import PartitionReport
from ember.autograd.vjp import VJPError
from ember.capture import graph_name, target_code
from ember.capture.modules import has_own_hooks
from ember.inductor.backend import pipeline_for
from ember.inductor.cache import STATS
from ember.inductor.kernels import PRELUDE_NAME, compiled_runner, load_module, summary
from ember.inductor.targets import scalar_inputs_to_device
from ember.inductor.targets import targets as inductor_targets
from ember.ir import Module, PrintError
from ember.ir.backends import BackendProtocol
from ember.ir.backends import Runner as IRRunner
from ember.ir.interpreter import SymbolAssertionError
from ember.ir.passes import expand_pipeline, run_pipeline
from ember.prims.decomp.context import DecompositionError
from ember.prims.decomp.random import draws
from ember.prims.decomp.table import active_table, using_decompositions
from ember.runtime import logs
from ember.runtime.backends import Backend, Runner, eager_backend, resolve
from ember.runtime.copying import (
    deepcopy_function,
    deepcopy_module,
    reduce_function,
    reduce_module,
    shallow_module,
)
from ember.runtime.cudagraphs import (
    CUDAGRAPH_MODES,
    CudaGraphs,
    auto_graph_reason,
    graph_info,
    moved_examples,
    moving,
)
from ember.runtime.distributed import (
    CompiledDDP,
    hooked_forward,
    is_ddp,
    run_with_hooks,
    split_training,
)
from ember.runtime.dump import (
    TrainingDump,
    dump_dir,
)
from ember.runtime.dynamic import DynamicPolicy
from ember.runtime.entries import Entry, miss
from ember.runtime.fallbacks import decompose_tables, interpreter_reason, missing_ops, record
from ember.runtime.history import Fallback, History
from ember.runtime.modview import compiled_module
from ember.runtime.options import DEFAULT_PIPELINE_NAME, check_options
from ember.runtime.training import (
    DEFAULT_PARTITIONER,
    GraphRunner,
    TrainingRunner,
    check_partitioner,
    interpreter_runner,
    load_training,
    needs_training,
    plan_training,
    store_training,
    training_cache_key,
)

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# backends that run training graphs as compiled forward/backward graphs (runtime/training.py)
TRAINING_BACKENDS = ("aot_eager", "inductor")


class CompiledFunction:
    """A function (or bound method, or module call) compiled by ember."""

    # called inside another compiled function, capture traces `target` (ember.capture.compiled)
    _ember_original: ClassVar[str] = "target"

    def __init__(self, target: Any, *, backend: str | BackendProtocol | Backend = "inductor",
                 fullgraph: bool = False, mode: str | None = None, dynamic: bool | None = None,
                 options: dict[str, Any] | None = None):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid modes: "
                             f"{', '.join(map(repr, MODES))}")
        rest = dict(options or {})
        part = rest.pop("partitioner", None)
        # option cudagraphs=False: the default mode records no CUDA graph (auto_graphs below)
        auto_graphs = rest.pop("cudagraphs", True)
        if not isinstance(auto_graphs, bool):
            raise ValueError(f"compile option cudagraphs must be a bool, not {auto_graphs!r}")
        # every backend is one of the protocol (ember.ir.backends); "inductor", "aot_eager"
        # and "eager" are wired here, the rest run under the same policy (_custom)
        spec, note = resolve(backend)
        self.spec = spec
        # a backend that is a pipeline runs under the inductor's policy (its options too)
        spec_pipeline = getattr(spec, "pipeline", None)
        self.pipelined = spec.name == "inductor" or bool(spec_pipeline)
        trains = spec.name in TRAINING_BACKENDS or bool(getattr(spec, "supports_training",
                                                                False))
        if part is not None and not trains:
            raise ValueError(f"compile option partitioner applies to the backends that "
                             f"compile training graphs ({', '.join(TRAINING_BACKENDS)} and "
                             f"backends with supports_training)")
        self.partitioner = DEFAULT_PARTITIONER if part is None else check_partitioner(part)
        self.opts = check_options(rest, inductor=self.pipelined)
        option_notes = self.opts.notes()
        if spec.name != "inductor" and self.pipelined and "pipeline" not in rest:
            pipeline = str(spec_pipeline)
            self.opts = dataclasses.replace(self.opts, pipeline=pipeline)
            option_notes.insert(0, f"backend {spec.name!r} runs the pipeline "
                                   f"{expand_pipeline(pipeline)} under the inductor's policy")
        # what a backend's prepare() is given as options: compile()'s, read-only
        self._backend_options = MappingProxyType(dict(options or {}))
        self._no_grad_results: set[int] = set()  # of the graph being compiled (write-backs)
        self.partitions: list[PartitionReport] = []  # one per training graph compiled
        self._args = (backend, options)  # for the compiled functions spawned at graph breaks
        self.target = target
        self.backend: Backend
        self.backend_name = spec.name
        if self.pipelined:
            self.backend = self._inductor
        elif spec.name == "aot_eager" and backend == "aot_eager":
            self.backend = self._aot_eager
        elif spec.name == "eager" and backend == "eager":
            self.backend = eager_backend
        else:
            self.backend = self._custom
        self.fullgraph = fullgraph
        self.mode = mode
        self.dynamic = dynamic
        self.options = dict(options or {})
        self.cache_limit = self.opts.cache_limit
        self.entries: list[Entry] = []
        self._hot: Entry | None = None  # the last one run
        self._last_compiled: Module | None = None  # set by _inductor, read by EMBER_DUMP
        self._last_stages: list[tuple[str, str]] = []  # (stage, module text): dump_each
        self._last_producer = ""  # what made _last_compiled, named in its dump's header
        self._last_training: list[TrainingDump] = []  # training graph pairs to dump (dump.py)
        self.history = History()
        self.code = target_code(target)
        self.name = graph_name(target)
        # the user's function, named in fallback warnings (resume functions share it)
        self._root = (getattr(target, "__qualname__", None) or type(target).__name__,
                      self.code.co_filename if self.code else "<unknown>",
                      self.code.co_firstlineno if self.code else 0)
        self._graph_no: int | None = None  # the number of the graph a backend is compiling
        self._gave_up = False
        # resume functions and callees compiled for graph breaks: id -> (object, compiled)
        self._spawned: dict[int, tuple[Any, CompiledFunction]] = {}
        self._child = False
        if isinstance(target, nn.Module):
            self.self_obj: Any = target
            self.eager: Callable[..., Any] = target
        else:
            self.self_obj = getattr(target, "__self__", None)
            self.eager = target
        if note:
            self.history.note(note)
        # mode="reduce-overhead"/"max-autotune": the inductor's graphs as CUDA graphs
        self._cudagraphs = CudaGraphs() if mode in CUDAGRAPH_MODES and self.pipelined else None
        # the default mode records them too where a replay saves more launch time than its
        # output copies cost (cudagraphs.auto_graph_reason; docs/runtime.md)
        self._auto_graphs = auto_graphs and mode in (None, "default") and self.pipelined
        self._auto_cudagraphs: CudaGraphs | None = None  # (one pool for those it records)
        self._capturing: Any = None  # the capture being compiled (cudagraphs.graph_info)
        if mode in CUDAGRAPH_MODES and not self.pipelined:
            self.history.note(f"mode {mode!r} records CUDA graphs of the inductor's compiled "
                              f"graphs only: backend {spec.name!r} runs as in the default mode")
        if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            self.history.note(f"mode {mode!r}: the CUDA target's kernels are autotuned "
                              f"(autotune-cuda after schedule-cuda); on other targets the "
                              f"pipeline {self.opts.pipeline} runs as in the default mode"
                              + (" (its graphs recorded as CUDA graphs)"
                                 if self._cudagraphs is not None else ""))
        self.dyn_policy = DynamicPolicy(dynamic)  # which dims captures make symbolic
        for n in option_notes:
            self.history.note(n)

    def _fallback(self, kind: str, reason: str, *, ops: tuple[str, ...] = (),
                  graph: int | None = None) -> None:
        """Record (and warn once per kind, and log) a fallback of the current graph."""
        qual, file, line = self._root
        record(self.history, Fallback(reason, file, line, (), kind,
                                      self._graph_no if graph is None else graph, ops), qual)

    def _missing(self, module: Module, e: Exception) -> tuple[str, ...]:
        """Every op of the graph without a decomposition, where `e` says one has none (the
        decompose pass stops at the first): the ops the pipeline's tables lack."""
        if not (isinstance(e, DecompositionError) and "no decomposition for" in str(e)):
            return ()
        o = self.opts
        default = o.decompositions if o.decompositions is not None else active_table()
        pipeline = o.pipeline if self.pipelined else "decompose"
        try:
            return tuple(missing_ops(module, decompose_tables(pipeline, default)))
        except Exception:  # the first op's name (in e) is still reported
            return ()

    def _eager_instead(self, module: Module, example_inputs: Sequence[Any]
                       ) -> Callable[..., Runner]:
        """`eager(kind, reason, ops)`: the eager backend's runner, noted and recorded as a
        fallback of that kind."""
        name = f"graph @{module.graph().name}"

        def eager(kind: str, reason: str, ops: tuple[str, ...] = ()) -> Runner:
            self.history.note(f"{name}: {reason}; the eager backend ran it")
            self._fallback(kind, reason, ops=ops)
            return eager_backend(module, example_inputs)

        return eager

    def _training(self, module: Module, example_inputs: Sequence[Any],
                  compile_graph: Callable[[Module], tuple[GraphRunner, str]], *,
                  no_grad: set[int] | None = None, split: bool = True) -> Runner:
        """A graph that records gradients: its joint graph partitioned into @forward and
        @backward, each compiled by `compile_graph` (-> runner, what it compiled to), behind a
        torch.autograd.Function (training.py). Where the joint graph cannot be built (an op
        without a VJP rule) the eager backend runs the graph: a "training" fallback. Inside
        DDP's forward, the graph is first cut at DDP's gradient buckets (distributed.py)."""
        if split:
            pieces = split_training(self, module, example_inputs, compile_graph)
            if pieces is not None:
                return pieces
        eager = self._eager_instead(module, example_inputs)
        o = self.opts
        dumping = (o.dump_dir or dump_dir()) is not None  # a dump needs the prims graph: no cache
        # the training compile cache (training.py): the inductor's own pipeline only
        key = training_cache_key(
            module, example_inputs, self._no_grad_results if no_grad is None else no_grad,
            self.partitioner, o.pipeline) if (
                compile_graph == self._inductor_graph and o.decompositions is None
                and not o.dump_each and not o.verify_each and not dumping) else None
        hit = load_training(key) if key else None
        try:
            if hit is not None:
                plan = hit[0]
                compiled = {id(plan.forward): hit[1], id(plan.backward): hit[2]}
                compile_graph = lambda m: self._inductor_graph(m, compiled[id(m)])  # noqa: E731
            else:
                plan = plan_training(module, example_inputs,
                                     self._no_grad_results if no_grad is None else no_grad,
                                     self.opts.decompositions, self.partitioner)
        except VJPError as e:
            m = re.search(r"no VJP rule for ([\w.]+)", str(e))
            return eager("training", f"the joint forward/backward graph cannot be built: {e}",
                         (m.group(1),) if m else ())
        except Exception as e:
            ops = self._missing(module, e)
            if ops:
                return eager("missing ops", f"no decomposition for {', '.join(ops)}", ops)
            return eager("backend", f"the joint forward/backward graph cannot be built: "
                         f"{type(e).__name__}: {e}")
        try:
            stages: dict[str, list[tuple[str, str]]] = {}
            fwd, fwd_what = compile_graph(plan.forward)
            stages["forward"], self._last_stages = self._last_stages, []
            bwd, bwd_what = compile_graph(plan.backward)
            stages["backward"], self._last_stages = self._last_stages, []
        except Exception as e:
            return eager("backend", f"backend {self.backend_name!r} cannot compile the "
                         f"training graphs: {type(e).__name__}: {e}")
        if dumping:  # each stage under its own name, with the first call's inputs and outputs
            td = TrainingDump("" if split else f"piece{len(self._last_training)}.", plan.prims,
                              plan.forward, plan.backward, stages, {
                                  w: r.__dict__["compiled"] for w, r in
                                  (("forward", fwd), ("backward", bwd))
                                  if "compiled" in r.__dict__}, self._last_producer)
            self._last_training.append(td)
            fwd, bwd = td.runner("forward", fwd), td.runner("backward", bwd)
        if key and hit is None:
            store_training(key, plan, fwd.__dict__["compiled"], bwd.__dict__["compiled"])
        self.history.note(f"graph @{module.graph().name}: training: backend "
                          f"{self.backend_name!r} runs its forward as {fwd_what} and its "
                          f"backward as {bwd_what}; {plan.report.text()}"
                          + ("; from the training compile cache" if hit is not None else ""))
        self.partitions.append(plan.report)
        return TrainingRunner(plan, fwd, bwd, len(example_inputs))

    def _aot_eager(self, module: Module, example_inputs: Sequence[Any]) -> Runner:
        """Backend "aot_eager": the graph decomposed to prims on the reference interpreter;
        a training graph as its partitioned @forward and @backward there."""
        if needs_training(example_inputs):
            def interpreted(m: Module) -> tuple[GraphRunner, str]:
                return interpreter_runner(m), "prims on the reference interpreter"

            return self._training(module, example_inputs, interpreted)
        table = self.opts.decompositions
        ctx = using_decompositions(table) if table is not None else contextlib.nullcontext()
        with ctx:
            prims = run_pipeline(module, "decompose,cse,dce")
        self.history.note(f"graph @{module.graph().name}: backend 'aot_eager' runs it as prims "
                          f"on the reference interpreter")
        return interpreter_runner(prims)

    def _inductor(self, module: Module, example_inputs: Sequence[Any]) -> Runner:
        """Backend "inductor": the graph compiled to C++ kernels, or (with a note and a
        fallback saying why) the eager backend where the inductor cannot run it."""
        name = f"graph @{module.graph().name}"
        eager = self._eager_instead(module, example_inputs)
        tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        devices = sorted({x.device.type for x in tensors} - set(inductor_targets()))
        if devices:
            return eager("device", f"{self._label} has no {'/'.join(devices)} code "
                         f"generation target registered (targets: "
                         f"{', '.join(sorted(inductor_targets()))}; cuda's needs a CUDA "
                         f"device and the triton package)")
        if needs_training(example_inputs):
            return self._training(module, example_inputs, self._inductor_graph)
        # 0-dim CPU inputs of a CUDA graph (eager's scalars; transformers 5.17's static cache
        # `cumulative_length`) compile on the device and are moved there per call
        scalars = scalar_inputs_to_device(module)
        source = scalars.module if scalars is not None else module
        try:
            compiled = self._run_pipeline(source)
        except Exception as e:
            ops = self._missing(module, e)
            if ops:
                return eager("missing ops", f"{self._label} cannot compile it: no "
                             f"decomposition for {', '.join(ops)}", ops)
            return eager("backend", f"{self._label} cannot compile it: "
                         f"{type(e).__name__}: {e}")
        self._last_compiled = compiled  # for EMBER_DUMP, next to the captured graph
        runner = compiled_runner(compiled, source)
        slow = interpreter_reason(compiled, module.graph().name)
        if slow:
            self._fallback("interpreter", slow)
        graphs = self._cudagraphs
        rand = draws(compiled.graph(module.graph().name))
        if graphs is None and self._auto_graphs and auto_graph_reason(
                moved_examples(scalars, module, example_inputs), compiled,
                module.graph().name, slow, rand) is None:  # (decided per graph)
            graphs = self._auto_cudagraphs = self._auto_cudagraphs or CudaGraphs()
        if graphs is not None:
            runner = graphs.wrap(self.history, runner, module.graph().name, self._graph_no,
                                 moved_examples(scalars, module, example_inputs),
                                 graph_info(self._capturing, example_inputs), slow,
                                 source.graph().params, rand)
        if scalars is not None:
            runner = moving(scalars, runner)
        compiled_code = "the inductor's compiled code" if self.backend_name == "inductor" \
            else f"the compiled code of backend {self.backend_name!r}"
        run = self._judged(module, example_inputs, runner, compiled_code)
        self.history.note(f"{name}: {self._label} compiled it to {summary(compiled)}")
        return run

    @property
    def _label(self) -> str:
        return "the inductor backend" if self.backend_name == "inductor" \
            else f"backend {self.backend_name!r}"

    def _judged(self, module: Module, example_inputs: Sequence[Any], runner: IRRunner,
                what: str) -> Runner:
        """`runner` on the graph, under the run-time fallback policy every backend gets: where
        it raises, the eager backend (the graph's aten ops) judges the error. Where eager
        raises too, the inputs are at fault (say an integer division by zero): its exception
        is eager PyTorch's, and the backend stays for the next call. Where it runs, the
        backend is at fault: the eager backend runs the graph from now on, with a note and a
        "runtime" fallback. Backends return input updates as results, so rerunning the graph
        on the same inputs is safe."""
        name = f"graph @{module.graph().name}"
        graph = module.graph().name
        graph_no = self._graph_no
        state: dict[str, Runner | None] = {"fallback": None, "reference": None}

        def run(inputs: Sequence[Any]) -> list[Any]:
            fb = state["fallback"]
            if fb is not None:
                return fb(inputs)
            try:
                return list(runner(graph, inputs).outputs)
            except Exception as e:
                ref = state["reference"]
                if ref is None:
                    ref = state["reference"] = eager_backend(module, example_inputs)
                outs = ref(inputs)
                why = f"{what} failed: {type(e).__name__}: {e}"
                self.history.note(f"{name}: {why}; the eager backend ran it")
                self._fallback("runtime", why, graph=graph_no)
                state["fallback"] = ref
                return outs

        return run

    def _custom(self, module: Module, example_inputs: Sequence[Any]) -> Runner:
        """A backend of the protocol other than ember's own: prepare() once per graph, under
        the policy of the built-ins: a prepare() that raises is a "backend" (or "missing ops")
        fallback to eager, a run that raises is judged by eager (_judged); a runner's
        `compiled` module is dumped as NAME.kernels.ir; explain() notes what ran the graph."""
        spec = self.spec
        name = f"graph @{module.graph().name}"
        options = self._backend_options
        if getattr(spec, "supports_training", False) and needs_training(example_inputs):
            def compile_graph(m: Module) -> tuple[GraphRunner, str]:
                r, g = spec.prepare(m, None, options), m.graph().name
                return (lambda inputs: list(r(g, inputs).outputs)), f"backend {spec.name!r}"

            return self._training(module, example_inputs, compile_graph)
        try:
            runner = spec.prepare(module, example_inputs, options)
        except Exception as e:
            ops = self._missing(module, e)
            why = f"no decomposition for {', '.join(ops)}" if ops else \
                f"backend {spec.name!r} failed: {type(e).__name__}: {e}"
            return self._eager_instead(module, example_inputs)(
                "missing ops" if ops else "backend", why, ops)
        compiled = getattr(runner, "compiled", None)
        if isinstance(compiled, Module):
            self._last_compiled = compiled
            self._last_producer = f"backend {spec.name}"
        self.history.note(f"{name}: backend {spec.name!r} ran it ({spec.summary})")
        return self._judged(module, example_inputs, runner, f"backend {spec.name!r}")

    def _inductor_graph(self, module: Module, compiled: Module | None = None
                        ) -> tuple[GraphRunner, str]:
        """One graph of a training pair (prims) through the inductor's pipeline (`compiled`:
        its pipeline's output from the training compile cache; only its C++ is loaded)."""
        if compiled is None:
            compiled = self._run_pipeline(module)
        elif compiled.kernels:
            load_module(compiled)
        runner = compiled_runner(compiled)
        graph = module.graph().name
        slow = interpreter_reason(compiled, graph)
        if slow:
            self._fallback("interpreter", f"@{graph}: {slow}")

        def run(inputs: Sequence[Any]) -> list[Any]:
            return list(runner(graph, inputs).outputs)

        run.__dict__["compiled"] = compiled  # what the training compile cache stores
        return run, summary(compiled)

    def _run_pipeline(self, module: Module) -> Module:
        """The inductor's pipeline (options pipeline, decompositions, verify_each, dump_each)
        over the captured graph; its C++ built (or found in the kernel cache)."""
        o = self.opts
        stages: list[tuple[str, str]] = []
        timed = logs.pipeline.isEnabledFor(logging.INFO)
        times: list[tuple[str, float]] = []
        clock = [time.perf_counter()]

        def after(stage: str, m: Module) -> None:
            if timed:
                times.append((stage, time.perf_counter() - clock[0]))
            if o.dump_each:
                try:
                    stages.append((stage, str(m)))
                except PrintError as e:  # a dump is a note, never the reason a compile fails
                    stages.append((stage, f"# cannot print the module: {e}\n"))
            clock[0] = time.perf_counter()  # printing for a dump is not the pass's time

        table = using_decompositions(o.decompositions) if o.decompositions is not None \
            else contextlib.nullcontext()
        start = time.perf_counter()
        pipeline = pipeline_for(module, o.pipeline)
        tuning: Any = contextlib.nullcontext([])
        if self.mode in CUDAGRAPH_MODES and o.pipeline == DEFAULT_PIPELINE_NAME:
            # one-row products as Triton GEMVs: faster on the device, but their launches cost
            # host time that only a CUDA graph's replay does not pay (gemv.py)
            from ember.inductor.targets.cuda.gemv import with_decode_gemv
            pipeline = with_decode_gemv(pipeline)
        if self.mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            from ember.inductor.targets.cuda.autotune import collecting, with_autotune
            pipeline = with_autotune(pipeline)  # the CUDA target's: tuned schedules
            tuning = collecting()
        self._last_producer = f"pipeline {expand_pipeline(pipeline)}"
        with table, tuning as tuned:
            out = run_pipeline(module, pipeline,
                               verify_each=o.verify_each,
                               print_after=after if o.dump_each or timed else None)
        for rep in tuned:  # explain() shows the tuning time and the choices
            self.history.note(f"{self._graph_label(module)}: {rep.summary()}")
        if timed:
            logs.pipeline.info("%s: pipeline %s: %s; total %.1f ms", self._graph_label(module),
                               o.pipeline, ", ".join(f"{st} {t * 1e3:.1f} ms" for st, t in times),
                               (time.perf_counter() - start) * 1e3)
        if out.kernels:
            hits, builds = STATS.hits, STATS.builds
            load_module(out)
            if logs.kernels.isEnabledFor(logging.INFO):
                ks = [k for k in out.kernels if k != PRELUDE_NAME]
                logs.kernels.info("%s: %d kernel(s) %s; C++ units: %d from the kernel cache, "
                                  "%d compiled, the rest already loaded in this process",
                                  self._graph_label(module), len(ks),
                                  ", ".join("@" + k for k in ks), STATS.hits - hits,
                                  STATS.builds - builds)
        elif logs.kernels.isEnabledFor(logging.INFO):
            logs.kernels.info("%s: no kernels generated", self._graph_label(module))
        self._last_stages = stages
        return out

    def _graph_label(self, module: Module) -> str:
        no = "" if self._graph_no is None else f"graph {self._graph_no} "
        return f"{self._root[0]}: {no}@{module.graph().name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        """`@compile` on a method in a class body: bound to the instance as a function is (the
        instance is the first argument, guarded like any other)."""
        return self if obj is None else types.MethodType(self, obj)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledFunction:
        new: CompiledFunction = deepcopy_function(self, memo)  # nothing compiled yet
        return new

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce_function(self)  # the target and the settings: compiled again on load

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        S = self.self_obj
        self.history.calls += 1
        # the entry the last call ran first (a decode loop runs one entry every step: the
        # other entries' failing checks are not paid per step), then all in order
        hot = self._hot
        for e in (self.entries if hot is None else (hot, *self.entries)):
            inputs = e.code.guard(S, args, kwargs)
            if inputs.__class__ is list and e.matches(inputs):
                self.history.cache_hits += 1
                self._hot = e
                try:
                    return e.run(S, args, kwargs, inputs)
                except SymbolAssertionError as err:
                    return self._assert_failed(err, args, kwargs)
        return miss(self, args, kwargs)

    def _assert_failed(self, err: SymbolAssertionError, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
        """A value `.item()` read broke what the graph assumed of it (`u0 <= 10` where it
        bounds a slice): nothing was written yet, so this call runs eagerly (eager's result,
        or eager's error for a value eager refuses too); later calls still try the graph."""
        self.history.note(f"{err}; this call ran eagerly")
        return self.eager(*args, **kwargs)

    # -- graph breaks -----------------------------------------------------------------------
    def _spawn(self, target: Any) -> CompiledFunction:
        """A compiled function for a resume function or a callee: this one's backend and
        options, and its history (so `explain` reports every graph and break)."""
        backend, options = self._args
        cf = CompiledFunction(target, backend=backend, mode=self.mode, dynamic=self.dynamic,
                              options=options)
        # (with "inductor", the child's own inductor backend: it records the child's compiled
        # module, so EMBER_DUMP writes NAME.kernels.ir for resume functions too)
        cf.history = self.history
        cf._root = self._root  # warnings and logs name the user's function
        cf._spawned = self._spawned
        cf._child = True
        return cf

    def child(self, fn: Any) -> CompiledFunction:
        """The compiled resume function `fn` (one per function object, shared by all entries)."""
        got = self._spawned.get(id(fn))
        if got is None or got[0] is not fn:
            got = self._spawned[id(fn)] = (fn, self._spawn(fn))
        return got[1]

    def callee(self, obj: Any) -> Any:
        """`obj` (a user function or module whose body broke) through ember's compile wrapper;
        a module keeps its `__call__`, so the wrapper runs the module's capture."""
        return self.child(obj)


class CompiledModule(nn.Module):
    """A module compiled by ember: it holds the original as `_orig_mod` (so parameters, buffers
    and state are shared) and runs its calls through the compiled function."""

    # a submodule of another compiled model: capture traces `_orig_mod` (ember.capture.compiled)
    _ember_original: ClassVar[str] = "_orig_mod"

    def __init__(self, mod: nn.Module, compiled: CompiledFunction):
        nn.Module.__init__(self)  # (not super(): modview's subclass has the model class next)
        self._orig_mod = mod
        object.__setattr__(self, "_ember_compiled", compiled)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod: Any = self._modules["_orig_mod"]
        if has_own_hooks(mod):  # (FSDP2's) run as nn.Module.__call__ runs them, eagerly
            return run_with_hooks(mod, self._hooked_body(), args, kwargs)
        return self._ember_compiled(*args, **kwargs)

    def _hooked_body(self) -> CompiledFunction:
        """The module's forward alone, compiled like the module (its hooks run around it)."""
        body = self.__dict__.get("_ember_body")
        if body is None:
            cf = self._ember_compiled
            orig: Any = self._modules["_orig_mod"]
            body = CompiledFunction(hooked_forward(orig),
                                    backend=cf._args[0], fullgraph=cf.fullgraph, mode=cf.mode,
                                    dynamic=cf.dynamic, options=cf._args[1])
            body.history = cf.history  # one history: explain shows both
            object.__setattr__(self, "_ember_body", body)
        return body

    @property
    def compiled(self) -> CompiledFunction:
        return self._ember_compiled  # type: ignore[no-any-return]

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return deepcopy_module(self, memo)  # the original's copy, compiled afresh (copying.py)

    def __copy__(self) -> Any:
        return shallow_module(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce_module(self)  # pickled: the original and the settings (copying.py)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)


def compile(model_or_fn: Any = None, *, mode: str | None = None, dynamic: bool | None = None,
            fullgraph: bool = False, backend: str | BackendProtocol | Backend = "inductor",
            options: dict[str, Any] | None = None) -> Any:
    """Compile a function or an nn.Module with ember (the torch.compile contract).

    Modules come back as a module sharing the original's parameters; functions as a callable.
    Without `model_or_fn`, returns a decorator.
    """
    def make(target: Any) -> Any:
        if is_ddp(target):  # DDP's forward as it is, the module it wraps compiled
            return CompiledDDP(target, make(target.module))
        cf = CompiledFunction(target, backend=backend, fullgraph=fullgraph, mode=mode,
                              dynamic=dynamic, options=options)
        if isinstance(target, nn.Module):
            # the compiled module's own nn.Module call runs the global hooks: a call run
            # eagerly inside it runs the forward alone, so each hook fires once, as in eager
            # (a class with its own __call__ keeps it: what it does is more than the hooks)
            if type(target).__call__ is nn.Module.__call__:
                cf.eager = functools.partial(_forward_of, target)
            return compiled_module(CompiledModule, target, cf)  # the model's class too
        try:
            functools.update_wrapper(cf, target)
        except AttributeError:
            pass
        return cf

    if model_or_fn is None:
        return make
    if not callable(model_or_fn):
        raise TypeError(f"compile() takes a function or an nn.Module, not "
                        f"{type(model_or_fn).__name__}")
    return make(model_or_fn)


def _forward_of(mod: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The module's forward (an instance attribute `forward` included), without its hooks."""
    return mod.forward(*args, **kwargs)


def compiled_function_of(obj: Any) -> CompiledFunction | None:
    if isinstance(obj, CompiledFunction):
        return obj
    if isinstance(obj, CompiledModule):
        cf: CompiledFunction = obj.compiled  # (mypy applies CompiledFunction.__get__ here)
        return cf
    if isinstance(obj, CompiledDDP):
        return compiled_function_of(obj._ember_inner)
    func = obj.__func__ if isinstance(obj, types.MethodType) else None
    if isinstance(func, CompiledFunction):
        return func  # a compiled method, bound to an instance
    return None

