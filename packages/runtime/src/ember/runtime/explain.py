"""`ember.runtime.explain(fn, *args, **kwargs)`: what ember did with a function.

Compiles `fn` with the eager backend (or reads an already compiled function's history), calls
it with the arguments, and reports the graphs (ir-v1 text) with their op counts, guards and
inputs; every graph break with its reason and source line (the graphs of resume functions and
of callees compiled at a break are listed with the rest); the recompilations and why; every
fallback (a graph or call that did not run through the requested backend: capture, training,
device, missing ops, backend, runtime, interpreter, cache limit) with its kind, graph, reason and
source line, counted per kind in the summary line; and notes (such as a requested backend that
is not built yet). `str(report)` is readable.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.runtime.compile import compile, compiled_function_of
from ember.runtime.history import (
    CudaGraphRecord,
    Fallback,
    GraphRecord,
    History,
    fallback_summary,
)


@dataclass
class ExplainReport:
    graphs: list[GraphRecord] = field(default_factory=list)
    recompilations: list[str] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    calls: int = 0
    breaks: list[Fallback] = field(default_factory=list)  # graph breaks: reason and line
    # mode="reduce-overhead": each compiled graph's CUDA-graph recordings (runtime/cudagraphs.py)
    cuda_graphs: list[CudaGraphRecord] = field(default_factory=list)

    @property
    def recordings(self) -> int:
        return sum(r.recordings for r in self.cuda_graphs)

    @property
    def replays(self) -> int:
        return sum(r.replays for r in self.cuda_graphs)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_texts(self) -> list[str]:
        return [g.ir for g in self.graphs]

    @property
    def op_counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for g in self.graphs:
            total.update(g.op_counts)
        return total

    @property
    def fallback_summary(self) -> str:
        """`2 fallback(s): 1 training (graph 0), 1 missing ops aten.foo, aten.bar (graph 1)`"""
        return fallback_summary(self.fallbacks)

    @property
    def fallback_kinds(self) -> Counter[str]:
        """How many fallbacks of each kind (history.FALLBACK_KINDS)."""
        return Counter(f.kind for f in self.fallbacks)

    @property
    def guards(self) -> list[list[str]]:
        return [g.guards for g in self.graphs]

    def __str__(self) -> str:
        out = [f"ember explain: {len(self.graphs)} graph(s), {len(self.recompilations)} "
               f"recompilation(s), {len(self.fallbacks)} fallback(s), "
               f"{len(self.breaks)} graph break(s), {self.calls} call(s)"]
        if self.fallbacks:
            out.append(self.fallback_summary)
        if self.calls and not self.graphs and self.breaks:  # breaks left nothing to compile
            out.append(f"nothing compiled: every call ran eagerly ({len(self.breaks)} graph "
                       f"break(s) left no graph; see the graph breaks below)")
        if self.cuda_graphs:
            skipped = sum(r.skipped is not None for r in self.cuda_graphs)
            out.append(f"CUDA graphs: {self.recordings} recording(s), {self.replays} "
                       f"replay(s); {skipped} of {len(self.cuda_graphs)} graph(s) not "
                       f"recorded")
        for n in self.notes:
            out.append(f"note: {n}")
        for i, g in enumerate(self.graphs):
            ops = sum(g.op_counts.values())
            out.append(f"\n-- graph {i}: @{g.name}, {ops} op(s), {len(g.inputs)} input(s)"
                       + (f", dumped to {g.dumped_to}" if g.dumped_to else ""))
            out.append("ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(g.op_counts.items())))
            out.append("inputs: " + ", ".join(g.inputs))
            out.append(g.ir.rstrip())
            out.append(f"guards ({len(g.guards)}):")
            out += [f"  {t}" for t in g.guards]
        out += _located("graph breaks", self.breaks)
        if self.cuda_graphs:
            out.append("\n-- CUDA graphs (mode reduce-overhead):")
            out += [f"  {r.text()}" for r in self.cuda_graphs]
        if self.recompilations:
            out.append("\n-- recompilations:")
            out += [f"  {i + 1}. {r}" for i, r in enumerate(self.recompilations)]
        out += _located("fallbacks (graphs or calls that did not run through the backend)",
                        self.fallbacks, kinds=True)
        return "\n".join(out) + "\n"


def _located(title: str, items: list[Fallback], kinds: bool = False) -> list[str]:
    """A section of reasons, each with its source line and the inlined calls that led there."""
    if not items:
        return []
    out = [f"\n-- {title}:"]
    for f in items:
        kind = "" if not kinds else f.kind + (
            "" if f.graph is None else f" (graph {f.graph})") + ": "
        out.append(f"  {kind}{f.reason}")
        out.append(f"    at {f.where}")
        out += [f"    via {s}" for s in f.stack if not s.startswith(f.where + " ")]
    return out


def report_of(history: History) -> ExplainReport:
    return ExplainReport(list(history.graphs), list(history.recompilations),
                         list(history.fallbacks), list(history.notes), history.calls,
                         list(history.breaks), list(history.cuda_graphs))


def explain(fn: Any, *args: Any, **kwargs: Any) -> ExplainReport:
    """Call `fn(*args, **kwargs)` through ember and report what happened.

    `fn` may be a plain function or module (compiled here with backend="eager"), or a function
    or module already returned by `ember.runtime.compile` (its whole history is reported; with
    no arguments it is not called). A function or module wrapped by `torch.compile` is explained
    through its original (ember's own capture of it, with a note saying so).
    """
    cf = compiled_function_of(fn)
    if cf is None:
        orig = _torch_compiled_original(fn)
        compiled = compile(fn if orig is None else orig, backend="eager")
        cf = compiled_function_of(compiled)
        assert cf is not None
        if orig is not None:
            cf.history.note("explain() was given a torch.compile wrapper: this reports ember's "
                            "own capture of the original (for torch.compile(backend='ember'), "
                            "see ember.runtime.interop_torch.compiled_graphs())")
        compiled(*args, **kwargs)
    elif args or kwargs:
        fn(*args, **kwargs)
    return report_of(cf.history)


def _torch_compiled_original(fn: Any) -> Any:
    """What torch.compile wrapped (an OptimizedModule's module, a wrapped function's original),
    or None: ember cannot capture torch's own wrapper."""
    if type(fn).__name__ == "OptimizedModule":
        return getattr(fn, "_orig_mod", None)
    return getattr(fn, "_torchdynamo_orig_callable", None)


# -- `ember explain script.py:NAME` --------------------------------------------------------------
def add_explain_command(sub: Any) -> None:
    """Register the `explain` subcommand on the CLI's subparsers."""
    e = sub.add_parser("explain", help="compile a Python function or module with ember and "
                                       "report its graphs, guards and fallbacks")
    e.add_argument("target", help="script.py:NAME, NAME a function or nn.Module in the script")
    e.add_argument("--inputs", default="example_inputs", metavar="NAME",
                   help="a function of the script returning the call's arguments, as a tuple "
                        "or (args, kwargs) (default: example_inputs; without it, no arguments)")
    e.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    e.set_defaults(fn=cmd_explain)


def cmd_explain(a: argparse.Namespace) -> int:
    """Load the script, call NAME through `explain`, print the report. Errors: one line, 1."""
    def fail(msg: str) -> int:
        sys.stderr.write(f"ember: error: {msg}\n")
        return 1

    path, sep, name = a.target.rpartition(":")
    if not sep or not path or not name:
        return fail(f"expected SCRIPT.py:NAME, got {a.target!r}")
    if not Path(path).is_file():
        return fail(f"{path}: no such file")
    try:
        ns = runpy.run_path(path, run_name="__ember_explain__")  # the user's script, by request
    except Exception as e:
        return fail(f"{path}: running the script raised {type(e).__name__}: {e}")
    if name not in ns:
        return fail(f"{path}: the script defines no {name!r}")
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    make = ns.get(a.inputs)
    try:
        if make is not None:
            made = make()
            if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], tuple) \
                    and isinstance(made[1], dict):
                args, kwargs = made
            else:
                args = made if isinstance(made, tuple) else (made,)
        report = explain(ns[name], *args, **kwargs)
    except Exception as e:
        if a.debug:
            raise
        return fail(f"{path}: {name} raised {type(e).__name__}: {e}")
    sys.stdout.write(str(report))
    return 0
