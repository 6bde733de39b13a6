"""ember's benchmarks: `python3 dev.py bench` (or `.venv/bin/python benchmarks/run.py`).

Each suite runs eager, torch.compile and ember side by side in one process and reports times and
ratios; results are written to benchmarks/results/ with the machine, versions and date. Numbers
are measured, never asserted.

Suites so far:
- `guards`: the per-call cost of a compiled function's guards and call path, on MLPs of 1, 5
  and 20 layers (3, 11 and 41 graph inputs): ember's generated guard function alone, and a whole
  call of eager, of `torch.compile(backend="eager")` (TorchDynamo's guards + the FX graph run by
  eager) and of `ember.runtime.compile(backend="eager")` on tiny inputs, where the call overhead
  dominates.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import timeit
import warnings
from pathlib import Path

import torch
from torch import nn

from ember.runtime import compile as ember_compile
from ember.runtime.bench import guard_cost

RESULTS = Path(__file__).resolve().parent / "results"


def _best_us(fn: object, number: int = 2000, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6  # type: ignore


def suite_guards() -> list[str]:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    rows = ["| layers | graph inputs | guards | ember guard check µs | eager call µs | "
            "torch.compile(eager) call µs | ember(eager) call µs | ember / torch.compile |",
            "|---|---|---|---|---|---|---|---|"]
    for layers in (1, 5, 20):
        g = guard_cost(layers)
        t_eager, t_tc, t_em = _call_costs(layers)
        rows.append(f"| {layers} | {g.inputs} | {g.guards} | {g.guard_us:.2f} | {t_eager:.1f} | "
                    f"{t_tc:.1f} | {t_em:.1f} | {t_em / t_tc:.2f}x |")
    return rows


def _call_costs(layers: int) -> tuple[float, float, float]:
    """Microseconds per call: eager, torch.compile(backend="eager"), ember (eager backend)."""
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])
    x = torch.randn(2, 8)
    tc = torch.compile(m, backend="eager")
    em = ember_compile(m, backend="eager")
    with torch.no_grad():
        tc(x)
        em(x)
        return _best_us(lambda: m(x)), _best_us(lambda: tc(x)), _best_us(lambda: em(x))


SUITES = {"guards": suite_guards}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"torch {torch.__version__}, {platform.system()} {platform.release()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("suites", nargs="*", default=list(SUITES))
    ap.add_argument("--tag", default=platform.node() or "machine")
    a = ap.parse_args()
    now = dt.datetime.now(dt.UTC)
    out = [f"# benchmarks {now:%Y-%m-%d %H:%M} UTC", "", f"Machine: {machine()}", ""]
    for name in a.suites:
        out += [f"## {name}", "", *SUITES[name](), ""]
    text = "\n".join(out)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{now:%Y-%m-%d}-{a.tag}.md"
    path.write_text(text)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
