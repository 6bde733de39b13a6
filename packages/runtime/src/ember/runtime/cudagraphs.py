"""CUDA graphs for compiled graphs: `compile(..., mode="reduce-overhead")` (and "max-autotune").

A compiled graph's generated call launches one kernel per fused loop nest from Python; for a
decode step of a large model that is hundreds of launches whose Python and driver overhead
exceeds the GPU time. Under these modes each graph the inductor compiled is wrapped here:

* **Eligibility** (`skip_reason`, once per graph): every tensor input on one CUDA device,
  inputs only tensors and Python scalars, no part of the graph on the reference
  interpreter (its ops may sync with the host), and no random draw (a replay would repeat
  the recorded philox seed and offset; a draw `dce` dropped does not count). Otherwise the
  graph runs as in the default mode and `explain()` says why in its "CUDA graphs" section.
* **Warm-up, then one recording per size binding**: a binding is the values of the graph's
  size symbols and scalar inputs (`Binder`: the guards hold every other dim); a symbolic graph
  gets one recording per binding it meets twice (the first call of a binding is the warm-up:
  Triton compiles and specializes there, outside capture). At most `max_recordings` per graph
  (default 8); a binding past that runs without a graph, counted.
* **Static inputs**: a parameter, an input the graph updates, or a large input at the same
  address (data_ptr, strides) at the warm-up and the recording, is read in place by the
  recording (never copied); every call checks those addresses, and a recording replays only
  where each is where it was recorded (the guards hold its shape, strides and dtype), so the
  recording need not keep the caller's tensor alive: it does not, and a tensor the caller
  frees (the last generate()'s static cache) lets the next one of its size land at the same
  address and replay the same recording. Where one moved, the binding is recorded again (an
  input that moves twice within a few replays of its recording, a new tensor each call, is
  copied from then on; one that moves after a run of replays, another generate()'s cache, is
  recorded again in place, and the earlier recording is kept as an alternate, up to
  `MAX_ALTERNATES` per binding, replayed again when the inputs come back to its addresses).
  Other inputs are copied into buffers the recording owns.
* **One memory pool** per compiled function: its recordings' intermediates and outputs.
* **Outputs are cloned out of the pool** after each replay, so the caller never holds memory
  that the next replay overwrites (the "CUDAGraphs output overwritten" failure of keeping a
  step's outputs, e.g. a KV cache, across steps). Cost: one device copy per returned tensor
  per call (for a decode step, the logits: about 5 us); in exchange any caller may keep any
  output, and recordings of the pool never alias live caller memory, so they can share it.
  Results that are only written back into a static input (a static KV cache's in-place
  update) are copied into that input inside the graph, and never cloned.
* **Failures**: a recording that raises (a host synchronization inside the graph, an op that
  cannot be captured) stops recording that graph, with the error as its reason; the graph runs
  as compiled from then on.

Graph breaks: each compiled piece is its own compiled function with its own graphs and pool.
The counts (recordings, replays, warm-ups, calls without a graph) are in `History.cuda_graphs`.
"""

from __future__ import annotations

import math
import operator
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ember.ir import RunResult
from ember.runtime.history import CudaGraphRecord, History

# the modes that record CUDA graphs ("max-autotune-no-cudagraphs" does not, as in torch)
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
MAX_RECORDINGS = 8  # per graph: a symbolic graph meets a new binding per size
SEEN_LIMIT = 256  # bindings remembered from their warm-up (a growing cache meets one a step)
SCALARS = (int, float, bool, type(None))
SMALL_INPUT = 64 * 1024  # bytes: an input at most this large is copied unless updated
STABLE_REPLAYS = 4  # a static input that stayed put this many replays, then moved, is no churn
MAX_ALTERNATES = 3  # recordings kept per binding, each for other addresses of its static inputs

IRRunner = Callable[[str | None, Sequence[Any]], RunResult]
_DATA_PTR = torch.Tensor.data_ptr


@dataclass(frozen=True)
class GraphInfo:
    """What the capture says about a graph's results: which are written back into which input
    (`updates`: result -> input), and which the caller can see (None: unknown, all)."""

    updates: dict[int, int] = field(default_factory=dict)
    visible: frozenset[int] | None = None
    # inputs the capture read from a module's parameters or buffers (long-lived tensors:
    # read in place like parameters; BatchNorm's small running stats were copied every call)
    members: frozenset[int] = frozenset()
    # each input's source as the capture names it (`L['cache'].layers[0].keys`): explain
    # says which input moved when a graph is recorded again
    names: tuple[str, ...] = ()


def graph_info(cap: Any, examples: Sequence[Any]) -> GraphInfo:
    """The capture's updates and output plan, where `cap` is the capture of this graph (its
    example inputs are the very objects the backend was given); else nothing is assumed."""
    ex = getattr(cap, "input_examples", None)
    if ex is None or len(ex) != len(examples) or any(a is not b for a, b in
                                                     zip(ex, examples, strict=True)):
        return GraphInfo()
    visible = set()
    for e in cap.plan:
        r = getattr(e, "result", None)
        if r is not None:
            visible.add(r)
    from ember.capture.sources import ModuleMemberSource, describe
    sources = list(getattr(cap, "input_sources", []))
    members = frozenset(i for i, src in enumerate(sources)
                        if isinstance(src, ModuleMemberSource))
    names = tuple(describe(src) for src in sources) if len(sources) == len(examples) else ()
    return GraphInfo({u.result: u.param for u in cap.updates}, frozenset(visible), members,
                     names)


def moved_examples(scalars: Any, module: Any, examples: Sequence[Any]) -> Sequence[Any]:
    """The example inputs as the compiled graph sees them: with `scalars` (the inductor's
    `ScalarInputs`, or None) its CPU inputs moved to the graph's device."""
    return examples if scalars is None else scalars.move(module.graph().name, examples)


def moving(scalars: Any, runner: IRRunner) -> IRRunner:
    """`runner` with the CPU inputs `scalars` names moved to its device first, per call."""
    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        return runner(graph, scalars.move(scalars.module.graph(graph).name, inputs))
    return run


def skip_reason(examples: Sequence[Any], interpreter: str | None,
                device_type: str = "cuda", draws: bool = False) -> str | None:
    """Why a graph with these example inputs is not recorded (None: it is); `draws`: it
    draws random numbers (random.draws)."""
    devices: set[str] = set()
    for i, x in enumerate(examples):
        if isinstance(x, torch.Tensor):
            devices.add(str(x.device))
        elif not isinstance(x, SCALARS):
            return f"input {i} is a {type(x).__name__} (recordings take tensors and scalars)"
    if not devices:
        return "it has no tensor inputs"
    other = sorted(d for d in devices if torch.device(d).type != device_type)
    if other:
        return (f"its tensors are on {', '.join(other)}: CUDA graphs record {device_type} "
                f"work only")
    if len(devices) > 1:
        return f"its tensors are on several devices ({', '.join(sorted(devices))})"
    if interpreter:
        return f"part of it runs on the reference interpreter, which may sync with the host " \
               f"({interpreter})"
    if draws:  # (the generated call gives the draws a new offset a call: a replay would not)
        return "it draws random numbers: a replay would repeat the recorded philox seed and " \
               "offset, so every call would draw the same numbers"
    return None


AUTO_DEVICE = "cuda"  # the device kind the default mode records on (tests: a CPU recorder)
# The default mode's estimate (H200 host, torch 2.11): a launch from the generated call costs
# the host ~4-6 us (ember's bound launcher 5.75 us, an extern's torch call about as much),
# which a replay saves; a replay costs its own launch and address checks (~15 us) and a clone
# per returned tensor (~3 us, plus its bytes read and written at ~3 TB/s). Recorded only where
# the saving is twice that (a kernel or two per call gains nothing worth a pool).
LAUNCH_US = 4.0
REPLAY_US = 15.0
CLONE_US = 3.0
CLONE_BYTES_PER_US = 1.5e6


def auto_graph_reason(examples: Sequence[Any], compiled: Any, graph: str,
                      interpreter: str | None, draws: bool = False) -> str | None:
    """Why the default mode does not record this compiled graph (None: it does, as
    reduce-overhead would): its tensors all on one CUDA device, nothing on the reference,
    static shapes (no recording per size), and its launches saving more host time than the
    clones of its outputs cost (a single kernel writing a large output is not recorded)."""
    from ember.ir import TensorType
    why = skip_reason(examples, interpreter, AUTO_DEVICE, draws)
    if why is not None:
        return why
    if getattr(compiled, "symbols", None):
        return "its shapes are symbolic"
    g = compiled.graph(graph) if graph in compiled.graphs else compiled.graph()
    launches = sum(1 for n in g.nodes if n.op in ("kernels.call", "kernels.extern"))
    outs = [o.type for o in g.outputs if isinstance(o.type, TensorType)]
    if not all(isinstance(d, int) for t in outs for d in t.shape):
        return "its shapes are symbolic"
    nbytes = sum(math.prod(t.shape) * t.dtype.itemsize for t in outs)
    if launches * LAUNCH_US <= 2 * (REPLAY_US + len(outs) * CLONE_US
                                    + nbytes / CLONE_BYTES_PER_US):
        return (f"{launches} launch(es) save less than copying its {len(outs)} output(s) "
                f"({nbytes} bytes) out of a recording costs")
    return None


def binding(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """What one recording is specialized to: each tensor's shape, each scalar's value."""
    return tuple(x.shape if isinstance(x, torch.Tensor) else (type(x), x) for x in inputs)


class Binder:
    """The binding of a call, cheaply: the guards (and the generated call's checks) already
    hold every static dim of the captured graph's inputs, so only its symbolic dims and its
    scalar inputs can differ between calls (a decode step of ~400 inputs: a few reads, not
    400 shapes). Where the graph's input types are not known, every shape is read."""

    def __init__(self, params: Sequence[Any] | None, examples: Sequence[Any]):
        self.where: list[tuple[int, int, str]] | None = None  # (input, dim, its size expr)
        self.scalars = [i for i, x in enumerate(examples) if not isinstance(x, torch.Tensor)]
        if params is None or len(params) != len(examples):
            return
        where: list[tuple[int, int, str]] = []
        seen: set[str] = set()
        for i, (p, x) in enumerate(zip(params, examples, strict=True)):
            shape = getattr(getattr(p, "type", None), "shape", None)
            if not isinstance(x, torch.Tensor):
                continue
            if shape is None or len(shape) != x.dim():
                return
            for d, e in enumerate(shape):
                if not isinstance(e, int) and str(e) not in seen:  # (once per size expression)
                    seen.add(str(e))
                    where.append((i, d, str(e)))
        self.where = where

    def __call__(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        if self.where is None:
            return binding(inputs)
        return (*(inputs[i].shape[d] for i, d, _ in self.where),
                *((type(inputs[i]), inputs[i]) for i in self.scalars))

    def text(self, key: tuple[Any, ...]) -> str:
        """`(s0=14, input 3=2.5)`; `(static shapes)` for a graph with neither."""
        if self.where is None:
            return _binding_text(key)
        n = len(self.where)
        parts = [f"{e}={v}" for (_, _, e), v in zip(self.where, key[:n], strict=True)]
        parts += [f"input {i}={v[1]!r}" for i, v in zip(self.scalars, key[n:], strict=True)]
        return "(" + (", ".join(parts) or "static shapes") + ")"


def _address(x: Any) -> tuple[int, tuple[int, ...]] | None:
    return (x.data_ptr(), x.stride()) if isinstance(x, torch.Tensor) else None


class Recorder(Protocol):
    """How graphs are recorded and replayed (the CUDA one below; tests substitute others)."""

    def capture(self, fn: Callable[[], list[Any]], device: torch.device,
                inputs: Sequence[Any], warm: Callable[[], Any]) -> tuple[Any, list[Any]]:
        """Record `fn()` (which reads and may write `inputs`) without running it; return the
        graph and fn's results, which each replay refreshes. `warm()` runs the same kernels
        without side effects: a recorder may run it first, on the stream it records on."""

    def replay(self, graph: Any) -> None: ...


class CUDARecorder:
    """torch.cuda.CUDAGraph recordings on a side stream, all in one memory pool."""

    def __init__(self) -> None:
        self.pool: Any = None
        self.stream: torch.cuda.Stream | None = None
        # The first graph captured into the pool, kept for the pool's life: torch's allocator
        # counts the graphs using a pool, and a capture into a pool whose graphs were all
        # freed while blocks of it are still alive (a re-recording replacing the only
        # recording) fails its internal assert `use_count > 0`.
        self.anchor: Any = None

    def capture(self, fn: Callable[[], list[Any]], device: torch.device,
                inputs: Sequence[Any], warm: Callable[[], Any]) -> tuple[Any, list[Any]]:
        with torch.cuda.device(device):
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
                self.stream = torch.cuda.Stream()
            assert self.stream is not None
            g = torch.cuda.CUDAGraph()
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                # a run on the capture stream first: libraries that set up per-stream state on
                # first use (cuBLAS workspaces) do it outside the capture
                warm()
                # thread_local: another thread's CUDA calls (a compile) do not fail the capture
                g.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                if self.anchor is None:
                    self.anchor = g
                try:
                    outs = fn()
                except BaseException:
                    try:
                        g.capture_end()
                    except Exception:  # the capture is already invalidated: fn's error says why
                        pass
                    raise
                g.capture_end()
            torch.cuda.current_stream().wait_stream(self.stream)
        return g, outs

    def replay(self, graph: Any) -> None:
        graph.replay()


class _Recording:
    def __init__(self, key: tuple[Any, ...], graph: Any, ins: list[Any], outs: list[Any],
                 static: list[int], copied: list[int], plan: list[tuple[str, int]]):
        self.key, self.graph = key, graph
        # the results a replay refreshes (pool memory, scalars); not a result that is the
        # caller's static input or a view of one (a static KV cache written in place by the
        # backend): held here, it kept that generate()'s cache alive, so the next cache could
        # neither land at its address nor be written in place (_outputs); a view's layout only
        self.outs: list[Any] = [None if how == "input" else
                                (o.shape, o.stride(), o.storage_offset()) if how == "view"
                                else o for o, (how, _) in zip(outs, plan, strict=True)]
        self.static = [(i, ins[i].data_ptr()) for i in static]
        # the buffers of the copied inputs only: the caller's static tensors are not kept
        # alive (each replay checks their addresses first: module docstring)
        held = set(copied)
        self.ins: list[Any] = [x if i in held else None for i, x in enumerate(ins)]
        self.ptrs = [p for _, p in self.static]
        # (the per-call check of ~400 parameters' addresses, at C speed where it can be)
        self.take: Callable[[Sequence[Any]], Any] = _take(static)
        self.copied = copied
        self.replays = 0
        # per result: ("clone", -) a pool tensor, ("input", i) the caller's static input i
        # (written back in the graph), ("view", i) a view of static input i, ("same", -) as is
        self.plan = plan
        # (_GraphRunner._outputs) the results to clone, a getter of the inputs returned as
        # results, the other results, and the permutation putting the three in result order
        clones = [j for j, (how, _) in enumerate(plan) if how == "clone"]
        passed = [j for j, (how, _) in enumerate(plan) if how == "input"]
        others = [j for j, (how, _) in enumerate(plan) if how not in ("clone", "input")]
        where = {j: k for k, j in enumerate(clones + passed + others)}
        self.layout = (clones, _take([plan[j][1] for j in passed]), others,
                       _take([where[j] for j in range(len(plan))]))


class CudaGraphs:
    """The CUDA-graph state of one compiled function: its recorder (one memory pool)."""

    def __init__(self, recorder: Recorder | None = None, *, device_type: str = "cuda",
                 max_recordings: int = MAX_RECORDINGS):
        self.recorder = recorder if recorder is not None else CUDARecorder()
        self.device_type = device_type
        self.max_recordings = max_recordings

    def wrap(self, history: History, runner: IRRunner, name: str, graph_no: int | None,
             examples: Sequence[Any], info: GraphInfo, interpreter: str | None,
             params: Sequence[Any] | None = None, draws: bool = False) -> IRRunner:
        """`runner`, recorded and replayed as CUDA graphs where it can be (module docstring);
        its record is added to `history` (the function's: resume functions share it);
        `params`: the captured graph's inputs (their types say which dims are symbolic)."""
        rec = CudaGraphRecord(graph_no, name)
        history.cuda_graphs.append(rec)
        rec.skipped = skip_reason(examples, interpreter, self.device_type, draws)
        return _GraphRunner(self, runner, rec, info, Binder(params, examples))


class _GraphRunner:
    def __init__(self, owner: CudaGraphs, runner: IRRunner, rec: CudaGraphRecord,
                 info: GraphInfo, binder: Binder):
        self.owner, self.runner, self.rec, self.info = owner, runner, rec, info
        # per binding, its recordings (the one replayed last first; others: alternates)
        self.recordings: dict[tuple[Any, ...], list[_Recording]] = {}
        self.seen: dict[tuple[Any, ...], list[Any]] = {}  # binding -> addresses at warm-up
        self.moves: dict[int, int] = {}  # static inputs that moved: how often
        # inputs copied because they moved soon after being recorded (a cache of a few
        # 1-token generate()s looks like a new tensor per call): their addresses per call,
        # and for how many calls in a row they stayed put (then they are read in place again)
        self.demoted: list[int] = []
        self.demoted_ptrs: list[int] = []
        self.steady = 0
        self.warmed: set[tuple[Any, ...]] = set()  # bindings run once on the recorder's stream
        self.fresh = 0  # calls in a row whose binding was new
        # per binding, per result: the tensor it was last cloned into ("clone" results), kept
        # to be written again once the caller lets go of it (_outputs); a re-recording of the
        # binding (same results) writes them too
        self.last: dict[tuple[Any, ...], list[Any]] = {}
        self.binder = binder

    def __call__(self, graph: str | None, inputs: Sequence[Any]) -> RunResult:
        rec = self.rec
        if rec.skipped is not None:
            rec.plain += 1
            return self.runner(graph, inputs)
        if torch.is_grad_enabled() and any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
            rec.plain += 1  # (autograd records the call: no recording takes it)
            rec.because("a call recording gradients runs without a graph")
            return self.runner(graph, inputs)
        key = self.binder(inputs)
        rs = self.recordings.get(key)
        r = rs[0] if rs else None
        again: set[int] = set()  # a re-recording: the inputs static in the last recording
        if r is not None and rs is not None and not self._still_static(r, inputs):
            alt = next((x for x in rs[1:] if self._still_static(x, inputs)), None)
            if alt is not None:  # back at an earlier recording's addresses: replayed again
                rs.remove(alt)
                rs.insert(0, alt)
                rec.reused += 1
                r = alt
            else:
                # a move after a run of replays is a new long-lived tensor (another
                # generate()'s cache): recorded again in place, the old recording kept as an
                # alternate; a move soon after recording is churn, counted toward copying it
                moved = [i for i, a in r.static if inputs[i].data_ptr() != a]
                rec.because(moved_reason(self._names(moved), r.replays < STABLE_REPLAYS))
                if r.replays < STABLE_REPLAYS:
                    for i in moved:
                        self.moves[i] = self.moves.get(i, 0) + 1
                    rs.pop(0)
                again = {i for i, _ in r.static}
                rec.rerecorded += 1
                r = None
        elif r is not None and rs is not None and self.demoted:
            now = [inputs[i].data_ptr() for i in self.demoted]
            if now != self.demoted_ptrs:
                self.demoted_ptrs, self.steady = now, 0
            else:
                self.steady += 1
                if self.steady >= STABLE_REPLAYS:  # they stay put now: read in place again
                    for i in self.demoted:
                        self.moves.pop(i, None)
                    again = set(self.demoted) | {i for i, _ in r.static}
                    rec.because(f"recorded again to read {self._names(self.demoted)} in "
                                f"place (copied after moving; they stayed put "
                                f"{STABLE_REPLAYS} calls)")
                    self.demoted = []
                    rs.remove(r)
                    rec.restored += 1
                    r = None
        if r is None:
            if rs is None and len(self.recordings) >= self.owner.max_recordings:
                rec.over_limit += 1  # (nothing more to remember)
                rec.plain += 1
                rec.because(f"a binding past the limit of {self.owner.max_recordings} "
                            f"recordings runs without a graph")
                return self.runner(graph, inputs)
            addrs = [_address(x) for x in inputs]
            first = self.seen.get(key)
            if first is None:
                if len(self.seen) >= SEEN_LIMIT:  # the oldest is warmed up again if met
                    del self.seen[next(iter(self.seen))]
                self.seen[key] = addrs
                rec.warmups += 1
                self.fresh += 1
                # (twice the recording limit of new bindings in a row, none recorded)
                if self.fresh >= 2 * self.owner.max_recordings and not self.recordings:
                    # a DynamicCache's decode graph: a new cache length every step, each met
                    # once per generate(); recording the few that come back (the next
                    # generate()) costs a capture each for a handful of replays
                    rec.skipped = (f"its size binding changed on each of {self.fresh} calls "
                                   f"in a row, none met twice (a growing cache): it runs "
                                   f"without CUDA graphs")
                return self.runner(graph, inputs)
            self.fresh = 0
            # static: a parameter, an input the graph updates (a static KV cache: the
            # caller's state), a large input at the same address at warm-up and now, or one
            # static in the last recording; an input that moved twice (a new tensor each
            # call) is copied, and so is a small one (a step's token ids: a fresh tensor each
            # call that may land at the same address twice, and costs a few us to copy)
            updated = set(self.info.updates.values())
            static = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                      and self.moves.get(i, 0) < 2
                      and (isinstance(x, torch.nn.Parameter) or i in updated or i in again
                           or i in self.info.members
                           or (first[i] == addrs[i] and _nbytes(x) > SMALL_INPUT))]
            got = self._record(graph, key, inputs, static)
            if got is None:
                return self.runner(graph, inputs)
            r = got
            self.demoted = sorted(i for i, n in self.moves.items()
                                  if n >= 2 and i not in static and i < len(inputs))
            self.demoted_ptrs = [inputs[i].data_ptr() for i in self.demoted]
            self.steady = 0
            rs = self.recordings.setdefault(key, [])
            rs.insert(0, r)
            del rs[MAX_ALTERNATES:]
            rec.recordings += 1
            text = self.binder.text(key)
            if text not in rec.bindings:
                rec.bindings.append(text)
        for i in r.copied:  # (after a recording too: it did not run the graph, this replay does)
            r.ins[i].copy_(inputs[i])
        self.owner.recorder.replay(r.graph)
        r.replays += 1
        rec.replays += 1
        return RunResult(self._outputs(r, inputs))

    def _names(self, idx: Sequence[int]) -> str:
        return input_names(idx, self.info.names)

    def _still_static(self, r: _Recording, inputs: Sequence[Any]) -> bool:
        # data_ptr alone: the guards hold each input's strides
        return list(map(_DATA_PTR, r.take(inputs))) == r.ptrs

    def _record(self, graph: str | None, key: tuple[Any, ...], inputs: Sequence[Any],
                static: list[int]) -> _Recording | None:
        rec = self.rec
        ins: list[Any] = list(inputs)
        copied = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                  and i not in static]
        for i in copied:  # buffers the recording owns, laid out as the caller's
            x = inputs[i]
            ins[i] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            ins[i].copy_(x)
        device = next(x.device for x in inputs if isinstance(x, torch.Tensor))
        in_graph = {r: p for r, p in self.info.updates.items()
                    if p in static and (self.info.visible is None or r not in self.info.visible)}

        def body() -> list[Any]:
            outs = list(self.runner(graph, ins).outputs)
            _write_back([(ins[p], outs[r]) for r, p in in_graph.items()
                         if r < len(outs) and isinstance(outs[r], torch.Tensor)])
            return outs

        def warm() -> None:
            # the graph's write-backs are body's; a backend that writes rows of a static
            # cache in place (the CUDA target's cache-inplace) writes the rows the replay
            # writes again, from the same inputs: running it once more changes nothing.
            # Once per binding: a re-recording (a new cache) runs the same kernels on the
            # same stream, whose per-stream state (cuBLAS workspaces) the first one set up
            if key not in self.warmed:
                self.runner(graph, ins)

        try:
            g, outs = self.owner.recorder.capture(body, device, ins, warm)
        except Exception as e:
            rec.skipped = f"recording failed: {type(e).__name__}: {_first_line(e)}"
            _sync(device)
            return None
        self.warmed.add(key)
        bad = [j for j, o in enumerate(outs) if not (
            (isinstance(o, torch.Tensor) and o.device == device) or isinstance(o, SCALARS))]
        if bad:
            rec.skipped = f"result {bad[0]} is not a tensor on {device}"
            return None
        plan: list[tuple[str, int]] = []
        storages = {ins[i].untyped_storage().data_ptr(): i for i in static}
        for j, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                plan.append(("same", 0))
            elif j in in_graph:
                plan.append(("input", in_graph[j]))
            elif o.untyped_storage().data_ptr() in storages:
                plan.append(("view", storages[o.untyped_storage().data_ptr()]))
            else:  # pool memory, or a view of a copied input's buffer: both are overwritten
                plan.append(("clone", 0))
        return _Recording(key, g, ins, outs, static, copied, plan)

    def _outputs(self, r: _Recording, inputs: Sequence[Any]) -> list[Any]:
        # the results in three groups, each read in one go, then put in order by one C-speed
        # permutation (a decode step: its logits cloned, ~100 cache tensors passed through:
        # a Python loop over them was ~40 us of a ~1 ms host step on the CPU)
        clones, take_inputs, others, order = r.layout
        cloned: dict[int, Any] = {}
        last = self.last.get(r.key)
        if last is None or len(last) != len(r.outs):
            last = self.last[r.key] = [None] * len(r.outs)
        outs = r.outs
        src: list[Any] = []
        for j in clones:
            o = outs[j]
            c = cloned.get(id(o))
            if c is None:
                # the tensor this result was cloned into last time, where the caller let go
                # of it (nothing else holds it or its storage): written again in place, so
                # it keeps its address (a prefill's new static cache lands where the last
                # generate()'s was, and the decode step's recording replays as is)
                # (no local reference to it while _sole counts them)
                if last[j] is not None and _sole(last, j) and last[j].shape == o.shape:
                    c = last[j]
                    c.copy_(o)
                    self.rec.recycled += 1
                else:
                    c = o.clone()
                cloned[id(o)] = last[j] = c
            src.append(c)
        src += take_inputs(inputs)  # the write-backs are done: the epilogue sees new is old
        for j in others:
            how, i = r.plan[j]
            o = outs[j]
            if how == "view":
                src.append(inputs[i].as_strided(*o))
            else:
                src.append(o)
        return list(order(src))


def _write_back(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """`dst.copy_(src)` per pair, in the recording: one multi-tensor launch for all of them
    (a decode step updates each layer's 0-d cache position: 32 copies, one kernel); a result
    that is its input already (written in place by the backend) is skipped."""
    pairs = [(d, s) for d, s in pairs if s is not d]
    if len(pairs) > 1 and all(d.dtype == s.dtype and d.device == s.device for d, s in pairs):
        torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])
        return
    for d, s in pairs:
        d.copy_(s)


def _holders(xs: list[Any], j: int) -> tuple[int, ...]:
    """Who holds xs[j] and its storage: Python references to each (as counted from here),
    C++ references to the storage (views, other tensors) and to the tensor, weak references."""
    x = xs[j]
    s = x.untyped_storage()
    return (sys.getrefcount(x), sys.getrefcount(s), _storage_uses(s._cdata), x._use_count(),
            weakref.getweakrefcount(x))


def _storage_uses(cdata: int) -> int:
    use = getattr(torch._C, "_storage_Use_Count", None)
    return -1 if use is None else int(use(cdata))


# what _holders reads for a tensor that only a list element holds (measured, not assumed:
# the counts differ between torch and Python versions); -1 uses: unknown, never recycled
_ALONE = _holders([torch.empty(1)], 0)


def _sole(xs: list[Any], j: int) -> bool:
    """Whether only `xs` holds the tensor xs[j]: no other Python or C++ reference to it, to a
    view of it, or to its storage, and no weak reference (anything else might read it)."""
    return _ALONE[2] >= 0 and _holders(xs, j) == _ALONE


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def _take(static: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A tuple of the items at these indices: itemgetter's (C speed) for 2 or more, else
    built here (itemgetter(i) returns the item itself)."""
    if len(static) > 1:
        return operator.itemgetter(*static)

    def take(xs: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(xs[i] for i in static)
    return take


def _sync(device: torch.device) -> None:
    """Wait for the device after a failed recording (its error, if any, was reported)."""
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)
        except RuntimeError:
            pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


def input_names(idx: Sequence[int], names: Sequence[str], most: int = 3) -> str:
    """`input 4 (L['cache'].keys), input 5 (...) and 30 more`: which inputs, by their
    capture sources where known."""
    parts = [f"input {i}" + (f" ({names[i]})" if i < len(names) else "")
             for i in list(idx)[:most]]
    more = len(idx) - most
    text = ", ".join(parts) or "no input"
    return text + (f" and {more} more" if more > 0 else "")


def moved_reason(names: str, soon: bool) -> str:
    """Why a binding was recorded again: its static inputs `names` moved, `soon` after its
    recording (a new tensor per call: counted toward copying them) or after a run of
    replays (a new long-lived tensor, such as another generate()'s cache)."""
    when = (f"within {STABLE_REPLAYS} replays of its recording (copied once moved twice)"
            if soon else "after a run of replays (a new long-lived tensor, e.g. another "
            "generate()'s cache)")
    return f"recorded again: {names} moved {when}"


def _binding_text(key: tuple[Any, ...]) -> str:
    parts = []
    for k in key:
        if k and isinstance(k[0], type):
            parts.append(repr(k[1]))
        else:
            parts.append("[" + ", ".join(str(d) for d in k) + "]")
    return "(" + ", ".join(parts) + ")"
