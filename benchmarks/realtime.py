"""Timing on a shared machine: the timed calls run under the real-time scheduler.

On a machine where other work runs (a 2-core box shared with builds and tests), a call timed at
2 threads is mostly waiting: an OpenMP region ends only when its last thread ends, and a thread
that sleeps at a barrier waits to be scheduled behind whatever else is runnable on its core.
Measured here (tv/resnet18, eager, 2 threads, load ~8): median 588 ms at nice -10 against
41 ms with every thread of the process under SCHED_FIFO, about what a quiet machine gives.

`realtime()` moves every thread of this process (torch's and ember's OpenMP pools included;
threads started meanwhile inherit it from their creator) to SCHED_FIFO for the block and back
to the policy each had after it. Only the timed calls go there: compiles, g++ and the compile
workers stay under the normal scheduler, so the rest of the machine keeps running, and the
kernel's real-time throttle (95% of each second by default) still leaves it a share.
Needs CAP_SYS_NICE (root); without it the block runs as it is and says why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

PRIORITY = 10  # low among real-time priorities: above every normal task, below the kernel's


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # (no /proc: the calling thread only)


@contextlib.contextmanager
def realtime(enabled: bool = True) -> Iterator[str | None]:
    """Run the block with this process's threads under SCHED_FIFO; yields None when they are,
    or the reason they are not (disabled, no permission, no such policy)."""
    if not enabled:
        yield "disabled"
        return
    fifo = getattr(os, "SCHED_FIFO", None)
    if fifo is None:
        yield "no SCHED_FIFO on this platform"
        return
    before: dict[int, tuple[int, int]] = {}
    reason: str | None = None
    for tid in _threads():
        try:
            before[tid] = (os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)
            os.sched_setscheduler(tid, fifo, os.sched_param(PRIORITY))
        except PermissionError:
            reason = "no permission for SCHED_FIFO (needs CAP_SYS_NICE)"
            break
        except (ProcessLookupError, OSError):
            before.pop(tid, None)  # (a thread that ended meanwhile)
    try:
        yield reason
    finally:
        now = set(_threads())
        for tid in now - set(before):  # started in the block: back to normal too
            before[tid] = (os.SCHED_OTHER, 0)
        for tid, (policy, prio) in before.items():
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, policy, os.sched_param(prio))
