"""EMBER_DUMP=dir: write each captured graph (ir-v1 text), its inputs (safetensors, keyed by
parameter name), the outputs of the call that captured it, and its guards, so that

    ember run dir/NAME.ir --inputs dir/NAME.inputs.safetensors --out o.safetensors

replays it from the shell: a graph that writes its inputs keeps `input_updates`, so the run
writes the same updated inputs (by parameter name) as the live call did. The inputs are
written before the call, which may update them in place. With the inductor backend, the
compiled `kernels.*` module (C++ sources in `kernel` blocks) is written as NAME.kernels.ir, and

    ember run dir/NAME.kernels.ir --inputs dir/NAME.inputs.safetensors --allow-kernels

replays the compiled code itself."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ember.capture import Captured
from ember.ir import Graph, Module
from ember.runtime.tensors import save_tensors

ENV = "EMBER_DUMP"


def dump_dir() -> Path | None:
    d = os.environ.get(ENV)
    return Path(d) if d else None


def _free_stem(d: Path, name: str) -> str:
    i = 0
    while (d / f"{name}_{i}.ir").exists():
        i += 1
    return f"{name}_{i}"


def dump_capture(cap: Captured, inputs: Sequence[Any]) -> Path | None:
    """Write the graph and its inputs (before the call runs); returns the .ir path."""
    d = dump_dir()
    if d is None:
        return None
    d.mkdir(parents=True, exist_ok=True)
    stem = _free_stem(d, cap.graph.name)
    ir_path = d / f"{stem}.ir"
    save_tensors(str(d / f"{stem}.inputs.safetensors"),
                 {p.name: x for p, x in zip(cap.graph.params, inputs, strict=True)})
    (d / f"{stem}.guards.txt").write_text("".join(g.text() + "\n" for g in cap.guards))
    ir_path.write_text(str(cap.module))
    return ir_path


def dump_compiled(ir_path: Path, compiled: Module, captured: Graph) -> Path:
    """Write the compiled (kernels.*) module beside the captured graph's .ir file. Backends run
    the graph with its input updates as plain results (same order, same parameters); the dump
    states them again, so a replay writes the updated inputs as the captured graph's does."""
    path = ir_path.with_name(ir_path.name.removesuffix(".ir") + ".kernels.ir")
    updates = captured.attrs.get("input_updates")
    if updates is not None and captured.name in compiled.items:
        compiled = compiled.clone()
        compiled.graph(captured.name).attrs["input_updates"] = updates
    path.write_text(str(compiled))
    return path


def dump_outputs(ir_path: Path, results: Sequence[Any], graph: Graph) -> None:
    """Every result of the call, named as `ember run --out` names them: `outN` for the N-th
    returned result, the parameter's name for a result written back into a graph input."""
    stem = ir_path.name.removesuffix(".ir")
    updated = {r: graph.params[p].name for p, r in graph.input_updates}
    returned = [o for i, o in enumerate(results) if i not in updated]
    named = {f"out{i}": o for i, o in enumerate(returned)}
    named.update({name: results[r] for r, name in updated.items()})
    save_tensors(str(ir_path.parent / f"{stem}.outputs.safetensors"), named)
