"""benchmarks/realtime.py: the zoo's timed calls under SCHED_FIFO (`zoo.py --realtime`). What is
tested: inside the block every thread of the process is real-time (one running before it, and
one started in it); after it each is back under its own policy; without the permission the
block still runs and says why."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from tests.bench_scripts import load_script

rt = load_script("realtime")


def _policy(tid: int) -> int:
    return os.sched_getscheduler(tid)


def _can_fifo() -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (PermissionError, AttributeError):
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


@pytest.mark.skipif(not hasattr(os, "SCHED_FIFO") or not _can_fifo(),
                    reason="SCHED_FIFO needs CAP_SYS_NICE (root)")
def test_every_thread_is_real_time_in_the_block_and_normal_after() -> None:
    stop = threading.Event()
    tids: dict[str, int] = {}
    seen: dict[str, int] = {}

    def worker(name: str, started: threading.Event) -> None:
        tids[name] = threading.get_native_id()
        started.set()
        stop.wait()

    def start(name: str) -> threading.Thread:
        started = threading.Event()
        t = threading.Thread(target=worker, args=(name, started), daemon=True)
        t.start()
        started.wait()
        return t

    before = start("before")
    with rt.realtime() as reason:
        assert reason is None
        inside = start("inside")  # (inherits its creator's policy)
        for name, tid in tids.items():
            seen[name] = _policy(tid)
        seen["main"] = _policy(threading.get_native_id())
    after = {name: _policy(tid) for name, tid in tids.items()}
    after["main"] = _policy(threading.get_native_id())
    stop.set()
    before.join()
    inside.join()
    assert set(seen.values()) == {os.SCHED_FIFO}, seen
    assert set(after.values()) == {os.SCHED_OTHER}, after


def test_without_permission_the_block_runs_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any) -> None:
        raise PermissionError("not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    ran = []
    with rt.realtime() as reason:
        ran.append(1)
    assert ran and reason is not None and "permission" in reason
    with rt.realtime(False) as reason:
        assert reason == "disabled"
