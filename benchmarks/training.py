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

On a GPU (`python3 benchmarks/training.py --device cuda [--dtype bf16,f32]`, issue 16 item 6)
the same cases run on CUDA tensors (model and float inputs cast to the dtype): each timed step
ends with `torch.cuda.synchronize()`, peak memory is the CUDA caching allocator's
(`torch.cuda.max_memory_allocated()` during one step above the bytes allocated at its start),
and bf16 is checked at a bf16 tolerance. The CPU path (`dev.py bench --suite training`) is
unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
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

from ember.runtime.bench import (
    CaseResult,
    Contender,
    Progress,
    Timing,
    caches_kept,
    interleaved,
    quartiles,
)

CHECK_STEPS = 3
LR = 1e-3
MEMORY_METHOD = ("torch CPU allocator bytes live during one step above the step's start "
                 "(profiler memory events, profile_memory=True)")

_TRAINING = re.compile(r"runs its forward as (\d+) (C\+\+|[Tt]riton) kernel\(s\), (\d+) extern "
                       r"call\(s\) and its backward as (\d+) (?:C\+\+|[Tt]riton) kernel\(s\), (\d+) "
                       r"extern call\(s\)")

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
    lang = "C++"
    for note in info.get("notes", []):
        m = _TRAINING.search(note)
        if m:
            fwd, bwd = fwd + int(m.group(1)), bwd + int(m.group(4))
            ext += int(m.group(3)) + int(m.group(5))
            lang = m.group(2)
    if fwd or bwd:
        info["kernels"] = info.get("kernels", 0) + fwd + bwd
        info["externs"] = info.get("externs", 0) + ext
        info["status"] = (info.get("status", "").replace(", 0 kernel(s)", "")
                          + f"; training: forward {fwd} + backward {bwd} {lang} kernel(s), "
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


# CUDA: the caching allocator's own counters
CUDA_MEMORY_METHOD = ("CUDA caching allocator bytes allocated during one step above those "
                      "allocated at its start (torch.cuda.max_memory_allocated)")
# bf16/f16 steps are checked at their precision: eager and ember round different intermediates
# (ember's fused kernels compute in f32 between loads and stores)
LOWP_TOL = 2e-2


def cuda_peak_step_bytes(step: Callable[[], Any]) -> int:
    """The most CUDA allocator bytes allocated during `step()` above those at its start."""
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - start)


def on_device(built: TrainBuilt, device: str, dtype: torch.dtype | None) -> TrainBuilt:
    """A built case moved to `device`: the model (and its float inputs) cast to `dtype`."""
    model, loss, args = built
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)

    def move(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        if dtype is not None and a.is_floating_point():
            return a.to(device=device, dtype=dtype)
        return a.to(device)
    return model, loss, tuple(move(a) for a in args)


def _check(got: list[Any], want: list[Any], case: TrainCase) -> str:
    try:
        torch.testing.assert_close(got, want, rtol=case.rtol, atol=case.atol)
    except (AssertionError, TypeError, ValueError) as e:
        return "MISMATCH: " + " ".join(str(e).split())[:300]
    return "ok"


def _params(m: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def run_training_case(case: TrainCase, contenders: Sequence[Contender], reps: int = 15,
                      warmup: int = 2, progress: Progress | None = None, device: str = "cpu",
                      dtype: torch.dtype | None = None) -> CaseResult:
    """Compile (cold, then warm) and time one training step of `case` under each contender,
    interleaved; check the first steps against eager's; measure each one's peak step memory.
    `device`/`dtype`: where the model and inputs live (the CPU as built, by default)."""
    res = CaseResult(case.name, case.suite, case.what)
    cuda = device != "cpu"
    if cuda and dtype in (torch.bfloat16, torch.float16):
        case = dataclasses.replace(case, rtol=max(case.rtol, LOWP_TOL),
                                   atol=max(case.atol, LOWP_TOL))
    base, loss, args = on_device(case.build(), device, dtype) if cuda else case.build()
    ref = _Trainer(copy.deepcopy(base), loss, args, lambda fn: fn)
    want = [[ref.step() for _ in range(CHECK_STEPS)], _params(ref.model)]
    trainers: dict[str, _Trainer] = {}
    extra: dict[str, dict[str, Any]] = {}
    with caches_kept():  # (the cold compiles point the caches at removed directories)
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
    for tr in trainers.values():
        for _ in range(warmup):
            tr.step()
    samples = interleaved(
        {n: tr.step for n, tr in trainers.items()}, (), reps,
        sync=torch.cuda.synchronize if cuda else None,
        on_rep=(lambda r: progress.show(f"{case.name}: repetition {r + 1}/{reps}"))
        if progress else None)
    for n, tr in trainers.items():
        info = extra[n].setdefault("info", {})
        info["peak_step_bytes"] = cuda_peak_step_bytes(tr.step) if cuda \
            else peak_step_bytes(tr.step)
        info["memory_method"] = CUDA_MEMORY_METHOD if cuda else MEMORY_METHOD
    for n, s in samples.items():
        med, q1, q3 = quartiles(s)
        res.timings[n] = Timing(med, q1, q3, len(s), **extra[n])
    if progress:
        progress.step(f"{case.name} done")
    return res


def memory_section(results: Sequence[CaseResult], who: Sequence[str]) -> str:
    """Markdown: each contender's peak memory per step, and its ratio to eager's."""
    rows = [r for r in results if any("peak_step_bytes" in t.info for t in r.timings.values())]
    if not rows:
        return ""
    method = next((t.info["memory_method"] for r in rows for t in r.timings.values()
                   if "memory_method" in t.info), MEMORY_METHOD)
    comp = [w for w in who if w != "eager"]
    out = ["", "## Peak memory per training step", "",
           f"Measured: {method}. One step after the timed ones; MB = 2^20 bytes.", "",
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


# ---- the CUDA training benchmark (issue 16 item 6) ------------------------------------------

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def gpu_meta(device: str) -> dict[str, Any]:
    """The GPU and the versions that matter there (next to run_meta's machine and versions)."""
    import triton

    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "gpu_memory_gb": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda, "triton": triton.__version__}


def _row(r: CaseResult) -> dict[str, Any]:
    """One case's line: per contender its median step, compile times, check, peak memory."""
    out: dict[str, Any] = {"case": r.name, "errors": r.error}
    for w, t in r.timings.items():
        out[w] = {"ms": round(t.median_ms, 3), "iqr_ms": round(t.iqr_ms, 3),
                  "cold_s": t.cold_compile_s, "warm_s": t.warm_compile_s, "check": t.check,
                  "peak_mb": round(t.info.get("peak_step_bytes", 0) / 2**20, 2),
                  "status": t.info.get("status"), "fallbacks": t.info.get("fallbacks")}
        sp = r.speedup(w)
        if sp is not None:
            out[w]["speedup"] = round(sp, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python3 benchmarks/training.py --device cuda`: the training cases on a GPU, eager vs
    torch.compile vs ember in one process, per dtype; writes <out>/<stem>.{json,md} and prints
    the markdown."""
    import argparse
    import datetime as dt
    import json
    import sys
    import warnings
    from dataclasses import asdict

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from run import torch_compile_contender  # (benchmarks/run.py: its cold/warm cache reset)
    from suites import SUITES

    from ember.runtime.bench import eager_contender, ember_contender, markdown, run_meta

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--device", default="cuda", help="a CUDA device (the CPU's run is "
                    "`dev.py bench --suite training`)")
    ap.add_argument("--dtype", default="bf16,f32", help="comma-separated: bf16, f16, f32")
    ap.add_argument("--filter", default="", help="only cases whose name contains this; "
                    "comma-separated alternatives run in that order")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--out", type=Path, default=here / "results")
    ap.add_argument("--tag", default="cuda-training")
    ap.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    a = ap.parse_args(argv)
    every = [c for c in SUITES["training"]() if isinstance(c, TrainCase)]
    cases = [c for f in a.filter.lower().split(",") for c in every if f.strip() in c.name.lower()]
    cases = [c for i, c in enumerate(cases) if c not in cases[:i]]
    if a.list:
        print("\n".join(c.name for c in cases))
        return 0 if cases else 1
    if not a.device.startswith("cuda") or not torch.cuda.is_available():
        print("training.py --device needs a CUDA device (torch.cuda.is_available() is False "
              "here); the CPU training benchmark is `python3 dev.py bench --suite training`",
              file=sys.stderr)
        return 2
    dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        print(f"unknown dtype(s) {', '.join(bad)}; choose from {', '.join(DTYPES)}",
              file=sys.stderr)
        return 2
    if not cases:
        print(f"no training case matches --filter {a.filter!r}", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    contenders = [eager_contender()]
    if not a.no_torch_compile:
        contenders.append(torch_compile_contender())
    contenders.append(ember_contender())
    who = [c.name for c in contenders]
    progress = Progress(len(cases) * len(dtypes))
    results = []
    stem = f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-{a.tag}"
    a.out.mkdir(parents=True, exist_ok=True)
    rows = a.out / f"{stem}.jsonl"  # one line per case as it finishes (a cut run keeps them)
    rows.write_text("")
    for d in dtypes:
        for case in cases:
            named = dataclasses.replace(case, name=f"{case.name} {d}")
            r = run_training_case(named, contenders, reps=a.reps, progress=progress,
                                  device=a.device, dtype=DTYPES[d])
            results.append(r)
            with rows.open("a") as f:
                f.write(json.dumps(_row(r), default=str) + "\n")
    progress.show("done", final=True)
    meta = run_meta(here.parent, f"{a.reps} interleaved repetitions per contender (round "
                    "robin, order rotating), median ± half the IQR, each step synchronized "
                    "(torch.cuda.synchronize); one step = the compiled forward + loss, "
                    "backward(), SGD step, zero_grad (benchmarks/training.py); the first 3 "
                    "steps checked against eager's losses and parameters (bf16/f16 at "
                    f"{LOWP_TOL}); compile s = the first step: cold with empty caches, warm "
                    "in a new compiled object with the disk caches kept.")
    meta["gpu"] = gpu_meta(a.device)
    text = markdown(results, meta, who) + f"\nGPU: {meta['gpu']}\n" + memory_section(results, who)
    (a.out / f"{stem}.md").write_text(text)
    (a.out / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "cases": [asdict(r) for r in results]}, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    # Run as the module `training`, the one suites.py imports its TrainCase from: as `__main__`
    # this file's TrainCase is a second class, and no suite case passes isinstance (the H200 run
    # of 2026-12-02 ran zero cases that way).
    import training

    raise SystemExit(training.main())
