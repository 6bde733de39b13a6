"""ember's benchmarks: `python3 dev.py bench [-- OPTIONS]` (or `.venv/bin/python benchmarks/run.py`).

Runs eager, torch.compile (default inductor) and ember (`ember.runtime.compile`, backend
"inductor") in one process on the cases of benchmarks/suites.py, interleaved, with torch's
thread count set to the number of cores. Writes benchmarks/results/<date>-<tag>.{json,md,png}
and latest.{json,md,png}. Numbers are measured, never asserted.

    --suite micro|models|training|all   which cases (default all; training: training steps,
                               benchmarks/training.py, with peak memory per step)
    --filter TEXT              only cases whose name contains TEXT
    --quick                    3 repetitions (a smoke run; numbers are rough)
    --no-torch-compile         leave torch.compile out (its cold compiles take 10-25 s each)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from suites import SUITES  # noqa: E402
from training import TrainCase, memory_section, run_training_case  # noqa: E402

from ember.runtime.bench import (  # noqa: E402
    Contender,
    Progress,
    eager_contender,
    ember_contender,
    guard_cost,
    run_case,
    run_meta,
    write_results,
)

RESULTS = ROOT / "benchmarks" / "results"


def _torch_cold(d: Path) -> None:
    """A fresh inductor cache directory and none of dynamo's or inductor's in-process state."""
    import torch._dynamo
    import torch._inductor.utils
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    torch._dynamo.reset()
    torch._inductor.utils.clear_caches()


def _torch_warm() -> None:
    """As a new process would start: the on-disk caches kept, the in-process state dropped."""
    import torch._dynamo
    import torch._inductor.utils
    torch._dynamo.reset()
    torch._inductor.utils.clear_caches()


def torch_compile_contender() -> Contender:
    return Contender("torch.compile", lambda fn: torch.compile(fn), _torch_cold, _torch_warm)


def guards_section() -> str:
    rows = ["", "## Guard checks", "",
            "ember's generated guard function alone, per call (MLPs of nn.Linear(8, 8); best "
            "of 9 × 2000 calls):", "",
            "| layers | graph inputs | guards | µs per check | µs per guard |",
            "|---|---|---|---|---|"]
    for layers in (1, 5, 20):
        g = guard_cost(layers)
        rows.append(f"| {layers} | {g.inputs} | {g.guards} | {g.guard_us:.2f} | "
                    f"{g.per_guard_us:.3f} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--quick", action="store_true", help="3 repetitions (smoke)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per contender")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--tag", default=f"cpu-{os.cpu_count()}core")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(os.cpu_count() or 1)
    suites = list(SUITES) if a.suite == "all" else [a.suite]
    cases = [c for s in suites for c in SUITES[s]() if a.filter.lower() in c.name.lower()]
    if not cases:
        print(f"no case matches --filter {a.filter!r}", file=sys.stderr)
        return 2
    reps = a.reps or (3 if a.quick else 15)
    contenders = [eager_contender()]
    if not a.no_torch_compile:
        contenders.append(torch_compile_contender())
    contenders.append(ember_contender())
    who = [c.name for c in contenders]
    progress = Progress(len(cases))
    results = []
    for case in cases:
        run = run_training_case if isinstance(case, TrainCase) else run_case
        results.append(run(case, contenders, reps=reps, progress=progress))
    progress.show("done", final=True)
    meta = run_meta(ROOT, f"{reps} interleaved repetitions per contender (round robin, order "
                    f"rotating), median ± half the IQR; compile s = the first call (compile + "
                    f"one run): cold with empty caches, warm in a new compiled object with the "
                    f"disk caches kept; inference cases under torch.no_grad().")
    if "training" in suites:
        meta["method"] += (" Training cases: one step = the compiled forward + loss, backward(), "
                           "SGD step, zero_grad (benchmarks/training.py), timed one step per "
                           "sample; the first 3 steps checked against eager's losses and "
                           "parameters.")
    meta["suites"], meta["quick"] = suites, a.quick
    extra = guards_section() if "micro" in suites and not a.filter else ""
    extra += memory_section(results, who)
    stem = f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-{a.tag}" + ("-quick" if a.quick else "")
    # latest.* is the whole bench: a run of one suite does not replace it
    paths = write_results(results, meta, who, a.out, stem,
                          latest=not a.quick and a.suite == "all", extra=extra)
    print(paths[1].read_text())
    print("wrote " + ", ".join(str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
                               for p in paths), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
