"""Training through compile(): the captured graph's joint forward/backward, compiled, behind a
`torch.autograd.Function` (AOTAutograd's runtime wrapper).

`plan_training` decomposes the captured aten graph to prims (with `detach`, which is also what
capture records for values computed under `torch.no_grad()`, kept as a stop-gradient marker),
builds the joint graph for the inputs that require grad and the results eager would give a
grad_fn, and partitions it (`partitioner`: save-all, recompute-all, min-cut) into @forward and
@backward. A backend compiles each (aot_eager: the reference interpreter; inductor: its
pipeline, so the backward is one more prims graph) and `TrainingRunner` runs them:

- forward: the compiled @forward on the inputs; its last `saved` results are kept for the
  backward (`save_for_backward`, so autograd's version checks guard them), its other results
  are the graph's, those without a cotangent marked non-differentiable (integer results,
  results computed only from inputs without grad or through detach, running-stat updates);
- backward: the compiled @backward on the saved values and one cotangent per differentiable
  result (autograd gives zeros for results the loss does not use), giving the gradients of the
  inputs that require grad; autograd accumulates them into `.grad` as for any op;
- random draws are in @forward only and the draw itself is saved (never recomputed), so the
  backward sees the forward's dropout mask;
- double backward (`create_graph=True`) is refused with a clear error: the compiled backward is
  not itself differentiable.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ember.autograd.joint import joint_graph, partition_joint, requires_grad_values
from ember.autograd.layout import channels_last_saved
from ember.autograd.partition import POLICIES, PartitionReport
from ember.autograd.stop import strip_stop_gradients, training_table
from ember.inductor.wrapper import BoxedInputs
from ember.ir import Interpreter, Module, parse
from ember.ir.passes import run_pipeline
from ember.prims.decomp.random import PhiloxOffsets, run_drawing
from ember.prims.decomp.table import DecompositionTable, active_table, using_decompositions

DOUBLE_BACKWARD = "ember: double backward through a compiled graph is not supported"
DEFAULT_PARTITIONER = "min-cut"
GraphRunner = Callable[[Sequence[Any]], list[Any]]


def needs_training(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph called with these inputs must record gradients (what eager would)."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


@dataclass
class TrainingPlan:
    forward: Module  # one graph, @forward: the graph's results, then `saved` values
    backward: Module  # one graph, @backward(saved.., cotangents..) -> input gradients
    n_results: int
    tangents: list[int]  # results that get a cotangent
    grad_inputs: list[int]  # inputs that get a gradient
    n_saved: int
    report: PartitionReport
    notes: list[str] = field(default_factory=list)
    prims: Module | None = None  # the decomposed captured graph (a training dump writes it)


def _only(module: Module, graph: Any) -> Module:
    out = module.clone()
    out.items.clear()
    out.items[graph.name] = graph
    return out


def plan_training(module: Module, example_inputs: Sequence[Any], no_grad_results: set[int],
                  table: DecompositionTable | None = None,
                  partitioner: str = DEFAULT_PARTITIONER) -> TrainingPlan:
    """The partitioned forward/backward of a captured (aten) graph. `no_grad_results`: results
    eager computes outside autograd (running-stat updates). Raises VJPError where an op has no
    VJP rule, DecompositionError where one has no decomposition."""
    with using_decompositions(training_table(table or active_table())):
        # torch's fused attention, CPU and CUDA forms, stays one op forward and backward
        prims = run_pipeline(module, "decompose{keep_attention=true,keep_cuda_attention=true},"
                                     "cse,dce")
    g = prims.graph()
    wrt = _grad_inputs(example_inputs)
    rg = requires_grad_values(g, wrt)
    tangents = [i for i, o in enumerate(g.outputs) if o in rg and i not in no_grad_results]
    joint = joint_graph(prims, inputs=wrt, outputs=tangents)
    fwd, bwd, report = partition_joint(prims, joint, partitioner)
    strip_stop_gradients(fwd)
    strip_stop_gradients(bwd)
    channels_last_saved(fwd, bwd)  # CPU convolution outputs saved NHWC (autograd/layout.py)
    return TrainingPlan(_only(prims, fwd), _only(prims, bwd), len(g.outputs), tangents, wrt,
                        len(fwd.outputs) - len(g.outputs), report, prims=prims)


# ---- the training compile cache ----------------------------------------------------------------
# A warm compile of a training graph (a new process, or a new compiled object) would otherwise
# decompose, differentiate and partition it and run both graphs through the target's pipeline
# again: only the C++ came from the kernel cache. The cache keeps the outcome per captured graph:
# the plan and the two compiled (kernels.*) modules as ir-v1 text, parsed on a hit (text only,
# never unpickled), in the kernel cache's private directory. The key covers the captured graph's
# text, the inputs that get gradients, the partitioner, the pipeline, the versions and the CPU, and
# a digest of ember's own compiler source, so an edit to any pass is a miss, not a stale hit.
TRAINING_CACHE_FORMAT = 1


@functools.cache
def _code_digest() -> str:
    import ember.autograd
    import ember.inductor
    import ember.ir
    import ember.prims
    import ember.runtime

    h = hashlib.sha256()
    for pkg in (ember.ir, ember.prims, ember.autograd, ember.inductor, ember.runtime):
        root = Path(str(pkg.__file__)).parent
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _fn_id(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    body = hashlib.sha256(code.co_code).hexdigest()[:12] if code is not None else ""
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}" \
        f":{body}"


def _rules_digest() -> str:
    """The VJP rules and decompositions in force: a rule replaced at run time (a plugin, a test's
    monkeypatch) changes the key even where no source file changed."""
    from ember.autograd.vjp import VJP_RULES

    table = active_table()
    h = hashlib.sha256()
    for op in sorted(VJP_RULES):
        h.update(f"{op}={_fn_id(VJP_RULES[op])};".encode())
    for op in sorted(table.ops()):
        h.update(f"{op}={_fn_id(table.get(op))};".encode())
    return h.hexdigest()


def _grad_inputs(example_inputs: Sequence[Any]) -> list[int]:
    return [i for i, x in enumerate(example_inputs)
            if isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()]


def training_cache_key(module: Module, example_inputs: Sequence[Any],
                       no_grad_results: set[int], partitioner: str, pipeline: str
                       ) -> str | None:
    """The cache key of a training compile (None: the graph cannot be printed)."""
    from ember.inductor.cache import cpu_id, versions

    try:
        text = str(module)
    except Exception:  # a graph the printer refuses is compiled, just not cached
        return None
    h = hashlib.sha256()
    for part in (str(TRAINING_CACHE_FORMAT), _code_digest(), _rules_digest(), versions(), cpu_id(),
                 str(torch.get_num_threads()), pipeline, partitioner,
                 repr(sorted(no_grad_results)), repr(_grad_inputs(example_inputs)), text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _entry(key: str) -> Path:
    from ember.inductor.cache import cache_dir

    return cache_dir() / f"{key}.training.json"


def load_training(key: str) -> tuple[TrainingPlan, Module, Module] | None:
    """The cached plan and its compiled @forward/@backward modules (also the plan's), or None (a
    miss; an entry that is not the user's own private file, or does not parse, is a miss too)."""
    from ember.inductor.cache import file_distrust

    path = _entry(key)
    if not path.exists() or file_distrust(path) is not None:
        return None
    try:
        e = json.loads(path.read_text())
        p = e["plan"]
        fwd, bwd = parse(e["forward"]), parse(e["backward"])
        # the plan's graphs are the compiled ones (same graph names): the prims graphs are
        # not needed once compiled, and parsing them again would cost half the hit
        plan = TrainingPlan(fwd, bwd, int(p["n_results"]), [int(i) for i in p["tangents"]],
                            [int(i) for i in p["grad_inputs"]], int(p["n_saved"]),
                            PartitionReport(**p["report"]))
        return plan, fwd, bwd
    except Exception:  # a damaged entry: compiled again (and stored over)
        return None


def store_training(key: str, plan: TrainingPlan, forward: Module, backward: Module) -> None:
    """Store a training compile (written to a temporary file, then moved into place)."""
    from ember.inductor.cache import atomic_write

    try:
        data = json.dumps({
            "plan": {"n_results": plan.n_results, "tangents": plan.tangents,
                     "grad_inputs": plan.grad_inputs, "n_saved": plan.n_saved,
                     "report": dataclasses.asdict(plan.report)},
            "forward": str(forward), "backward": str(backward)})
        atomic_write(_entry(key), data.encode())
    except Exception:  # an unwritable cache costs the next warm compile, never this one
        return


def interpreter_runner(module: Module) -> GraphRunner:
    """A prims graph on the reference interpreter; random draws from torch's seed with a philox
    offset advancing from call to call (as the inductor's runner does)."""
    interp = Interpreter(module, check_types=False)
    graph = module.graph().name
    offsets = PhiloxOffsets()

    def run(inputs: Sequence[Any]) -> list[Any]:
        return list(run_drawing(interp, graph, inputs, offsets).outputs)

    return run


class _Step(torch.autograd.Function):
    # (its Python runs on every training step: ~10-25 us per step were spent here on set and
    # list building over all inputs and saved values; what is the same every step is in the
    # runner, and the per-result fixes below touch the inputs only for a tensor result)
    @staticmethod
    def forward(ctx: Any, runner: TrainingRunner, *inputs: Any) -> Any:
        n = runner.n_results
        outs = runner.forward(list(inputs))
        res = outs[:n]
        ids: set[int] | None = None
        for i, o in enumerate(res):
            if not isinstance(o, torch.Tensor):
                continue
            if ids is None:
                ids = {id(x) for x in inputs}
            # an input returned as is would make autograd treat the result as that input
            if id(o) in ids:
                res[i] = o.clone()
            # a result that views a buffer of the graph's own (a reused one): returned as a
            # view, autograd would refuse the caller's in-place op on it (`out += 1`)
            elif o._base is not None and id(o._base) not in ids:
                res[i] = o.detach()
        ctx.runner = runner
        saved = outs[n:]
        if all(isinstance(s, torch.Tensor) for s in saved):
            ctx.others = None  # (the usual case: every saved value is a tensor)
            ctx.save_for_backward(*saved)
        else:
            ctx.others = [None if isinstance(s, torch.Tensor) else s for s in saved]
            ctx.save_for_backward(*[s for s in saved if isinstance(s, torch.Tensor)])
        if runner.constant:
            ctx.mark_non_differentiable(*[o for i, o in enumerate(res) if i in runner.constant
                                          and isinstance(o, torch.Tensor)])
        return tuple(res)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        if torch.is_grad_enabled():
            raise RuntimeError(DOUBLE_BACKWARD)
        runner: TrainingRunner = ctx.runner
        others = ctx.others
        if others is None:
            args = BoxedInputs(ctx.saved_tensors)
        else:
            it = iter(ctx.saved_tensors)
            args = BoxedInputs(next(it) if o is None else o for o in others)
            del it
        for i in runner.plan.tangents:
            g = grads[i]
            args.append(g.contiguous() if isinstance(g, torch.Tensor) else g)
        # the compiled backward owns the saved tensors now (boxed inputs, freed after their
        # last use): autograd's copies go unless the graph is retained for another backward
        ctx.maybe_clear_saved_tensors()
        got = runner.backward(args)
        out: list[Any] = [None] * (1 + runner.n_inputs)
        for i, gr in zip(runner.plan.grad_inputs, got, strict=True):
            out[1 + i] = gr
        return tuple(out)


class TrainingRunner:
    """Runs a TrainingPlan's compiled graphs under autograd (a Runner for compile())."""

    def __init__(self, plan: TrainingPlan, forward: GraphRunner, backward: GraphRunner,
                 n_inputs: int):
        self.plan, self.forward, self.backward, self.n_inputs = plan, forward, backward, \
            n_inputs
        self.n_results = plan.n_results
        # results without a cotangent: marked non-differentiable
        self.constant = frozenset(range(plan.n_results)) - frozenset(plan.tangents)

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        return list(_Step.apply(self, *inputs))


def check_partitioner(value: Any) -> str:
    if value not in POLICIES:
        raise ValueError(f"option partitioner must be one of {', '.join(POLICIES)}, not "
                         f"{value!r}")
    return str(value)
