"""The model zoo (issue 18): eager, torch.compile and ember on ~50 torchvision, timm and Hugging
Face architectures (benchmarks/zoo_models.py), random weights, inference, f32, batch 2.

    python benchmarks/zoo.py --list
    python benchmarks/zoo.py --models all|NAME,NAME,... --threads N --out DIR --timeout S
                             --budget S [--shard K/N] [--reps R] [--compilers ember,torch.compile]
    python benchmarks/zoo.py --merge A.json B.json ... --out DIR     (shards -> one report)

Each model runs in a worker process (benchmarks/zoo_worker.py), with a timeout: a crash or hang
in one model is that model's result, not the suite's. By default each model gets its own
process; `--per-process N` gives a process up to N models one after another (0: no limit), so
its imports and torch.compile's per-process setup (~10 s and ~60 s a process on the 16-core
machine) are paid once: the model in flight is killed with its process on a timeout, and the
rest go on in a new one; compiles after a process's first model are then labelled not cold.
In the worker: the model is built (seed 0), eager runs it
once (the reference), then each compiler's first call is timed cold (fresh cache directories, a
fresh process) and warm (a new compiled object with the disk caches kept, in-process state
dropped), its output is checked against eager's, and what it did is recorded (ember: graphs,
kernels, graph breaks, fallbacks to eager, with reasons; torch.compile: dynamo's graph count,
graph breaks with reasons and frames it failed on). Then warm-up calls and `--reps` timed
repetitions interleaved round robin (order rotating; tiny calls batched to >= 5 ms per sample).
The worker writes one JSON line per step, so a timeout still reports the steps that finished.

Cold compile is reported as wall seconds and as CPU seconds: the worker's own CPU plus its
children's (`os.times`: g++ runs it waited for) plus what its still-running descendants used
meanwhile (read from /proc: torch.compile's compile-worker pool, ember's build processes).

`--clock thread` (the census mode for a loaded machine) times each call by the calling thread's
CPU time (`time.thread_time`) instead of wall time: with `--threads 1` (every kernel, OpenMP
included, runs on that thread) it is the call's own work, little moved by other processes on
the machine, where wall time under load is mostly waiting. With more threads it would count
only the main thread (and its OpenMP spin-waits): use it with `--threads 1`.
    python benchmarks/zoo.py --threads 1 --clock thread --reps 5 --no-warm --shard 1/2

Correct = `torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-3 * max(1, max|eager|),
equal_nan=True)` on the logits (or last hidden state) — an absolute tolerance relative to the
output's scale, since random-weight deep nets have outputs of very different magnitudes.

`--realtime` (the census mode for `--threads 2` on this shared 2-core machine) runs the warm-up
and timed calls with all of the worker's threads under SCHED_FIFO (benchmarks/realtime.py), the
compiles under the normal scheduler: a 2-thread call is otherwise mostly waiting for its cores.

`--budget` stops starting models when the time is spent (a running model's timeout is cut to
what is left) and the results (`zoo-<date>-<tag>.json` and `.md` in --out) are rewritten after
every model, so a run cut short still leaves a report. Models whose library does not import are
reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

# (zoo_worker, the worker's script, sets up the path to .devlibs and the HF offline variables
# at import, before anything imports a model library)
from zoo_worker import ATOL, CLOCKS, COMPILERS, RTOL, model_named  # noqa: E402, I001
from zoo_models import BY_NAME, TINY, ZOO, Model  # noqa: E402, F401  (BY_NAME: for tests)

# ---- the driver --------------------------------------------------------------------------------


def _tail(path: Path, n: int = 1500) -> str:
    with contextlib.suppress(OSError):
        return " ".join(path.read_text(errors="replace")[-n:].split())
    return ""


def record_of(model: Model, events: list[dict[str, Any]]) -> dict[str, Any]:
    """A model's result from the worker's events (`status` is set by the caller if the worker
    did not finish)."""
    rec: dict[str, Any] = {"name": model.name, "family": model.family, "kind": model.kind,
                           "what": model.what, "status": "done", "reason": "", "contenders": {}}
    con = rec["contenders"]
    for ev in events:
        kind = ev.pop("event")
        if kind == "begin":  # (which process ran it, and how many models it had run)
            rec["process"] = {"pid": ev.get("pid"), "nth": ev.get("nth_in_process")}
        elif kind in ("skipped", "error"):
            rec["status"], rec["reason"] = kind, ev["reason"]
        elif kind == "built":
            rec["built"] = ev
        elif kind == "compiled":
            con[ev.pop("who")] = ev
        elif kind in ("compile_error", "run_error"):
            con.setdefault(ev.pop("who"), {})["error"] = ev["error"]
        elif kind == "timed":
            for who, t in ev["timings"].items():
                con.setdefault(who, {}).update(t)
        elif kind == "note":
            rec.setdefault("notes", []).append(ev["text"])
    return rec


@dataclass
class Job:
    """A worker process (benchmarks/zoo_worker.py) in slot `slot` (its own set of cores) and the
    model it is running: `index` in the run's list, sent at `start`, killed after `timeout`."""

    slot: int
    proc: subprocess.Popen[bytes]
    log: Path
    index: int = -1
    model: Model | None = None
    start: float = 0.0
    timeout: float = 0.0
    events: Path = Path()
    count: int = 0  # models this process was given

    def send(self, index: int, model: Model, timeout: float, logdir: Path) -> None:
        """Give the process its next model; the model's clock starts now (the first model's
        at the process's start: its imports count, as they did with one process a model)."""
        self.events = logdir / f"{model.name.replace('/', '_')}.jsonl"
        self.events.unlink(missing_ok=True)
        if self.count:
            self.start = time.monotonic()
        self.index, self.model, self.timeout, self.count = index, model, timeout, self.count + 1
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError):  # (it died: seen as a crash when polled)
            stdin.write(f"{self.events}\t{model.name}\n".encode())
            stdin.flush()

    def ended(self) -> bool:
        """Whether the model in flight has written its `end` event."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            last = self.events.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1]
            return bool(json.loads(last).get("event") == "end")
        return False


def spawn(a: argparse.Namespace, logdir: Path, slot: int, cores: list[int] | None,
          serial: int) -> Job:
    """A new worker process; its models come later, one at a time, on its stdin."""
    cmd = [sys.executable, str(HERE / "zoo_worker.py"), "--threads", str(a.threads),
           "--reps", str(a.reps), "--compilers", ",".join(a.compilers)] \
        + (["--tiny"] if a.tiny else []) \
        + ([] if a.warm else ["--no-warm"]) + (["--check-only"] if a.check_only else []) \
        + ["--ember-backend", a.ember_backend, "--clock", a.clock] \
        + (["--realtime"] if a.realtime else []) \
        + (["--cache-dir", str(a.cache_dir)] if a.cache_dir else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))  # ember's OpenMP kernels too

    def pin() -> None:  # (inherited by g++ and inductor's compile workers)
        if cores is not None:
            os.sched_setaffinity(0, cores)

    log_path = logdir / f"worker-{slot}-{serial}.log"
    with log_path.open("w") as log:
        # its own session: on a timeout the whole group goes (g++, inductor's compile workers)
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                             env=env, cwd=ROOT, start_new_session=True,
                             preexec_fn=pin if cores else None)
    return Job(slot, p, log_path, start=time.monotonic())


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the process and everything in its session (compile workers, g++)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def finish(job: Job, a: argparse.Namespace) -> dict[str, Any]:
    """The record of the job's model once it has ended; if it has not and its process is alive,
    it is past its time: the process is killed. Where the process is gone without the model's
    `end`, the model crashed it."""
    assert job.model is not None
    ended = job.ended()
    rc = job.proc.poll()
    if not ended and rc is None:
        _kill(job.proc)
    events = []
    with contextlib.suppress(OSError):
        for line in job.events.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    rec = record_of(job.model, events)
    rec["seconds"] = round(time.monotonic() - job.start, 1)
    if not ended and rc is None:
        cut = job.timeout < a.timeout
        rec["status"] = "budget" if cut else "timeout"
        rec["reason"] = (f"stopped after {job.timeout:.0f} s: the time budget ran out" if cut
                         else f"timed out after {job.timeout:.0f} s")
        rec["log_tail"] = _tail(job.log, 600)
    elif not ended:
        rec["status"], rec["reason"] = "crashed", f"worker exited with status {rc}"
        rec["log_tail"] = _tail(job.log)
    return rec


def slots(a: argparse.Namespace) -> list[list[int] | None]:
    """`--jobs` disjoint sets of `--threads` cores (one job, or --share-cores: no pinning)."""
    if a.jobs == 1 or getattr(a, "share_cores", False):
        return [None] * a.jobs
    cores = _by_physical_core(sorted(os.sched_getaffinity(0)))
    if a.jobs * a.threads > len(cores):
        raise SystemExit(f"zoo: --jobs {a.jobs} × --threads {a.threads} needs "
                         f"{a.jobs * a.threads} cores; this process has {len(cores)}")
    return [cores[k * a.threads:(k + 1) * a.threads] for k in range(a.jobs)]


def _by_physical_core(cpus: list[int]) -> list[int]:
    """One hyperthread of every physical core first, then the siblings: slots then take
    whole cores before sharing any (where sysfs tells the topology)."""
    seen: set[str] = set()
    first: list[int] = []
    for c in cpus:
        try:
            sib = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
            key = sib.read_text().strip()
        except OSError:
            return cpus
        if key not in seen:
            seen.add(key)
            first.append(c)
    return first + [c for c in cpus if c not in first]


def run_all(models: list[Model], a: argparse.Namespace, on_record: Callable[[int], None],
            records: list[dict[str, Any]]) -> None:
    """Run the models in worker processes, `--jobs` at a time, each process given up to
    `--per-process` models one after another (0: no limit), within `--budget`; `records[i]` is
    filled in (and `on_record(i)` called) as each ends. A model past its timeout is killed with
    its process, as is one that crashes it: the slot's next model goes to a new process."""
    logdir = Path(tempfile.mkdtemp(prefix="zoo-logs-"))
    cores = slots(a)
    pending = list(enumerate(models))
    running: dict[int, Job] = {}
    leaving: list[tuple[Job, float]] = []  # given no more models: exiting
    unimportable: dict[str, str] = {}
    t0, spawned = time.monotonic(), 0

    def next_model() -> tuple[int, Model, float] | None:
        while pending and pending[0][1].family in unimportable:
            i, m = pending.pop(0)
            records[i].update(status="skipped", reason=unimportable[m.family])
        left = a.budget - (time.monotonic() - t0)
        if pending and left < 15:  # too little to build and compile anything
            for i, _ in pending:
                records[i]["reason"] = "the time budget ran out before it started"
            pending.clear()
        if not pending:
            return None
        i, m = pending.pop(0)
        return i, m, min(a.timeout, left)

    def leave(job: Job) -> None:
        with contextlib.suppress(OSError):
            if job.proc.stdin:
                job.proc.stdin.close()  # end of input: it exits
        leaving.append((job, time.monotonic()))

    while pending or running or leaving:
        for slot in [k for k in range(len(cores)) if k not in running]:
            if (nxt := next_model()) is not None:
                spawned += 1
                running[slot] = spawn(a, logdir, slot, cores[slot], spawned)
                running[slot].send(*nxt, logdir)
        time.sleep(0.1)
        for slot, job in list(running.items()):
            if not job.ended() and job.proc.poll() is None \
                    and time.monotonic() - job.start < job.timeout:
                continue
            ended = job.ended()
            rec = records[job.index] = finish(job, a)
            if rec["status"] == "skipped" and "not importable" in rec["reason"]:
                assert job.model is not None
                unimportable[job.model.family] = rec["reason"]
            on_record(job.index)
            more = ended and (a.per_process <= 0 or job.count < a.per_process)
            if more and job.proc.poll() is None and (nxt := next_model()) is not None:
                job.send(*nxt, logdir)
            else:
                del running[slot]
                leave(job)
        for job, since in list(leaving):  # exited, or given a minute to
            if job.proc.poll() is not None or time.monotonic() - since > 60:
                _kill(job.proc)  # (its session too: no compile worker outlives it)
                leaving.remove((job, since))
    shutil.rmtree(logdir, ignore_errors=True)


def _ok(rec: dict[str, Any], who: str) -> bool:
    c = rec["contenders"].get(who, {})
    return c.get("check") == "ok" and "error" not in c


def _speedup(rec: dict[str, Any], who: str) -> float | None:
    con = rec["contenders"]
    e, c = con.get("eager", {}).get("ms"), con.get(who, {}).get("ms")
    return e / c if e and c and "error" not in con.get(who, {}) else None


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(records: list[dict[str, Any]], compilers: list[str]) -> dict[str, Any]:
    ran = [r for r in records if r["status"] not in ("skipped", "not run", "budget")]
    both = [r for r in ran if all(_ok(r, w) and _speedup(r, w) for w in compilers)]
    out: dict[str, Any] = {"models": len(records), "ran": len(ran),
                           "skipped": sum(r["status"] == "skipped" for r in records),
                           "not_run": sum(r["status"] in ("not run", "budget")
                                          for r in records),
                           "both_correct_and_timed": len(both)}
    for w in compilers:
        out[w] = {
            "correct": sum(_ok(r, w) for r in ran),
            "with_graph_breaks": sum(bool(r["contenders"].get(w, {}).get("info", {})
                                          .get("break_count")) for r in ran),
            "with_fallbacks": sum(bool(r["contenders"].get(w, {}).get("info", {})
                                       .get("fallbacks")) for r in ran),
            "geomean_speedup": geomean([_speedup(r, w) or 1.0 for r in both]),
            "max_cold_compile_s": max((r["contenders"].get(w, {}).get("cold_s") or 0.0
                                       for r in ran), default=0.0)}
    if len(compilers) == 2 and both:
        a, b = compilers
        out[f"{b} / {a}"] = geomean([(_speedup(r, b) or 1.0) / (_speedup(r, a) or 1.0)
                                     for r in both])
    return out


def _f(x: float | None, unit: str = "") -> str:
    if x is None:
        return "—"
    return (f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}") + unit


def _cell(rec: dict[str, Any], who: str) -> str:
    c = rec["contenders"].get(who)
    if c is None:
        return "—"
    if "error" in c:
        return "FAILED"
    info = c.get("info", {})
    bits = [c.get("check", "—") if c.get("check") == "ok" else "MISMATCH"]
    if info.get("break_count"):
        bits.append(f"{info['break_count']} break(s)")
    if info.get("fallbacks"):
        bits.append(f"{len(info['fallbacks'])} fallback(s)")
    if info.get("eager_graphs"):
        bits.append(f"{len(info['eager_graphs'])} graph(s) eager")
    return ", ".join(bits)


def _compile_cell(c: dict[str, Any]) -> str:
    """'cold (CPU) / warm' seconds; the CPU seconds where the run recorded them."""
    cpu = f" ({_f(c['cold_cpu_s'])} CPU)" if c.get("cold_cpu_s") is not None else ""
    return f"{_f(c.get('cold_s'))}{cpu} / {_f(c.get('warm_s'))}"


def _compile_kind(meta: dict[str, Any]) -> tuple[str, str]:
    """What the first-call column is (the summary's word, the table's): cold only with fresh
    caches in a fresh process."""
    if meta.get("cache_dir"):
        return "cached", "cached compile"
    if meta.get("per_process", 1) != 1:
        return "not cold", "compile (not cold)"
    return "cold", "cold"


def _method(a: argparse.Namespace) -> str:
    n = a.per_process
    procs = ("each model in its own process" if n == 1 else
             f"{n if n > 0 else 'any number of'} models a process, one after another (between "
             f"models dynamo reset, inductor's in-memory caches cleared, ember's loaded kernels "
             f"forgotten; a model that times out or crashes ends its process, the next model "
             f"starts a new one)")
    where = "in a fresh process" if n == 1 else "in a process that may have compiled other " \
        "models before (its imports and torch.compile's per-process setup done)"
    first = (f"cold s = first call with empty caches {where}" if not a.cache_dir and n == 1
             else f"compile s (not cold) = first call with empty caches {where}"
             if not a.cache_dir else
             f"compile s (not cold) = first call {where} with the compile caches of "
             f"--cache-dir, shared by every model and filled by an earlier run")
    return (f"{procs}; {a.reps} interleaved repetitions per contender (round robin, order "
            f"rotating), median ms of "
            + ("the calling thread's CPU time (time.thread_time) per call; " if
               a.clock == "thread" else "wall time per call; ")
            + ("timed calls under SCHED_FIFO (--realtime); " if a.realtime else "")
            + first + " (wall; CPU = the process, its children and its live descendants), "
            f"warm s = first call of a new compiled object with the disk caches kept; correct = "
            f"assert_close vs eager (rtol {RTOL}, atol {ATOL} × max(1, max abs of eager's "
            f"output)); inference under torch.no_grad(), f32, random weights."
            + (" Check only: no timing; each compiled function called twice, both outputs "
               "checked." if a.check_only else ""))


def markdown(records: list[dict[str, Any]], meta: dict[str, Any], compilers: list[str]) -> str:
    m, v, s = meta["machine"], meta["versions"], summary(records, compilers)
    out = [f"# ember model zoo, {meta['date']}", "",
           f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; {meta['threads']} "
           f"torch threads" + (f" × {meta['jobs']} models at a time, each on its own cores"
                             if meta.get("jobs", 1) > 1 else "") + f"; {m['os']}.  ",
           "Versions: " + ", ".join(f"{k}: {x}" for k, x in v.items()) + ".  ",
           *([f"**Smoke sizes** (`--tiny`): HF models at {TINY}."] if meta.get("tiny") else []),
           *([f"Merged from {len(meta['merged'])} runs: " + "; ".join(
               f"{x['file']} ({x['date']}, ember {x['ember']}, {x['reps']} reps)" for x in meta["merged"]) + "."]
             if meta.get("merged") else []),
           f"Method: {meta['method']}", "", "## Summary", "",
           f"{s['models']} models: {s['ran']} run, {s['skipped']} skipped, {s['not_run']} not "
           f"run or cut short by the time budget. Both compilers correct and timed: {s['both_correct_and_timed']}.", ""]
    for w in compilers:
        x = s[w]
        out.append(f"- **{w}**: correct {x['correct']}/{s['ran']}; geomean speedup over eager "
                   f"on the {s['both_correct_and_timed']} models both got right "
                   f"{_f(x['geomean_speedup'], '×')}; graph breaks in {x['with_graph_breaks']} "
                   f"model(s), fallbacks in {x['with_fallbacks']}; slowest "
                   f"{_compile_kind(meta)[0]} compile "
                   f"{_f(x['max_cold_compile_s'], ' s')}")
    for k, x in s.items():
        if " / " in k:
            out.append(f"- geomean of {k} speedups: {_f(x, '×')}")
    head = ["model", "eager ms"] + [f"{w} ms" for w in compilers] + [f"{w} ×" for w in compilers] \
        + [f"{w} {_compile_kind(meta)[1]} (CPU) / warm s"
           for w in compilers] + compilers
    out += ["", "## Results", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        con = r["contenders"]
        if r["status"] in ("skipped", "not run"):
            continue
        cells = [r["name"], _f(con.get("eager", {}).get("ms"))]
        cells += [_f(con.get(w, {}).get("ms")) for w in compilers]
        cells += [_f(_speedup(r, w), "×") for w in compilers]
        first = meta.get("per_process", 1) != 1 and r.get("process", {}).get("nth") == 1
        cells += [_compile_cell(con.get(w, {})) + (" †" if first else "") for w in compilers]
        cells += [_cell(r, w) if r["status"] == "done" else
                  f"{r['status'].upper()}: {_cell(r, w)}" for w in compilers]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    if meta.get("per_process", 1) != 1:
        out += ["", "† a process's first model: its first compile includes the process's setup "
                    "(torch.compile's vector-ISA check builds, precompiled header, compile "
                    "workers; ember's compiler checks), the later models' do not."]
    out += ["", "## Graph breaks, fallbacks, mismatches and failures", ""]
    for r in records:
        notes = [f"{r['status']}: {r['reason']}"] if r["status"] not in ("done",) else []
        for w in ["eager", *compilers]:
            c = r["contenders"].get(w, {})
            info = c.get("info", {})
            if "error" in c:
                notes.append(f"{w} FAILED: {c['error']}")
            if c.get("check", "ok") != "ok":
                notes.append(f"{w} {c['check']}")
            for key in ("breaks", "fallbacks", "eager_graphs", "reference"):
                notes += [f"{w} {key[:-1] if key != 'reference' else 'reference op'}: {x}"
                          for x in info.get(key, [])]
        notes += r.get("notes", [])
        if r.get("built") and not r["built"].get("eager_finite", True):
            notes.append("note: eager's output has non-finite values")
        if notes:
            out.append(f"- **{r['name']}**: " + "; ".join(" ".join(str(n).split())[:600]
                                                          for n in notes))
    out += ["", "## Models", ""] + [f"- **{r['name']}** ({r['family']}, {r['kind']}): {r['what']}"
                                    for r in records]
    return "\n".join(out) + "\n"


def meta_of(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ember.runtime.bench import machine_info, versions
    v = versions(ROOT)
    if a.commit:  # (the device's copy of the tree has a .git of another commit)
        v["ember"] = a.commit
    for lib in ("torchvision", "timm", "transformers"):
        try:
            v[lib] = __import__(lib).__version__
        except Exception:  # noqa: BLE001
            v[lib] = "not importable"
    return {"date": f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC", "machine": machine_info(),
            "versions": v, "threads": a.threads, "torch_threads_default": torch.get_num_threads(),
            "compilers": a.compilers, "reps": a.reps, "jobs": a.jobs,
            "slots": slots(a), "tiny": a.tiny, "shard": a.shard,
            "check_only": a.check_only, "ember_backend": a.ember_backend,
            "tolerance": {"rtol": RTOL, "atol": f"{ATOL} × max(1, max|eager output|)"},
            "clock": a.clock, "realtime": a.realtime, "cache_dir": str(a.cache_dir or ""),
            "per_process": a.per_process, "share_cores": a.share_cores,
            "method": _method(a)}


def write(records: list[dict[str, Any]], meta: dict[str, Any], compilers: list[str],
          outdir: Path, stem: str) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    js, md = outdir / f"{stem}.json", outdir / f"{stem}.md"
    js.write_text(json.dumps({"meta": meta, "summary": summary(records, compilers),
                              "models": records}, indent=1, default=str) + "\n")
    md.write_text(markdown(records, meta, compilers))
    return [js, md]


def select(a: argparse.Namespace) -> list[Model]:
    if a.models == "all":
        models = list(ZOO)
    else:
        names = [n.strip() for n in a.models.split(",") if n.strip()]
        unknown = [n for n in names if model_named(n) is None]
        if unknown:
            raise SystemExit(f"zoo: unknown model(s) {', '.join(unknown)} (see --list; "
                             f"timm/NAME runs any timm model)")
        models = [m for n in names if (m := model_named(n)) is not None]
    if a.shard:
        k, n = (int(x) for x in a.shard.split("/"))
        if not 1 <= k <= n:
            raise SystemExit(f"zoo: --shard {a.shard}: want K/N with 1 <= K <= N")
        models = models[k - 1::n]
    return models


def merge(paths: list[Path], outdir: Path) -> list[Path]:
    """One report from several runs' JSON (shards): models in zoo order; for a model in several
    runs, the one that got furthest (finished > cut by the budget > not run), else the later."""
    datas = [json.loads(p.read_text()) for p in paths]
    rank = {"not run": 0, "budget": 1}
    by: dict[str, dict[str, Any]] = {}
    for d in datas:
        for r in d["models"]:
            old = by.get(r["name"])
            if old is None or rank.get(r["status"], 2) >= rank.get(old["status"], 2):
                by[r["name"]] = r
    order = {m.name: i for i, m in enumerate(ZOO)}
    records = sorted(by.values(), key=lambda r: order.get(r["name"], len(order)))
    meta = dict(datas[0]["meta"], shard=None, merged=[
        {"file": p.name, "date": d["meta"].get("date"), "reps": d["meta"].get("reps"),
         "ember": d["meta"].get("versions", {}).get("ember")}
        for p, d in zip(paths, datas)])
    stem = paths[0].stem.split("-shard")[0] + "-merged"
    return write(records, meta, list(meta["compilers"]), outdir, stem)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="all", help="all, or a comma-separated list (--list; "
                    "timm/NAME: any timm model, ad hoc)")
    ap.add_argument("--list", action="store_true", help="print the zoo and exit")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per model")
    ap.add_argument("--budget", type=float, default=math.inf,
                    help="seconds for the whole run: no model starts after it")
    ap.add_argument("--jobs", type=int, default=1,
                    help="models at a time, each pinned to its own --threads cores (big hosts)")
    ap.add_argument("--shard", default="", help="K/N: every N-th model from the K-th")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--compilers", default=",".join(COMPILERS),
                    help="comma-separated subset of torch.compile,ember")
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="skip the warm compile (saves time)")
    ap.add_argument("--tiny", action="store_true", help="smoke sizes for the HF models")
    ap.add_argument("--check-only", action="store_true",
                    help="correctness and graph breaks only: no warm compile, no timing; each "
                         "compiled function is called twice and both outputs checked")
    ap.add_argument("--ember-backend", default="inductor",
                    help="ember's backend (e.g. eager: capture's graph breaks without codegen)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="time calls by wall time, or by the calling thread's CPU time "
                         "(thread: for a loaded machine, with --threads 1)")
    ap.add_argument("--realtime", action="store_true",
                    help="time the calls with the worker's threads under SCHED_FIFO (a shared "
                         "machine at --threads > 1: benchmarks/realtime.py; needs root)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="compile caches kept in DIR and shared by every model and run (a "
                         "compile-only run side by side fills them, a timed run reuses them): "
                         "compile times are then not cold")
    ap.add_argument("--tag", default="", help="file name tag (default cpu-<cores>core-<N>t)")
    ap.add_argument("--commit", default="", help="ember's commit, where git cannot tell")
    ap.add_argument("--merge", type=Path, nargs="+", help="JSON results to merge into one")
    ap.add_argument("--per-process", type=int, default=1, metavar="N",
                    help="models a worker process runs one after another (0: no limit): "
                         "imports and torch.compile's per-process setup paid once a process; "
                         "compile times are then not cold after a process's first model")
    ap.add_argument("--share-cores", action="store_true",
                    help="--jobs processes side by side on all the cores, unpinned (a "
                         "check-only pass filling --cache-dir at the timed run's --threads)")
    a = ap.parse_args(argv)
    a.compilers = [c for c in a.compilers.split(",") if c]
    a.cache_dir = a.cache_dir.resolve() if a.cache_dir else None
    if bad := [c for c in a.compilers if c not in COMPILERS]:
        ap.error(f"unknown compiler(s) {', '.join(bad)}: choose from {', '.join(COMPILERS)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.merge:
        for p in merge(a.merge, a.out):
            print(f"wrote {p}", file=sys.stderr)
        return 0
    models = select(a)
    if a.list:
        for m in models:
            print(f"{m.name:32} {m.family:12} {m.kind:12} {m.what}")
        return 0
    meta = meta_of(a)
    tag = a.tag or f"cpu-{os.cpu_count()}core-{a.threads}t" + (
        f"-shard{a.shard.replace('/', 'of')}" if a.shard else "")
    stem = f"zoo-{dt.datetime.now(dt.UTC):%Y-%m-%d}-{tag}"
    records = [record_of(m, []) | {"status": "not run", "reason": "not started"}
               for m in models]

    def done(i: int) -> None:
        rec = records[i]
        print(f"[zoo] {i + 1}/{len(models)} {rec['name']} ({rec['seconds']:.0f} s): "
              + (f"{rec['status']}: {rec['reason']}" if rec["status"] != "done" else
                 "; ".join(f"{w} {_f(_speedup(rec, w), '×')} {_cell(rec, w)}"
                           for w in a.compilers)), file=sys.stderr, flush=True)
        write(records, meta, a.compilers, a.out, stem)

    run_all(models, a, done, records)
    paths = write(records, meta, a.compilers, a.out, stem)
    print(paths[1].read_text())
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
