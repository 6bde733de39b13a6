"""Keeping torch's own error logging quiet while capture runs operators on fake tensors.

FakeTensorMode logs every exception a meta kernel raises (`log.exception("failed while
attempting to run meta for ...")`, with the whole traceback) before re-raising it. Capture
handles those exceptions itself: a user error is raised as eager raises it, anything else
becomes a graph break with its reason. So while capture runs torch code, error records of those
loggers are dropped, on this thread only; other threads and torch's own use of fake tensors
outside capture log as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

# The loggers that log a failure and then raise it (torch/_subclasses/fake_tensor.py).
LOGGERS = ("torch._subclasses.fake_tensor",)

_state = threading.local()


class _DropWhileCapturing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_state, "depth", 0) and record.levelno >= logging.ERROR)


_FILTER = _DropWhileCapturing()
_installed = False
_lock = threading.Lock()


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            for name in LOGGERS:
                logging.getLogger(name).addFilter(_FILTER)
            _installed = True


@contextlib.contextmanager
def quiet_torch_errors() -> Iterator[None]:
    """Drop the error records of torch's fake-tensor logging on this thread meanwhile."""
    _install()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
