"""`autotune-cuda`: mode="max-autotune" for the CUDA target (docs/inductor.md "max-autotune").

Runs after `schedule-cuda`. For every loop kernel with static sizes it renders a few candidate
schedules (XBLOCK and warps; for rows also persistent vs looped and RBLOCK, and for a one-pass
rows kernel the default with TorchInductor's L2 eviction hints toggled, `cuda_evict=`), compiles them (on
the GPU in launcher.py's thread pool, as a module load does), times each on random inputs of the
kernel's dtypes and shapes (fresh buffers: the user's tensors are never touched, so a kernel
that writes its inputs writes only these) and writes the fastest into the node's cuda_*
attributes: the dump shows the chosen schedule and replays it. Every matmul extern whose reader
is a pointwise epilogue (matmul_template.py) is timed as extern + epilogue kernel and as the
Triton template with the epilogue fused (a few tile shapes and stage counts); the template is
kept only where it wins (`cuda_matmul` on the epilogue node).

Winners are kept in an on-disk tuning cache: one JSON file per kernel under
`<kernel cache>/autotune/`, named by the digest of (the kernel's source under its default
schedule, the device's name, the triton version), written atomically (cache.atomic_write) and
read as JSON only (a file that does not parse or check is ignored and tuned again); a second
compile of the same kernel on the same device does no tuning. Sizes that are symbols are not
tuned (the default schedule stays: the best block depends on the size a call brings).

The timer is injectable (`tuning_timer`, or `autotune(timer=)`): it gets the call to time and
the candidate (a dict of attributes, or {"kind": "extern"}) and returns milliseconds. On the
GPU it is triton.testing.do_bench; in Triton's interpreter a wall-clock median (meaningless as
a GPU timing: tests pass a deterministic fake to check the choice logic).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ember.inductor.body import body_names
from ember.inductor.targets.cuda import matmul_template as mt
from ember.inductor.targets.cuda.render import (
    RMAX,
    SCHED_KEYS,
    CodegenError,
    next_pow2,
    render,
)
from ember.ir import Graph, Kernel, Module, Node, Ref, TensorType, Value
from ember.ir.passes import expand_pipeline, register_pass

Candidate = dict[str, Any]
Timer = Callable[[Callable[[], object], Candidate], float]  # (run, candidate) -> ms
CACHE_VERSION = 3  # bump when the candidate sets or the file's fields change (2: cuda_evict;
# 3: hints on by default for plain row reductions, rows' warps by bytes: old winners stale)
_LOG = logging.getLogger("ember.kernels")
_TIMER: ContextVar[Timer | None] = ContextVar("ember_tuning_timer", default=None)
# the reports of a `collecting()` block (compile() notes them in explain)
_COLLECT: ContextVar[tuple[list[TuneReport], ...]] = ContextVar("ember_tuning_reports",
                                                               default=())


@dataclass
class Choice:
    """One tuned kernel: what was timed, what won, whether the cache answered."""

    kernel: str
    winner: Candidate
    timings: list[tuple[Candidate, float]] = field(default_factory=list)
    cached: bool = False


@dataclass
class TuneReport:
    choices: list[Choice] = field(default_factory=list)
    seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)  # kernel -> why not tuned

    def summary(self) -> str:
        hits = sum(c.cached for c in self.choices)
        parts = [f"@{c.kernel}: {_show(c.winner)}" for c in self.choices]
        return (f"autotune: {len(self.choices)} kernel(s) in {self.seconds:.2f} s "
                f"({hits} from the tuning cache); " + "; ".join(parts)
                + (f"; not tuned: {', '.join(f'@{k} ({w})' for k, w in self.skipped.items())}"
                   if self.skipped else ""))


def _show(c: Candidate) -> str:
    return ", ".join(f"{k.removeprefix('cuda_')}={v}" for k, v in c.items())


@contextlib.contextmanager
def tuning_timer(timer: Timer) -> Iterator[None]:
    """Time candidates with `timer` inside this block (tests: a deterministic fake)."""
    token = _TIMER.set(timer)
    try:
        yield
    finally:
        _TIMER.reset(token)


def default_timer(interpret: bool) -> Timer:
    if not interpret and torch.cuda.is_available():
        from triton.testing import do_bench

        def bench(run: Callable[[], object], cand: Candidate) -> float:
            return float(do_bench(run, warmup=10, rep=40))
        return bench

    def wall(run: Callable[[], object], cand: Candidate) -> float:
        run()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3
    return wall


@contextlib.contextmanager
def collecting() -> Iterator[list[TuneReport]]:
    """The reports of every autotune-cuda run inside this block, in order (blocks nest: an
    outer block sees the runs of the inner ones, e.g. compile()'s own)."""
    got: list[TuneReport] = []
    token = _COLLECT.set((*_COLLECT.get(), got))
    try:
        yield got
    finally:
        _COLLECT.reset(token)


def with_autotune(pipeline: str) -> str:
    """`pipeline` with autotune-cuda after schedule-cuda (unchanged where it has none)."""
    stages = expand_pipeline(pipeline).split(",")
    if "autotune-cuda" in stages or "schedule-cuda" not in stages:
        return pipeline
    k = stages.index("schedule-cuda")
    interp = any(s.startswith("codegen-triton{interpret=true") for s in stages)
    stages.insert(k + 1, "autotune-cuda{interpret=true}" if interp else "autotune-cuda")
    return ",".join(stages)


@register_pass("autotune-cuda", "max-autotune: time candidate Triton schedules of each loop "
               "kernel (and the matmul template against extern + epilogue) and write the "
               "winners as cuda_* attributes; winners kept in the on-disk tuning cache")
def autotune_cuda(module: Module, *, interpret: bool = False) -> Module:
    out, report = autotune(module, interpret=interpret)
    return out


def autotune(module: Module, *, interpret: bool = False, timer: Timer | None = None,
             cache: bool = True) -> tuple[Module, TuneReport]:
    """The module with tuned schedules, and what was tuned."""
    t0 = time.perf_counter()
    out = module.clone()
    report = TuneReport()
    timer = timer or _TIMER.get() or default_timer(interpret)
    bodies = body_names(out)
    for g in out.graphs.values():
        if g.name in bodies:
            continue
        for n in g.nodes:
            ref = n.args[0] if n.args else None
            if n.op in ("loop.pointwise", "loop.reduction") and isinstance(ref, Ref) \
                    and "cuda_xblock" in n.kwargs:
                try:
                    _tune_loop(out, n, ref.name, interpret, timer, cache, report)
                except Exception as e:  # noqa: BLE001  (tuning never fails a compile)
                    report.skipped[ref.name] = f"{type(e).__name__}: {str(e)[:120]}"
        for pair in mt.epilogue_pairs(g, out.items):
            try:
                _tune_matmul(out, pair, interpret, timer, cache, report)
            except Exception as e:  # noqa: BLE001  (the extern stays)
                pair.epilogue.kwargs.pop(mt.ATTR, None)
                report.skipped[f"{pair.epilogue.args[0]} (matmul)"] = \
                    f"{type(e).__name__}: {str(e)[:120]}"
    report.seconds = time.perf_counter() - t0
    for sink in _COLLECT.get():
        sink.append(report)
    if report.choices or report.skipped:
        _LOG.info("%s", report.summary())
    return out, report


# ---- loop kernels ---------------------------------------------------------------------------

def loop_candidates(sched: Mapping[str, int], xn: int, rn: int | None) -> list[Candidate]:
    """A few schedules of one kernel (the default first). `sched`: render's default schedule,
    `xn`: outer elements, `rn`: the row's reduced elements (None: plain pointwise)."""
    default: Candidate = {"cuda_xblock": sched["XBLOCK"], "cuda_warps": sched["num_warps"]}
    out = [default]
    if rn is None:
        top = next_pow2(max(1, xn))
        for xb, w in ((256, 2), (512, 4), (1024, 4), (1024, 8), (2048, 8)):
            if xb <= max(top, 128):
                out.append({"cuda_xblock": min(xb, top), "cuda_warps": w})
    else:
        default["cuda_persistent"] = sched["persistent"]
        if not sched["persistent"]:
            default["cuda_rblock"] = sched.get("R0BLOCK", RMAX // 4)
        row = next_pow2(rn)
        xtop = next_pow2(max(1, xn))
        if rn <= RMAX:  # persistent: rows per program x warps
            for xb in (1, 2, 4, 8, 16, 32):
                if xb <= xtop and xb * row <= 8192:
                    elems = xb * row
                    out.append({"cuda_xblock": xb, "cuda_warps": 8 if elems >= 4096 else 4
                                if elems >= 1024 else 2, "cuda_persistent": 1})
        for rb in (512, 2048):  # looped over chunks of the row
            if rb < row:
                for xb in (1, 4):
                    if xb <= xtop:
                        out.append({"cuda_xblock": xb, "cuda_warps": 4 if rb * xb <= 2048
                                    else 8, "cuda_persistent": 0, "cuda_rblock": rb})
    uniq: list[Candidate] = []
    for c in out:
        if c not in uniq:
            uniq.append(c)
    if rn is not None and sched.get("one_pass"):  # the default with L2 eviction hints
        # toggled (on by default for plain row reductions: then timed without them)
        return [*uniq[:8], {**default, "cuda_evict": 0 if sched.get("evict") else 1}]
    return uniq[:8]


def _static_numel(dims: Any) -> int | None:
    n = 1
    for d in dims if isinstance(dims, list) else []:
        if not isinstance(d, int):
            return None
        n *= d
    return n


def _tune_loop(m: Module, n: Node, name: str, interpret: bool, timer: Timer, cache: bool,
               report: TuneReport) -> None:
    body = m.items[name]
    assert isinstance(body, Graph)
    types = [v.type for v in [*n.args[1:], *n.results] if isinstance(v, Value)]
    if len(types) != len(n.args) - 1 + len(n.results) or not all(
            isinstance(t, TensorType) and all(isinstance(d, int) for d in t.shape)
            for t in types):
        report.skipped[name] = "symbolic sizes"
        return
    for k in SCHED_KEYS:  # the default schedule: the cache key and the first candidate
        n.kwargs.pop(k, None)
    try:
        base = render(name, n, body, m.items, interpret)
    except CodegenError:
        return
    if n.op == "loop.reduction":
        xn, rn = _static_numel(n.kwargs.get("ranges")), _static_numel(n.kwargs.get("reduce_ranges"))
    elif "persistent" in base.schedule:  # a pointwise kernel with fused reductions: rows
        reds = [r for r in body.nodes if r.op == "loop.reduce"]
        xn = _static_numel(reds[0].kwargs.get("ranges")) if reds else None
        rn = max((_static_numel(r.kwargs.get("reduce_ranges")) or 1 for r in reds), default=1)
    else:
        xn, rn = _static_numel(n.kwargs.get("ranges")), None
    xn = xn or 1
    cands = loop_candidates(base.schedule, xn, rn)
    key = _key("loop", base.source, _device_of(types[0], interpret))  # names left out
    hit = _cache_read(key) if cache else None
    if hit is not None and hit in cands:
        n.kwargs.update(hit)
        report.choices.append(Choice(name, hit, cached=True))
        return
    inputs = _buffers(n, interpret)
    sources: list[str] = []
    for c in cands:
        n.kwargs.update(c)
        sources.append(render(name, n, body, m.items, interpret).source)
        for k in SCHED_KEYS:
            n.kwargs.pop(k, None)
    timings: list[tuple[Candidate, float]] = []
    outs = inputs[len(n.args) - 1:]
    want: list[torch.Tensor] | None = None
    for c, run in zip(cands, _runners(name, sources, inputs, interpret), strict=True):
        try:
            if run is None:
                continue
            if want is None:  # the first that runs (the default): the reference result
                run()
                want = [o.clone() for o in outs]
            elif not _agrees(run, outs, want):
                _LOG.info("autotune @%s: candidate %s disagrees with the default schedule's "
                          "result: not a winner", name, c)
                continue
            timings.append((c, timer(run, c)))
        except Exception as e:  # noqa: BLE001  (a candidate that fails is not a winner)
            _LOG.debug("autotune @%s: candidate %s failed: %s", name, c, e)
    if not timings:
        n.kwargs.update(cands[0])
        report.skipped[name] = "no candidate ran"
        return
    best = min(timings, key=lambda ct: ct[1])[0]
    n.kwargs.update(best)
    report.choices.append(Choice(name, best, timings))
    if cache:
        _cache_write(key, best, timings)


# ---- the matmul template against extern + epilogue -------------------------------------------

def _tune_matmul(m: Module, pair: mt.Pair, interpret: bool, timer: Timer, cache: bool,
                 report: TuneReport) -> None:
    p, mm = pair.epilogue, pair.mm
    ref = p.args[0]
    assert isinstance(ref, Ref)
    a, b = mm.args
    assert isinstance(a, Value) and isinstance(b, Value)
    at, bt = a.type, b.type
    assert isinstance(at, TensorType) and isinstance(bt, TensorType)
    mm_, k_ = (int(d) for d in at.shape)
    n_ = int(bt.shape[1])
    name = ref.name
    try:
        base = mt.render_matmul(name, pair, m.items, interpret, mt.default_config(mm_, n_, k_), 4)
        epi = render(name, p, m.items[name], m.items, interpret)  # type: ignore[arg-type]
    except CodegenError as e:
        report.skipped[f"{name} (matmul template)"] = str(e)
        return
    extern: Candidate = {"kind": "extern"}
    cands: list[Candidate] = [extern] + [
        {"cuda_matmul": list(cfg), "cuda_warps": w}
        for cfg, w in mt.candidates(mm_, n_, k_, interpret)]
    key = _key("matmul", base.source + epi.source, _device_of(at, interpret))
    hit = _cache_read(key) if cache else None
    if hit is not None and hit in cands:
        _apply_matmul(p, hit)
        report.choices.append(Choice(f"{name} (matmul)", hit, cached=True))
        return
    ins = _buffers(p, interpret)  # the epilogue's buffers (the product among them)
    ta, tb = _random(at, interpret), _random(bt, interpret)
    product = ins[pair.position]
    others = [x for j, x in enumerate(ins[:len(p.args) - 1]) if j != pair.position]
    outs = ins[len(p.args) - 1:]
    timings: list[tuple[Candidate, float]] = []
    epi_run = _runners(name, [epi.source], ins, interpret)[0]
    if epi_run is None:
        raise CodegenError("the epilogue kernel does not load")

    def extern_run() -> None:
        torch.matmul(ta, tb, out=product)
        epi_run()
    extern_run()  # the extern's result: the reference each template is checked against
    want = [o.clone() for o in outs]
    timings.append((extern, timer(extern_run, extern)))
    for c in cands[1:]:
        try:
            src = mt.render_matmul(f"{name}_mm", pair, m.items, interpret, c["cuda_matmul"],
                                   c["cuda_warps"]).source
            run = _runners(f"{name}_mm", [src], [ta, tb, *others, *outs], interpret)[0]
            if run is None or not _agrees(run, outs, want):
                _LOG.info("autotune @%s: template %s does not load or disagrees with extern "
                          "+ epilogue: not a winner", name, c)
                continue
            timings.append((c, timer(run, c)))
        except Exception as e:  # noqa: BLE001
            _LOG.debug("autotune @%s: template %s failed: %s", name, c, e)
    if not timings:
        report.skipped[f"{name} (matmul)"] = "no candidate ran"
        return
    best = min(timings, key=lambda ct: ct[1])[0]
    _apply_matmul(p, best)
    report.choices.append(Choice(f"{name} (matmul)", best, timings))
    if cache:
        _cache_write(key, best, timings)


def _apply_matmul(p: Node, c: Candidate) -> None:
    if c.get("kind") == "extern":
        p.kwargs.pop(mt.ATTR, None)
        return
    p.kwargs[mt.ATTR] = list(c[mt.ATTR])
    p.kwargs["cuda_warps"] = int(c["cuda_warps"])


# ---- buffers, runners --------------------------------------------------------------------------

def _device_of(t: Any, interpret: bool) -> str:
    dev = t.device if isinstance(t, TensorType) else "cpu"
    if interpret or not dev.startswith("cuda"):
        return "triton-interpreter"
    idx = dev.partition(":")[2]
    return torch.cuda.get_device_name(int(idx) if idx.isdigit() else None)


def _random(t: Any, interpret: bool) -> torch.Tensor:
    """Random values of the type (ints: zeros, always in range as an index)."""
    assert isinstance(t, TensorType)
    dev = "cpu" if interpret else t.device
    shape = [int(d) for d in t.shape]
    dt = t.dtype.torch
    if dt.is_floating_point:
        return torch.randn(shape, device=dev).to(dt)
    return torch.zeros(shape, dtype=dt, device=dev)


def _buffers(n: Node, interpret: bool) -> list[torch.Tensor]:
    return [_random(v.type, interpret) for v in [*n.args[1:], *n.results]
            if isinstance(v, Value)]


def _agrees(run: Callable[[], object], outs: list[torch.Tensor], want: list[torch.Tensor]
            ) -> bool:
    """Whether a candidate computes the reference's result on the random inputs (within a
    tolerance by dtype: another block or tile sums in another order; integers exactly)."""
    run()
    for o, w in zip(outs, want, strict=True):
        if o.dtype.is_floating_point:
            tol = 1e-3 if o.dtype in (torch.float32, torch.float64) else 3e-2
            if not torch.allclose(o.float(), w.float(), rtol=tol, atol=tol, equal_nan=True):
                return False
        elif not torch.equal(o, w):
            return False
    return True


def _runners(name: str, sources: list[str], bufs: list[torch.Tensor], interpret: bool
             ) -> list[Callable[[], object] | None]:
    """Each candidate's launch over `bufs`. On the GPU the candidates compile together in
    launcher.py's thread pool and launch past the JIT, as a module load does; a candidate
    that does not bind (or in the interpreter, which compiles nothing) runs its launch()."""
    from ember.inductor.launch import LoadError
    from ember.inductor.targets.cuda import codegen
    from ember.inductor.targets.cuda.launcher import Job, LoadReport, compile_and_bind, unavailable
    fns: list[Callable[..., Any] | None] = []
    jobs: list[Job] = []
    for i, src in enumerate(sources):
        digest = hashlib.sha256(f"{interpret}\0{src}".encode()).hexdigest()[:32]
        try:
            fns.append(codegen._import(Kernel(name, codegen.LANG, src), digest))
        except LoadError as e:  # that candidate only
            _LOG.info("autotune @%s: a candidate does not load: %s", name, e)
            fns.append(None)
            continue
        mod = sys.modules.get(f"ember_triton_{digest}")
        if unavailable(interpret) is None and callable(getattr(mod, "bind", None)) \
                and bufs and bufs[0].is_cuda:
            dev = bufs[0].device.index or 0
            args = tuple(b.dtype for b in bufs)
            jobs.append(Job(f"{i}", mod, args, dev, len(args)))
    for j, fast in compile_and_bind(jobs, LoadReport()).items():
        fns[int(j)] = fast
    return [None if f is None else functools.partial(f, *bufs) for f in fns]


# ---- the tuning cache ----------------------------------------------------------------------------

def _key(kind: str, source: str, device: str) -> str:
    """The tuning cache's key: the kernel's source without its names (codegen's canonical
    text: an equal kernel in another graph or block finds the entry), the device, triton."""
    import triton

    from ember.inductor.targets.cuda.codegen import _canonical
    text = json.dumps([CACHE_VERSION, kind, _canonical(source), device, triton.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def cache_path(key: str) -> Path:
    from ember.inductor.targets.cpu.cache import cache_dir
    d = cache_dir() / "autotune"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d / f"{key}.json"


def _cache_read(key: str) -> Candidate | None:
    """The cached winner (JSON only; anything malformed is ignored)."""
    try:
        data = json.loads(cache_path(key).read_text())
    except (OSError, ValueError):
        return None
    win = data.get("winner") if isinstance(data, dict) and data.get("key") == key else None
    if not isinstance(win, dict) or not all(isinstance(k, str) for k in win):
        return None
    return win


def _cache_write(key: str, winner: Candidate, timings: list[tuple[Candidate, float]]) -> None:
    from ember.inductor.targets.cpu.cache import atomic_write
    data = {"key": key, "winner": winner,
            "timings_ms": [[c, round(t, 6)] for c, t in timings], "pid": os.getpid()}
    try:
        atomic_write(cache_path(key), json.dumps(data, sort_keys=True).encode())
    except OSError as e:  # a cache that cannot be written costs a re-tune, never the compile
        _LOG.info("autotune: cannot write the tuning cache: %s", e)


__all__ = ["Candidate", "Choice", "Timer", "TuneReport", "autotune", "autotune_cuda",
           "cache_path", "collecting", "default_timer", "loop_candidates", "tuning_timer",
           "with_autotune"]
