"""Live logs of what ember's compile() does: `EMBER_LOGS=...` or `set_logs(...)`, like TORCH_LOGS.

Channels, each a `logging` logger named `ember.<channel>`:

    graph_breaks  a graph break: its reason and the user's source line
    recompiles    a recompilation: the guard that failed
    fallbacks     a graph (or call) that does not run through the requested backend, and why
    guards        the guards of each new graph
    pipeline      the inductor pipeline's passes with their timings
    kernels       the kernels generated for a graph: count, names, kernel cache hits/builds

`EMBER_LOGS` is a comma list of channel names, `all`, `+name` (that channel at DEBUG: more
detail, e.g. the inlined calls of a graph break) and `-name` (off, e.g. `all,-guards`). It is
read when ember.runtime is imported; `set_logs()` changes the channels later. Invalid names give
one warning that lists the valid ones.

Records go through Python's `logging`: to the handlers the program configured (pytest's
caplog too), or, where the root logger has none, to stderr. Off, a channel costs one
`isEnabledFor` check: messages are formatted only for enabled loggers.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterable

CHANNELS = ("graph_breaks", "recompiles", "fallbacks", "guards", "pipeline", "kernels")
ENV = "EMBER_LOGS"

graph_breaks = logging.getLogger("ember.graph_breaks")
recompiles = logging.getLogger("ember.recompiles")
fallbacks = logging.getLogger("ember.fallbacks")
guards = logging.getLogger("ember.guards")
pipeline = logging.getLogger("ember.pipeline")
kernels = logging.getLogger("ember.kernels")
LOGGERS = {c: logging.getLogger(f"ember.{c}") for c in CHANNELS}


class _WhenUnconfigured(logging.Filter):
    """Print a record only where the program configured no root handler (which would print
    it too, or capture it, as pytest's caplog does)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def _handler() -> logging.Handler:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    h.addFilter(_WhenUnconfigured())
    return h


_HANDLER = _handler()
logging.getLogger("ember").addHandler(_HANDLER)


def parse(spec: str) -> tuple[dict[str, int], list[str]]:
    """`spec` as channel -> level (logging.NOTSET: off), and the names that are not channels."""
    levels = dict.fromkeys(CHANNELS, logging.NOTSET)
    bad: list[str] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        sign = item[0] if item[0] in "+-" else ""
        name = item[len(sign):].strip()
        names = CHANNELS if name == "all" else (name,) if name in CHANNELS else ()
        if not names:
            bad.append(item)
        for n in names:
            levels[n] = {"+": logging.DEBUG, "-": logging.NOTSET}.get(sign, logging.INFO)
    return levels, bad


def _apply(levels: dict[str, int]) -> None:
    for c, level in levels.items():
        # off: above CRITICAL, so isEnabledFor is False whatever the root logger's level
        LOGGERS[c].setLevel(level if level != logging.NOTSET else logging.CRITICAL + 1)


def _warn_bad(bad: list[str], source: str) -> None:
    warnings.warn(f"ember: {source}: unknown log channel(s) {', '.join(map(repr, bad))}; valid: "
                  f"{', '.join(CHANNELS)}, all (each may be prefixed by + for more detail or "
                  f"- to turn it off)", UserWarning, stacklevel=3)


def set_logs(spec: str | Iterable[str] | None = None, **channels: bool) -> None:
    """Turn channels on or off: `set_logs("graph_breaks,recompiles")`, `set_logs("all")`,
    `set_logs(["+pipeline", "kernels"])`, `set_logs(fallbacks=True)`; `set_logs()` turns
    every channel off. Unknown names warn once, listing the valid channels."""
    text = spec if isinstance(spec, str) else ",".join(spec or ())
    levels, bad = parse(text)
    for name, on in channels.items():
        if name not in CHANNELS:
            bad.append(name)
        else:
            levels[name] = logging.INFO if on else logging.NOTSET
    if bad:
        _warn_bad(bad, "set_logs")
    _apply(levels)


def init_from_env() -> None:
    """Apply `EMBER_LOGS` (done when ember.runtime is imported)."""
    text = os.environ.get(ENV, "")
    levels, bad = parse(text)
    if bad:
        _warn_bad(bad, f"{ENV}={text!r}")
    _apply(levels)


def enabled(logger: logging.Logger, level: int = logging.INFO) -> bool:
    return logger.isEnabledFor(level)


init_from_env()
