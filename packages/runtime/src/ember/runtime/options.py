"""`compile(options={...})`: the options ember's compile() takes, checked up front.

Each option is honoured or refused; none is accepted and ignored. An unknown key, a value of
the wrong type, or an option that does not apply to the chosen backend is a `ValueError` that
lists what is valid (as torch.compile does for its options).

    pipeline        a pipeline string or a registered pipeline's name, run by the inductor
                    backend instead of the pipeline `inductor` (see `ember passes`)
    decompositions  a registered decomposition table's name, or a DecompositionTable: what
                    `decompose` stages without `table=` use
    verify_each     verify the module after every stage of the pipeline
    dump_dir        write every captured graph, its inputs, outputs, guards and compiled module
                    here (what EMBER_DUMP=DIR does, for this function only)
    dump_each       also write the module after every pipeline stage, as
                    STEM.stageNN.PASS.ir beside STEM.ir (needs dump_dir or EMBER_DUMP)
    cache_limit     recompilations per compiled function before it runs eagerly (default 8)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.ir.passes import PipelineError, PipelineStage, expand_pipeline, parse_pipeline
from ember.prims.decomp.table import (
    DecompositionTable,
    decomposition_table,
    decomposition_tables,
)

DEFAULT_CACHE_LIMIT = 8
DEFAULT_PIPELINE_NAME = "inductor"
OPTIONS: dict[str, str] = {
    "pipeline": "a pipeline string or name (see `ember passes`), run by the inductor backend",
    "decompositions": "a decomposition table's name or a DecompositionTable",
    "verify_each": "bool: verify the module after every pipeline stage",
    "dump_dir": "a directory: dump graphs, inputs, outputs and compiled modules there",
    "dump_each": "bool: also dump the module after every pipeline stage",
    "cache_limit": f"int >= 1: recompilations before running eagerly (default "
                   f"{DEFAULT_CACHE_LIMIT})",
}
# options that change what the inductor backend runs: refused with another backend
INDUCTOR_ONLY = ("pipeline", "decompositions", "verify_each", "dump_each")


@dataclass(frozen=True)
class CompileOptions:
    pipeline: str = DEFAULT_PIPELINE_NAME
    decompositions: DecompositionTable | None = None
    verify_each: bool = False
    dump_dir: Path | None = None
    dump_each: bool = False
    cache_limit: int = DEFAULT_CACHE_LIMIT

    def notes(self) -> list[str]:
        """What explain() says about the options that change compilation."""
        out = []
        if self.pipeline != DEFAULT_PIPELINE_NAME:
            out.append(f"option pipeline={self.pipeline!r}: the inductor backend runs "
                       f"{expand_pipeline(self.pipeline)}")
        if self.decompositions is not None:
            name = decomposition_tables().name_of(self.decompositions) \
                or self.decompositions.name or "an unregistered table"
            out.append(f"option decompositions: decompose stages without table= use the "
                       f"table {name} ({len(self.decompositions)} ops)")
        if self.verify_each:
            out.append("option verify_each: the module is verified after every stage")
        return out


def _check_tables(stages: list[PipelineStage]) -> None:
    """Table names in stages exist now, so a typo is an error at compile(), not a fallback to
    eager at the first call."""
    from ember.inductor.lowering import LOWERING_TABLES
    from ember.inductor.lowering_plugins import lowering_table

    for st in stages:
        table = st.options.get("table")
        if not isinstance(table, str) or not table:
            continue
        if st.pass_.name == "decompose":
            decomposition_table(table)
        elif st.pass_.name == "lower-loops" and lowering_table(table) is None:
            raise KeyError(f"lower-loops: unknown lowering table {table!r} (known: "
                           f"{', '.join(sorted(LOWERING_TABLES))})")


def _valid() -> str:
    return ", ".join(OPTIONS)


def check_options(options: dict[str, Any] | None, *, inductor: bool) -> CompileOptions:
    """The options as a CompileOptions, or a ValueError naming the bad one and the valid ones.
    `inductor`: the backend is ember's inductor (the pipeline options apply only there)."""
    opts = dict(options or {})
    unknown = sorted(k for k in opts if k not in OPTIONS)
    if unknown:
        raise ValueError(f"unknown compile option(s) {', '.join(map(repr, unknown))}; valid "
                         f"options: {_valid()}")
    if not inductor:
        used = [k for k in INDUCTOR_ONLY if k in opts]
        if used:
            raise ValueError(f"compile option(s) {', '.join(used)} apply to the inductor "
                             f"backend only (backend='inductor')")
    kw: dict[str, Any] = {}
    if "pipeline" in opts:
        p = opts["pipeline"]
        if not isinstance(p, str):
            raise ValueError(f"option pipeline must be a pipeline string or name, not "
                             f"{type(p).__name__}")
        try:
            _check_tables(parse_pipeline(p))  # unknown passes, options, pipelines, cycles
        except (PipelineError, KeyError) as e:
            msg = e.args[0] if isinstance(e, KeyError) else str(e)
            raise ValueError(f"option pipeline={p!r}: {msg}") from None
        kw["pipeline"] = p
    if "decompositions" in opts:
        d = opts["decompositions"]
        if isinstance(d, str):
            try:
                d = decomposition_table(d)
            except KeyError as e:
                raise ValueError(f"option decompositions: {e.args[0]}") from None
        if not isinstance(d, DecompositionTable):
            raise ValueError(f"option decompositions must be a table name or a "
                             f"DecompositionTable, not {type(d).__name__}")
        kw["decompositions"] = d
    for flag in ("verify_each", "dump_each"):
        if flag in opts:
            if not isinstance(opts[flag], bool):
                raise ValueError(f"option {flag} must be a bool, not {opts[flag]!r}")
            kw[flag] = opts[flag]
    if opts.get("dump_dir") is not None:
        if not isinstance(opts["dump_dir"], (str, os.PathLike)):
            raise ValueError(f"option dump_dir must be a path, not "
                             f"{type(opts['dump_dir']).__name__}")
        kw["dump_dir"] = Path(opts["dump_dir"])
    if kw.get("dump_each") and "dump_dir" not in kw and not os.environ.get("EMBER_DUMP"):
        raise ValueError("option dump_each needs dump_dir (or EMBER_DUMP) to write to")
    if "cache_limit" in opts:
        n = opts["cache_limit"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"option cache_limit must be an int >= 1, not {n!r}")
        kw["cache_limit"] = n
    return CompileOptions(**kw)
