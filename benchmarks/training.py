"""Training steps for `python3 dev.py bench -- --suite training` (cases in suites.py).

A step is: the compiled loss function (the model's forward and its loss, so the compiled code
holds the forward and, through autograd, the backward), `loss.backward()`, `opt.step()`,
`opt.zero_grad()` (gradients set to None, so each step allocates them as real training does).
Each contender trains its own copy of the model from the same initial weights with its own SGD
optimizer. The conventions are `ember.runtime.bench.run_case`'s: cold and warm compile (the
first step: compile of forward and backward + one step), 2 warm-up steps, interleaved timed
repetitions (round robin, order rotating), median ± half the IQR, and what ember did.

- **Check**: the first `CHECK_STEPS` steps of each compiler (losses, and the parameters after
  them) against eager's from the same weights and data, `assert_close` at the case's tolerance.
- **Peak memory**: CPU torch has no allocator statistics (`torch.cuda.max_memory_allocated`
  has no CPU counterpart), and tracemalloc does not see torch's allocations. So it is measured
  with the profiler's memory events (`profile_memory=True`: every allocation and free of
  torch's CPU allocator, with its size and time): the peak of the bytes live during one step
  above what was live when it started (activations, saved tensors, gradients, temporaries).
  ember's compiled code allocates its buffers with `torch.empty`, so they are counted too;
  memory a C++ kernel takes on its own stack or heap is not (ember's kernels take none that
  scales with the data).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ember.runtime.bench import CaseResult, Contender, Progress, Timing

CHECK_STEPS = 3
LR = 1e-3
MEMORY_METHOD = ("torch CPU allocator bytes live during one step above the step's start "
                 "(profiler memory events, profile_memory=True)")

_TRAINING = re.compile(r"runs its forward as (\d+) C\+\+ kernel\(s\), (\d+) extern call\(s\) "
                       r"and its backward as (\d+) C\+\+ kernel\(s\), (\d+) extern call\(s\)")

# model, loss function (model, *inputs) -> scalar loss, the step's inputs
TrainBuilt = tuple[nn.Module, Callable[..., torch.Tensor], tuple[Any, ...]]


@dataclass
class TrainCase:
    """A training benchmark; `build()` returns a fresh model (seeded), its loss and inputs."""

    name: str
    suite: str
    build: Callable[[], TrainBuilt]
    what: str = ""
    rtol: float = 1e-3
    atol: float = 1e-3


class _Trainer:
    """One contender's model copy, optimizer and compiled loss: `step()` is one training step
    and returns the loss."""

    def __init__(self, model: nn.Module, loss: Callable[..., torch.Tensor],
                 args: tuple[Any, ...], make: Callable[[Callable[..., Any]], Callable[..., Any]]):
        self.model, self.loss, self.args, self.make = model, loss, args, make
        self.opt = torch.optim.SGD(model.parameters(), lr=LR)
        self.fn = self.compile()

    def compile(self) -> Callable[..., Any]:
        m, loss = self.model, self.loss
        return self.make(lambda *a: loss(m, *a))

    def step(self, fn: Callable[..., Any] | None = None) -> torch.Tensor:
        out = (fn or self.fn)(*self.args)
        out.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return out.detach()


def describe_training(describe: Callable[[Any], dict[str, Any]], compiled: Any
                      ) -> dict[str, Any]:
    """The contender's description, with the kernels of ember's training graphs (forward and
    backward, from explain()'s training notes) counted into its status line."""
    info = describe(compiled)
    fwd = bwd = ext = 0
    for note in info.get("notes", []):
        m = _TRAINING.search(note)
        if m:
            fwd, bwd = fwd + int(m.group(1)), bwd + int(m.group(3))
            ext += int(m.group(2)) + int(m.group(4))
    if fwd or bwd:
        info["kernels"] = info.get("kernels", 0) + fwd + bwd
        info["externs"] = info.get("externs", 0) + ext
        info["status"] = (info.get("status", "").replace(", 0 kernel(s)", "")
                          + f"; training: forward {fwd} + backward {bwd} C++ kernel(s), "
                          f"{ext} extern")
    return info


def peak_step_bytes(step: Callable[[], Any]) -> int:
    """The most torch CPU allocator bytes live during `step()` above those live at its start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    kineto = prof.profiler.kineto_results if prof.profiler is not None else None
    if kineto is None:
        return 0
    mem = sorted((e.start_ns(), e.nbytes()) for e in kineto.events() if e.name() == "[memory]")
    live = peak = 0
    for _, n in mem:
        live += n
        peak = max(peak, live)
    return peak


def _check(got: list[Any], want: list[Any], case: TrainCase) -> str:
    try:
        torch.testing.assert_close(got, want, rtol=case.rtol, atol=case.atol)
    except (AssertionError, TypeError, ValueError) as e:
        return "MISMATCH: " + " ".join(str(e).split())[:300]
    return "ok"


def _params(m: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def run_training_case(case: TrainCase, contenders: Sequence[Contender], reps: int = 15,
                      warmup: int = 2, progress: Progress | None = None) -> CaseResult:
    """Compile (cold, then warm) and time one training step of `case` under each contender,
    interleaved; check the first steps against eager's; measure each one's peak step memory."""
    res = CaseResult(case.name, case.suite, case.what)
    base, loss, args = case.build()
    ref = _Trainer(copy.deepcopy(base), loss, args, lambda fn: fn)
    want = [[ref.step() for _ in range(CHECK_STEPS)], _params(ref.model)]
    trainers: dict[str, _Trainer] = {}
    extra: dict[str, dict[str, Any]] = {}
    saved_env = {k: os.environ.get(k) for k in ("EMBER_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    for c in contenders:
        if progress:
            progress.show(f"{case.name}: compiling with {c.name}")
        tmp = Path(tempfile.mkdtemp(prefix=f"ember-bench-train-{c.name}-"))
        try:
            if c.cold:
                c.cold(tmp)
            t = time.perf_counter()
            tr = _Trainer(copy.deepcopy(base), loss, args, c.make)
            losses = [tr.step()]  # the first step compiles forward and backward
            info: dict[str, Any] = {"cold_compile_s": time.perf_counter() - t if c.cold
                                    else None}
            losses += [tr.step() for _ in range(CHECK_STEPS - 1)]
            if c.check:
                info["check"] = _check([losses, _params(tr.model)], want, case)
            if c.warm:
                c.warm()
                t = time.perf_counter()
                tr.step(tr.compile())
                info["warm_compile_s"] = time.perf_counter() - t
            if c.describe:
                info["info"] = describe_training(c.describe, tr.fn)
        except Exception as e:  # a contender that cannot run the case is reported, not fatal
            res.error[c.name] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            continue
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        trainers[c.name], extra[c.name] = tr, info
    for k, v in saved_env.items():  # the cold runs pointed the caches at removed directories
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    for tr in trainers.values():
        for _ in range(warmup):
            tr.step()
    samples: dict[str, list[float]] = {n: [] for n in trainers}
    names = list(trainers)
    for r in range(reps):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t = time.perf_counter()
            trainers[n].step()
            samples[n].append((time.perf_counter() - t) * 1e3)
        if progress:
            progress.show(f"{case.name}: repetition {r + 1}/{reps}")
    for n, tr in trainers.items():
        info = extra[n].setdefault("info", {})
        info["peak_step_bytes"] = peak_step_bytes(tr.step)
        info["memory_method"] = MEMORY_METHOD
    for n, s in samples.items():
        q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
        res.timings[n] = Timing(statistics.median(s), q[0], q[2], len(s), **extra[n])
    if progress:
        progress.step(f"{case.name} done")
    return res


def memory_section(results: Sequence[CaseResult], who: Sequence[str]) -> str:
    """Markdown: each contender's peak memory per step, and its ratio to eager's."""
    rows = [r for r in results if any("peak_step_bytes" in t.info for t in r.timings.values())]
    if not rows:
        return ""
    comp = [w for w in who if w != "eager"]
    out = ["", "## Peak memory per training step", "",
           f"Measured: {MEMORY_METHOD}. One step after the timed ones; MB = 2^20 bytes.", "",
           "| case | " + " | ".join(f"{w} MB" for w in who) + " | "
           + " | ".join(f"{w} / eager" for w in comp) + " |",
           "|" + "---|" * (1 + len(who) + len(comp))]
    ratios: dict[str, list[float]] = {w: [] for w in comp}
    for r in rows:
        mb = {w: r.timings[w].info.get("peak_step_bytes") if w in r.timings else None
              for w in who}
        cells = [r.name] + ["—" if mb[w] is None else f"{mb[w] / 2**20:.2f}" for w in who]
        base = mb.get("eager")
        for w in comp:
            b = mb[w]
            if base and b is not None:
                ratios[w].append(b / base)
                cells.append(f"{b / base:.2f}×")
            else:
                cells.append("—")
        out.append("| " + " | ".join(cells) + " |")
    g = {w: statistics.geometric_mean(v) for w, v in ratios.items() if v}
    out += ["", "Geomean peak memory relative to eager: "
            + ", ".join(f"{w} {x:.2f}×" for w, x in g.items()) + "."]
    return "\n".join(out) + "\n"
