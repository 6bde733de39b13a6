"""What a compiled function records about itself: captures, recompilations, fallbacks (each with
its kind and graph), notes. `explain()` reports it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class GraphRecord:
    name: str
    ir: str  # ir-v1 text
    op_counts: Counter[str]
    guards: list[str]
    inputs: list[str]  # where each graph input comes from
    dumped_to: str | None = None


# Why a graph (or a call) did not run through the requested backend: `Fallback.kind`.
FALLBACK_KINDS = {
    "capture": "capture cannot take the function: the call runs eagerly",
    "training": "gradients are needed and an op has no VJP rule: the eager backend runs the graph",
    "device": "the backend has no code generation for the tensors' device",
    "missing ops": "ops without a decomposition: the eager backend runs the graph",
    "backend": "the backend failed to compile the graph: the eager backend runs it",
    "runtime": "the compiled code failed at run time: the eager backend runs the graph",
    "interpreter": "the generated code does not cover the graph (or part of it): the reference "
                   "interpreter runs that",
    "cache limit": "the cache limit was reached: the function runs eagerly",
}


@dataclass
class Fallback:
    """A call, cache entry or graph that does not run through the requested backend, and why;
    `graph` is the graph's number in `History.graphs` (None: no graph, e.g. `capture`)."""

    reason: str
    file: str
    line: int
    stack: tuple[str, ...] = ()
    kind: str = "capture"
    graph: int | None = None
    ops: tuple[str, ...] = ()  # `missing ops`: every op of the graph without a decomposition

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def __str__(self) -> str:
        return f"{self.reason} at {self.where}"


def fallback_summary(items: list[Fallback]) -> str:
    """`2 fallback(s): 1 training (graph 0), 1 missing ops aten.foo, aten.bar (graph 1)`: the
    count per kind, with the graphs and (for missing ops) the ops' names."""
    if not items:
        return "0 fallback(s)"
    parts = []
    for kind in dict.fromkeys(f.kind for f in items):
        group = [f for f in items if f.kind == kind]
        text = f"{len(group)} {kind}"
        ops = sorted({o for f in group for o in f.ops})
        if ops:
            text += " " + ", ".join(ops)
        graphs = sorted({f.graph for f in group if f.graph is not None})
        if graphs:
            text += f" ({', '.join(f'graph {g}' for g in graphs)})"
        parts.append(text)
    return f"{len(items)} fallback(s): " + ", ".join(parts)


@dataclass
class CudaGraphRecord:
    """One compiled graph under mode="reduce-overhead" (runtime/cudagraphs.py): its CUDA-graph
    recordings (one per size binding met twice), replays, warm-up calls, calls run without a
    graph, and why it is not recorded (`skipped`), if it is not."""

    graph: int | None  # its number in History.graphs
    name: str
    recordings: int = 0
    replays: int = 0
    warmups: int = 0  # the first call of each binding: run as compiled, not recorded
    plain: int = 0  # calls run without a graph (skipped, over the limit, recording gradients)
    over_limit: int = 0  # calls of a binding past the recording limit
    rerecorded: int = 0  # recordings made again because a static input moved
    reused: int = 0  # calls whose static inputs came back to an earlier recording's addresses
    restored: int = 0  # recordings made again to read copied inputs in place (they stay put)
    recycled: int = 0  # results written into their last clone, which the caller let go of
    bindings: list[str] = field(default_factory=list)  # each recorded binding's shapes
    skipped: str | None = None
    # why each re-recording, restore or call past the limit happened (which inputs moved):
    # reason -> how often (at most MAX_REASONS distinct, the rest counted under "other")
    reasons: dict[str, int] = field(default_factory=dict)

    MAX_REASONS = 8

    def because(self, why: str) -> None:
        """Count one re-recording (or call without a graph) for reason `why`."""
        if why not in self.reasons and len(self.reasons) >= self.MAX_REASONS:
            why = "other reasons"
        self.reasons[why] = self.reasons.get(why, 0) + 1

    def text(self) -> str:
        where = f"graph {self.graph} " if self.graph is not None else ""
        head = f"{where}@{self.name}: "
        counts = (f"{self.recordings} recording(s), {self.replays} replay(s), "
                  f"{self.warmups} warm-up call(s), {self.plain} call(s) without a graph")
        if self.over_limit:
            counts += f" ({self.over_limit} past the recording limit)"
        if self.rerecorded:
            counts += f", {self.rerecorded} re-recording(s) (a static input moved)"
        if self.reused:
            counts += f", {self.reused} return(s) to an earlier recording's addresses"
        if self.restored:
            counts += (f", {self.restored} re-recording(s) reading copied inputs in place "
                       f"again")
        if self.recycled:
            counts += (f", {self.recycled} result(s) written into the tensor returned last "
                       f"(freed by the caller: same address)")
        why = "".join(f"; {r}" + (f" (x{n})" if n > 1 else "")
                      for r, n in self.reasons.items())
        if self.skipped is not None:
            return head + f"not recorded: {self.skipped}; " + counts + why
        return head + counts + why + ("; bindings " + ", ".join(self.bindings)
                                      if self.bindings else "")


@dataclass
class History:
    graphs: list[GraphRecord] = field(default_factory=list)
    recompilations: list[str] = field(default_factory=list)  # why each capture after the first
    fallbacks: list[Fallback] = field(default_factory=list)
    breaks: list[Fallback] = field(default_factory=list)  # graph breaks, one per split capture
    notes: list[str] = field(default_factory=list)
    calls: int = 0
    cuda_graphs: list[CudaGraphRecord] = field(default_factory=list)  # mode="reduce-overhead"
    cache_hits: int = 0
    warned: set[str] = field(default_factory=set)  # fallback kinds already warned about

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
