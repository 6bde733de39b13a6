"""benchmarks/zoo.py's census mode (issue 18): `--clock thread` times calls by the calling
thread's CPU time (stable on a loaded machine at 1 thread), and cold compile reports CPU seconds
that include child and descendant processes (g++, torch.compile's compile workers)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.bench_scripts import load_script

zoo = load_script("zoo", "zoo_census")
worker = load_script("zoo_worker", "zoo_worker_census")


def _sleepy(size: Any) -> tuple[Any, tuple[Any, ...]]:
    import torch

    def fn(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)  # wall time that is no work of this thread
        return x + 1

    return fn, (torch.ones(4),)


@pytest.mark.parametrize("clock", ["thread", "wall"])
def test_thread_clock_counts_work_not_waiting(tmp_path: Path, clock: str) -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed (the fake model's family must import)")
    model = worker.Model("fake/sleepy", "hf", "mlp", _sleepy, "sleeps 20 ms, adds 1")
    events = tmp_path / "ev.jsonl"
    assert worker.worker(model, worker.TINY, worker.Events(events), [], 2, False,
                         clock_name=clock) == 0
    timed = [json.loads(x) for x in events.read_text().splitlines()][-1]
    ms = timed["timings"]["eager"]["ms"]
    assert (ms < 10.0) if clock == "thread" else (ms >= 19.0), (clock, ms)


def test_cold_cpu_counts_reaped_and_live_descendants() -> None:
    busy = [sys.executable, "-c", "import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\nimport sys; sys.stdout.write('x')\n"
            "sys.stdout.flush(); time.sleep(30)"]
    mark = worker._cpu_mark()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.3: pass"], check=True)  # reaped child
    live = subprocess.Popen(busy, stdout=subprocess.PIPE)  # a pool worker that stays alive
    try:
        assert live.stdout is not None and live.stdout.read(1) == b"x"
        assert worker._cpu_since(mark) >= 0.55
        assert live.pid in worker._descendants_cpu()
    finally:
        live.kill()
        live.wait()


def test_census_cells_show_cold_cpu() -> None:
    assert zoo._compile_cell({"cold_s": 12.0, "cold_cpu_s": 30.5, "warm_s": None}) \
        == "12.0 (30.5 CPU) / —"
    assert zoo._compile_cell({"cold_s": 2.0, "warm_s": 1.5}) == "2.00 / 1.50"
    with pytest.raises(SystemExit):
        zoo.main(["--clock", "cpu", "--list"])
