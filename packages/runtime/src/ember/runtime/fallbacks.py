"""Honest fallbacks: what compile() records, warns and logs when a graph (or a call) does not
run through the requested backend.

Each fallback is a `history.Fallback` with a kind (`history.FALLBACK_KINDS`), the graph's
number and the reason; `explain()` counts them per kind and graph. The first fallback of each
kind per compiled function warns once with `FallbackWarning`, pointing at the user's call; every
one is logged on the `ember.fallbacks` channel (logs.py).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

import torch

from ember.ir import Module
from ember.ir.registry import EMBER_DIALECTS
from ember.runtime import logs
from ember.runtime.history import Fallback, History


class FallbackWarning(UserWarning):
    """A compiled function (or one of its graphs) did not run through the requested backend."""


_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside ember.runtime and torch (torch: nn.Module's
    call machinery around a compiled module): the user's call of the compiled function."""
    level, f = 2, sys._getframe(2)  # 1: this function's caller (record), 2: its caller
    while f is not None and f.f_back is not None \
            and os.path.abspath(f.f_code.co_filename).startswith((_HERE, _TORCH)):
        f, level = f.f_back, level + 1
    return level


def record(history: History, fb: Fallback, name: str) -> None:
    """Append `fb` to the history; log it; warn if it is the first of its kind for the
    function `name` (whose source line is fb.where)."""
    history.fallbacks.append(fb)
    graph = "" if fb.graph is None else f" (graph {fb.graph})"
    if logs.fallbacks.isEnabledFor(logging.INFO):
        logs.fallbacks.info("%s at %s: fallback%s: %s: %s", name, fb.where, graph, fb.kind,
                            fb.reason)
    if fb.kind in history.warned:
        return
    history.warned.add(fb.kind)
    warnings.warn(f"ember: {name} (defined at {fb.where}) falls back{graph}: {fb.kind}: "
                  f"{fb.reason}. ember.runtime.explain() reports every fallback; "
                  f"EMBER_LOGS=fallbacks logs them", FallbackWarning,
                  stacklevel=_user_stacklevel())


def missing_ops(module: Module, tables: list[Any]) -> list[str]:
    """Every op of the module's graphs that none of `tables` decomposes (ember's own dialects,
    torch's fused CPU attention and custom ops, which the pass keeps, excepted), sorted."""
    from ember.prims.decomp import passes

    # torch.library custom ops stay opaque where the decompose pass knows them (no table needed)
    custom = getattr(passes, "is_custom_op", lambda op: False)
    ops = {n.op for g in module.graphs.values() for n in g.nodes}
    return sorted(op for op in ops
                  if op.split(".", 1)[0] not in EMBER_DIALECTS
                  and op not in passes.FUSED_ATTENTION and not any(op in t for t in tables)
                  and not custom(op))


def decompose_tables(pipeline: str, default: Any) -> list[Any]:
    """The decomposition tables the `decompose` stages of `pipeline` use (`default`: a stage
    without table=), skipping stages that keep unsupported ops."""
    from ember.ir.passes import parse_pipeline
    from ember.prims.decomp.table import decomposition_table

    out = []
    for st in parse_pipeline(pipeline):
        if st.pass_.name != "decompose" or st.options.get("keep_unsupported"):
            continue
        name = st.options.get("table")
        out.append(decomposition_table(name) if isinstance(name, str) and name else default)
    return out or [default]


def interpreter_reason(compiled: Module, graph: str) -> str | None:
    """Why (part of) a compiled graph runs on the reference interpreter rather than the
    generated call: the wrapper's reason, and the kernels and ops the C++ tables left; None
    where the generated call covers it all."""
    from ember.inductor.kernels import summary
    from ember.inductor.wrapper import WrapperUnsupported, generate
    from ember.ir import Interpreter

    parts = []
    try:
        generate(compiled, graph, Interpreter(compiled))
    except WrapperUnsupported as e:
        parts.append(f"the generated call does not cover @{graph} ({e}): the reference "
                     f"interpreter runs the whole graph")
    marker = "run by the reference interpreter: "
    text = summary(compiled)  # a captured module: one top-level graph
    if marker in text:
        parts.append(marker + text.split(marker, 1)[1])
    return "; ".join(parts) or None

