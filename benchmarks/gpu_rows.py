"""What the decode benchmarks (decode_gemv_gpu.py, decode_step_gpu.py) share: the provenance
each JSON row carries (device, torch, triton, the commit from EMBER_COMMIT), appending rows to
OUT/<name>.jsonl, and the host-side timing of a call (wall clock, the device synchronized
around each call, the median over rounds)."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def version_of(name: str) -> str:
    """The installed distribution's version, "" where there is none."""
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def provenance(device: str) -> dict[str, str]:
    """The fields every row starts with: where and with what it was measured."""
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__, "triton": version_of("triton"),
            "commit": os.environ.get("EMBER_COMMIT", "")}


def append_rows(name: str, rows: list[dict[str, Any]]) -> None:
    """Append `rows` to OUT/<name> as JSON lines (nothing where OUT is not set)."""
    out = os.environ.get("OUT")
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    with (Path(out) / name).open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def host_ms(fn: Callable[[], Any], *, reps: int, calls: int,
            before: Callable[[], None] | None = None) -> float:
    """ms per call of fn(): the median over `reps` rounds of `calls` calls, each timed alone by
    the wall clock with the device synchronized before and after (on CUDA); `before` runs
    ahead of each call, untimed (a cache position reset)."""
    cuda = torch.cuda.is_available()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        sync()
        t = 0.0
        for _ in range(calls):
            if before is not None:
                before()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            t += time.perf_counter() - t0
        out.append(t / calls * 1e3)
    return float(round(statistics.median(out), 4))
