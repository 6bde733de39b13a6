"""The model zoo's worker (benchmarks/zoo.py runs it): builds a model, runs eager once (the
reference), compiles it with each compiler (cold, then warm), checks the outputs against eager's,
records what each compiler did, then times eager and the compiled functions interleaved. See
zoo.py's docstring for the method.

    python benchmarks/zoo_worker.py --threads N [zoo.py's worker options]   (models on stdin)

It reads one line per model from stdin, `EVENTS<TAB>NAME`, runs that model and writes its
steps to the JSON-lines file EVENTS: `begin`, the model's own events (flushed line by line, so
a killed worker keeps its finished steps), then `end`; then it reads the next line, and exits at
end of input. zoo.py's driver sends the next model only after the `end` of the last, so it
knows which model is in flight: a timeout or crash costs that model alone (the driver starts a
new process for the rest). Between models the process drops what it compiled: dynamo is reset,
inductor's in-memory caches are cleared, ember forgets its loaded kernels, and each model's
cold compile gets fresh cache directories (or --cache-dir's). What a process keeps are its
imports and torch.compile's per-process setup (the vector-ISA check builds, the precompiled
header, its compile-worker pool): so a model after the first is compiled "not cold".
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
if (ROOT / ".devlibs").is_dir():  # `bytecode` carried to a machine with no index (README)
    sys.path.append(str(ROOT / ".devlibs"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from realtime import realtime  # noqa: E402
from zoo_models import BY_NAME, FULL, TINY, Model, Size, tm  # noqa: E402

from ember.runtime.bench import calibrate, interleaved, quartiles  # noqa: E402

COMPILERS = ("torch.compile", "ember")
RTOL, ATOL = 1e-3, 1e-3
LIBRARY = {"torchvision": "torchvision", "timm": "timm", "hf": "transformers"}


def model_named(name: str) -> Model | None:
    """A zoo model by name, or `timm/NAME` for any other timm model (ad hoc runs outside the
    zoo's models, built as the zoo builds its timm models: random weights, its own input size)."""
    if name in BY_NAME:
        return BY_NAME[name]
    if name.startswith("timm/") and name[5:].replace("_", "").replace(".", "").isalnum():
        return tm(name[5:], "ad hoc", "not in the zoo")
    return None


class Events:
    """The worker's JSON-lines log, flushed after every line (a killed worker keeps its steps)."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, event: str, **data: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"event": event, **data}, default=str) + "\n")


def _short(e: BaseException, frames: int = 3) -> str:
    """The exception in one line, with the innermost frames' locations (for diagnosis)."""
    tb = traceback.extract_tb(e.__traceback__)[-frames:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(tb))
    return f"{type(e).__name__}: {' '.join(str(e).split())[:400]}" + (f" [at {where}]"
                                                                      if where else "")


def _out(x: Any) -> Any:
    """The tensors compared: an HF output's logits (or last hidden state), else the output."""
    for attr in ("logits", "last_hidden_state"):
        v = getattr(x, attr, None)
        if v is not None:
            return v
    return x


def _scale(x: Any) -> float:
    import torch
    from torch.utils._pytree import tree_leaves
    m = 0.0
    for t in tree_leaves(x):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            fin = t[torch.isfinite(t)]
            if fin.numel():
                m = max(m, float(fin.abs().max()))
    return m


def compare(got: Any, want: Any) -> str:
    import torch
    want = _out(want)
    try:
        torch.testing.assert_close(_out(got), want, rtol=RTOL, atol=ATOL * max(1.0, _scale(want)),
                                   equal_nan=True)
    except (AssertionError, TypeError, ValueError) as e:
        return "MISMATCH: " + " ".join(str(e).split())[:400]
    return "ok"


class TorchCompile:
    """torch.compile (default inductor): cold = a fresh inductor cache directory and dynamo
    reset; warm = dynamo reset with the disk cache kept. What dynamo did is read from its
    counters right after the cold compile (cleared by `cold`: a process may compile several
    models one after another)."""

    name = "torch.compile"

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def make(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import torch
        return torch.compile(fn)

    def cold(self, d: Path) -> None:
        import torch._dynamo
        import torch._inductor.utils
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
        torch._dynamo.reset()
        torch._inductor.utils.clear_caches()
        torch._dynamo.utils.counters.clear()

    def after_cold(self) -> None:
        import torch._dynamo
        c = torch._dynamo.utils.counters
        breaks = {k: v for k, v in c["graph_break"].items()}
        frames_failed = c["frames"]["total"] - c["frames"]["ok"]
        graphs = c["stats"]["unique_graphs"]
        status = f"{graphs} graph(s)"
        if breaks:
            status += f"; {sum(breaks.values())} graph break(s)"
        if frames_failed:
            status += f"; {frames_failed} frame(s) failed to compile (run eagerly)"
        self.seen = {"status": status, "graphs": graphs,
                     "breaks": [f"{n}× {k}" for k, n in breaks.items()],
                     "break_count": sum(breaks.values()), "frames_failed": frames_failed,
                     "fallbacks": [f"{k} ({n}×)" for k, n in c["unimplemented"].items()]
                     if frames_failed else []}

    def warm(self) -> None:
        import torch._dynamo
        import torch._inductor.utils
        torch._dynamo.reset()
        torch._inductor.utils.clear_caches()

    def describe(self, compiled: Any) -> dict[str, Any]:
        return self.seen


class Ember:
    name = "ember"

    def __init__(self, backend: str = "inductor") -> None:
        self.backend = backend

    def make(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        from ember.runtime.compile import compile
        return compile(fn, backend=self.backend)  # type: ignore[no-any-return]

    def cold(self, d: Path) -> None:
        from ember.inductor import cache
        os.environ["EMBER_CACHE_DIR"] = str(d)
        cache.forget_loaded()

    def after_cold(self) -> None:
        pass

    def warm(self) -> None:
        from ember.inductor import cache
        cache.forget_loaded()

    def describe(self, compiled: Any) -> dict[str, Any]:
        from ember.runtime.bench import ember_status
        info = ember_status(compiled)
        info.pop("notes", None)
        info["break_count"] = len(info.get("breaks", []))
        return info


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def _descendants_cpu() -> dict[int, float]:
    """CPU seconds (own + reaped children's) of every live descendant process, by pid, from
    /proc (empty where there is no /proc)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
            # after the command's ")": state, ppid, ... utime stime cutime cstime at 11..14
            parent[int(d.name)] = int(rest[1])
            cpu[int(d.name)] = sum(int(x) for x in rest[11:15]) / tick
    me, out = os.getpid(), {}
    for pid in cpu:
        p, seen = parent.get(pid), 0
        while p is not None and p > 1 and seen < 64:
            if p == me:
                out[pid] = cpu[pid]
                break
            p, seen = parent.get(p), seen + 1
    return out


def _cpu_mark() -> tuple[float, dict[int, float]]:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system, _descendants_cpu()


def _cpu_since(mark: tuple[float, dict[int, float]]) -> float:
    """CPU seconds since `mark`: this process, children it reaped, and live descendants."""
    own, desc = _cpu_mark()
    return own - mark[0] + sum(c - mark[1].get(pid, 0.0) for pid, c in desc.items())


def worker(model: Model, size: Size, emit: Events, compilers: list[str], reps: int,
           warm: bool, check_only: bool = False, ember_backend: str = "inductor",
           clock_name: str = "wall", rt: bool = False, cache_dir: Path | None = None,
           scratch: list[Path] | None = None) -> int:
    """One model's steps, as events (`scratch` collects the cold cache directories made, for the
    caller to remove once the model is done)."""
    clock = CLOCKS[clock_name]
    try:
        import importlib
        importlib.import_module(LIBRARY[model.family])
    except Exception as e:  # noqa: BLE001  (a broken install is as good as a missing one)
        emit("skipped", reason=f"{LIBRARY[model.family]} not importable "
                               f"({type(e).__name__}: {' '.join(str(e).split())[:200]})")
        return 0
    import torch
    warnings.filterwarnings("ignore")
    with torch.no_grad():
        try:
            torch.manual_seed(0)
            fn, args = model.build(size)
        except Exception as e:  # noqa: BLE001
            emit("error", reason="build failed: " + _short(e))
            return 0
        t = time.perf_counter()
        want = fn(*args)
        emit("built", eager_first_s=time.perf_counter() - t,
             params=sum(p.numel() for p in getattr(fn, "parameters", lambda: [])()),
             inputs=[list(a.shape) for a in args if isinstance(a, torch.Tensor)],
             eager_finite=all(bool(torch.isfinite(t).all()) for t in
                              torch.utils._pytree.tree_leaves(_out(want))
                              if isinstance(t, torch.Tensor) and t.is_floating_point()))
        runs: dict[str, Callable[..., Any]] = {"eager": fn}
        # ember first: a model that times out in torch.compile's long cold compile still
        # reports what ember did
        for who in sorted(compilers, key=lambda w: w != "ember"):
            c: TorchCompile | Ember = (TorchCompile() if who == "torch.compile"
                                       else Ember(ember_backend))
            if cache_dir is not None:  # shared with other models and runs: not cold
                tmp = cache_dir / who.replace(".", "_")
                tmp.mkdir(parents=True, exist_ok=True)
            else:
                tmp = Path(tempfile.mkdtemp(prefix=f"zoo-{who}-"))  # (~1-10 MB a model)
                if scratch is not None:
                    scratch.append(tmp)
            try:
                c.cold(tmp)
                mark = _cpu_mark()
                t = time.perf_counter()
                compiled = c.make(fn)
                got = compiled(*args)
                cold_s = time.perf_counter() - t
                cold_cpu_s = _cpu_since(mark)
                c.after_cold()
                check = compare(got, want)
                if check_only and check == "ok":  # a second call: guards, caches, recompiles
                    check = compare(compiled(*args), want)
                    check = check if check == "ok" else "second call: " + check
                warm_s = None
                if warm and not check_only:
                    c.warm()
                    t = time.perf_counter()
                    compiled = c.make(fn)
                    compiled(*args)
                    warm_s = time.perf_counter() - t
                emit("compiled", who=who, cold_s=cold_s, cold_cpu_s=cold_cpu_s,
                     warm_s=warm_s, check=check,
                     info=c.describe(compiled))
                runs[who] = compiled
            except Exception as e:  # noqa: BLE001  (the compiler failed: its result, not ours)
                emit("compile_error", who=who, error=_short(e))
        if check_only:
            return 0
        with realtime(rt) as not_rt:  # (benchmarks/realtime.py: the timed calls only)
            if rt and not_rt:
                emit("note", text=f"--realtime: timed under the normal scheduler: {not_rt}")
            for n, f in list(runs.items()):
                try:
                    for _ in range(2):
                        f(*args)
                except Exception as e:  # noqa: BLE001
                    emit("run_error", who=n, error=_short(e))
                    del runs[n]
            number = calibrate(fn, args, 0.005, clock)
            samples = interleaved(runs, args, reps, number=number, clock=clock)
        timings = {}
        for n, s in samples.items():
            med, q1, q3 = quartiles(s)
            timings[n] = {"ms": med, "q1": q1, "q3": q3, "calls": len(s) * number}
        emit("timed", timings=timings)
    return 0


def forget_compiled() -> None:
    """Drop what this process compiled, so the next model compiles from its caches on disk
    alone: dynamo's code caches and counters, inductor's in-memory caches, ember's table of
    loaded kernels (their libraries stay mapped, unused)."""
    if "torch" in sys.modules:
        import torch._dynamo
        import torch._inductor.utils
        torch._dynamo.reset()
        torch._inductor.utils.clear_caches()
        torch._dynamo.utils.counters.clear()
    if "ember.inductor.cache" in sys.modules or "ember.inductor.targets.cpu.cache" in sys.modules:
        from ember.inductor import cache
        cache.forget_loaded()
    gc.collect()


def serve(a: argparse.Namespace, lines: Any = None) -> int:
    """Run the models named on stdin (`EVENTS<TAB>NAME` a line), one after another, until end
    of input. An exception escaping a model ends the process (status 1, traceback in its log):
    the driver reports that model as crashed and goes on in a new process, as it would have
    with one process per model."""
    nth = 0
    for line in lines if lines is not None else sys.stdin:
        if not line.strip():
            continue
        path, name = line.rstrip("\n").split("\t", 1)
        model = model_named(name)
        emit = Events(Path(path))
        nth += 1
        emit("begin", model=name, nth_in_process=nth, pid=os.getpid())
        t = time.perf_counter()
        scratch: list[Path] = []
        if model is None:
            emit("error", reason=f"unknown model {name}")
        else:
            worker(model, TINY if a.tiny else FULL, emit, a.compilers, a.reps, a.warm,
                   a.check_only, a.ember_backend, a.clock, a.realtime, a.cache_dir, scratch)
        forget_compiled()
        for d in scratch:
            shutil.rmtree(d, ignore_errors=True)
        emit("end", seconds=time.perf_counter() - t)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--compilers", default=",".join(COMPILERS))
    ap.add_argument("--no-warm", dest="warm", action="store_false")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--ember-backend", default="inductor")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    ap.add_argument("--realtime", action="store_true")
    ap.add_argument("--cache-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    a.compilers = [c for c in a.compilers.split(",") if c]
    import torch
    torch.set_num_threads(a.threads)
    return serve(a)


if __name__ == "__main__":
    raise SystemExit(main())
