"""EMBER_DUMP=dir: write each captured graph (ir-v1 text), its inputs (safetensors, keyed by
parameter name), the outputs of the call that captured it, and its guards, so that

    ember run dir/NAME.ir --inputs dir/NAME.inputs.safetensors --out o.safetensors

replays it from the shell: a graph that writes its inputs keeps `input_updates`, so the run
writes the same updated inputs (by parameter name) as the live call did. The inputs are
written before the call, which may update them in place. With the inductor backend, the
compiled `kernels.*` module (C++ sources in `kernel` blocks) is written as NAME.kernels.ir, and

    ember run dir/NAME.kernels.ir --inputs dir/NAME.inputs.safetensors --allow-kernels

replays the compiled code itself. A graph with random ops also gets `philox_seed` and
`philox_offset` in its inputs file (see `philox_inputs`): both replays draw the same numbers.

Several processes may share one directory: a dump's stem `NAME_N` is claimed by creating
`NAME_N.ir` exclusively (O_CREAT|O_EXCL), so no two dumps get the same stem, and every file is
written to a temporary name and renamed into place, so a file is complete or absent and a
dump's inputs and outputs are those of one call. The `.ir` file gets its text last.

Every dumped module names its producer in `#` comment lines right after the `ember.ir 1.0`
line (`header`): the pipeline that made it (expanded) or the capture, the stage, ember's and
torch's versions and the date. Comments are not part of the module: the file parses and
replays as the module alone, and `ember opt` of it prints the module without them.

A training compile (gradients recorded) also writes its prims graph, its joint module and its
forward's and backward's graphs and stages under names of their own, each with the inputs and
outputs of its first call (`TrainingDump`, below).

Dumping never breaks the user's call: a directory that cannot be used (a file, a read-only or
missing-permission path) gives a one-line `DumpWarning`, once per distinct problem, and the
call's result is unaffected; later captures try again and behave the same way.
"""

from __future__ import annotations

import datetime
import errno
import functools
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import torch

from ember.capture import Captured
from ember.ir import Graph, Module
from ember.runtime.tensors import save_tensors

ENV = "EMBER_DUMP"
PHILOX_SEED, PHILOX_OFFSET = "philox_seed", "philox_offset"
T = TypeVar("T")


class DumpWarning(UserWarning):
    """EMBER_DUMP names a directory that cannot be written: the graph is not dumped."""


_WARNED: set[str] = set()
_NEXT: dict[tuple[str, str], int] = {}  # (directory, graph name) -> first index worth trying


def versions() -> str:
    try:
        ember = metadata.version("ember-runtime")
    except metadata.PackageNotFoundError:  # run from a source tree without an install
        ember = "unknown"
    return f"ember {ember}, torch {torch.__version__}"


def header(producer: str, stage: str | None = None) -> str:
    """The `#` lines a dump starts with (after the version line): what produced it."""
    lines = [f"produced by: {producer}"]
    if stage is not None:
        lines.append(f"stage: {stage}")
    lines.append(versions())
    lines.append(f"date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    # a newline in a pipeline's text would end the comment: each line is its own comment
    return "".join(f"# {part}\n" for ln in lines for part in ln.splitlines())


def with_header(text: str, producer: str, stage: str | None = None) -> str:
    """`text` (a printed module) with `header` after its first line, the `ember.ir` line."""
    first, nl, rest = text.partition("\n")
    if not first.startswith("ember.ir "):  # not a printed module (a note): header first
        return header(producer, stage) + text
    return f"{first}\n{header(producer, stage)}{rest}"


def dump_dir() -> Path | None:
    d = os.environ.get(ENV)
    return Path(d) if d else None


def _problem(d: Path, e: Exception) -> None:
    if isinstance(e, OSError):  # no file name: one warning per problem, not per temp file
        why = e.strerror or str(e)
    else:
        why = f"{type(e).__name__}: {e}"
    msg = f"ember: EMBER_DUMP={d} is unusable ({why}); the graph is not dumped"
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, DumpWarning, stacklevel=4)


def _guarded(d: Path, write: Callable[[], T]) -> T | None:
    """`write()`, or None with a DumpWarning where it fails: a dump never breaks the call."""
    try:
        return write()
    except Exception as e:  # any failure to dump (OS errors, unsavable tensors) is only a note
        _problem(d, e)
        return None


def _atomic(path: Path, write: Callable[[str], object]) -> None:
    """`write(tmp)` to a temporary file beside `path`, then rename it to `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_text(path: Path, text: str) -> None:
    _atomic(path, lambda tmp: Path(tmp).write_text(text))


def _claim_stem(d: Path, name: str) -> str:
    """A stem `name_N` no other dump (of this or another process) has: `name_N.ir` is created
    exclusively; the first N whose file does not exist yet wins."""
    i = _NEXT.get((str(d), name), 0)
    while True:
        try:
            fd = os.open(d / f"{name}_{i}.ir", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            i += 1
            continue
        os.close(fd)
        _NEXT[(str(d), name)] = i + 1
        return f"{name}_{i}"


def dump_capture(cap: Captured, inputs: Sequence[Any], directory: Path | None = None
                 ) -> Path | None:
    """Write the graph and its inputs (before the call runs); returns the .ir path, or None
    where nothing is dumped (no EMBER_DUMP, or a directory that cannot be used). `directory`
    (compile's option dump_dir) takes the place of EMBER_DUMP."""
    d = directory or dump_dir()
    if d is None:
        return None

    def write() -> Path:
        if d.exists() and not d.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(d))
        d.mkdir(parents=True, exist_ok=True)
        stem = _claim_stem(d, cap.graph.name)
        ir_path = d / f"{stem}.ir"
        tensors = {p.name: x for p, x in zip(cap.graph.params, inputs, strict=True)}
        tensors.update(philox_inputs(cap.module, cap.graph))
        _atomic(d / f"{stem}.inputs.safetensors", lambda tmp: save_tensors(tmp, tensors))
        _write_text(d / f"{stem}.guards.txt", "".join(g.text() + "\n" for g in cap.guards))
        _write_text(ir_path, with_header(str(cap.module), "ember.capture (the captured aten "
                                         "graph, functionalized)"))
        return ir_path

    return _guarded(d, write)


def philox_inputs(module: Module, graph: Graph) -> dict[str, int]:
    """The seed and offset a decomposing backend (prims, inductor) draws the graph's random
    numbers from on this call, for a graph with random ops: a fresh compiled graph's first call
    uses torch's initial seed and offset 0 (docs/decisions.md, "Random numbers in graphs").
    Stored as `philox_seed`/`philox_offset`, the names the decompose pass gives the parameters
    (so NAME.kernels.ir takes the same file); `ember run` of NAME.ir reseeds torch with them."""
    from ember.runtime.check import has_random_ops

    if not has_random_ops(module) or {p.name for p in graph.params} & {PHILOX_SEED, PHILOX_OFFSET}:
        return {}
    return _first_call_philox()


def _first_call_philox() -> dict[str, int]:
    seed = torch.initial_seed()  # a u64: stored as the i64 of the same bits (philox masks it)
    return {PHILOX_SEED: seed - (1 << 64) if seed >= 1 << 63 else seed, PHILOX_OFFSET: 0}


def dump_compiled(ir_path: Path, compiled: Module, captured: Graph, producer: str = ""
                  ) -> Path | None:
    """Write the compiled (kernels.*) module beside the captured graph's .ir file. Backends run
    the graph with its input updates as plain results (same order, same parameters); the dump
    states them again, so a replay writes the updated inputs as the captured graph's does."""
    path = ir_path.with_name(ir_path.name.removesuffix(".ir") + ".kernels.ir")
    updates = captured.attrs.get("input_updates")
    if updates is not None and captured.name in compiled.items:
        compiled = compiled.clone()
        compiled.graph(captured.name).attrs["input_updates"] = updates

    def write() -> Path:
        _write_text(path, with_header(str(compiled), producer or "a compiling backend"))
        return path

    return _guarded(ir_path.parent, write)


def dump_stages(ir_path: Path, stages: Sequence[tuple[str, str]], producer: str = "") -> None:
    """compile's option dump_each: the module after each pipeline stage (stage text, module
    text), as STEM.stageNN.PASS.ir beside STEM.ir (`ember opt -p` of the stages from STEM.ir
    gives the same files)."""
    stem = ir_path.name.removesuffix(".ir")
    updates = _input_updates(ir_path)
    for i, (stage, text) in enumerate(stages):
        name = stage.split("{", 1)[0]  # the pass name: the options' text stays in the file
        path = ir_path.parent / f"{stem}.stage{i:02d}.{name}.ir"
        if updates is not None:
            text = _with_updates(text, *updates)
        body = with_header(text, producer or "a pipeline", f"after {stage}")
        _guarded(ir_path.parent, functools.partial(_write_text, path, body))


def _input_updates(ir_path: Path) -> tuple[str, Any] | None:
    """(graph name, its input_updates) of the captured graph dumped at `ir_path`, if it writes
    its inputs: the pipeline's stages return the updates as plain results, and a stage dump
    states them again (as NAME.kernels.ir does), so its replay names them as the capture's."""
    from ember.ir import parse

    try:
        g = parse(ir_path.read_text()).graph()
    except Exception:  # an unreadable dump: the stages are written as they are
        return None
    raw = g.attrs.get("input_updates")
    return None if raw is None else (g.name, raw)


def _with_updates(text: str, graph: str, updates: Any) -> str:
    from ember.ir import parse

    try:
        m = parse(text)
        if graph not in m.graphs or "input_updates" in m.graph(graph).attrs:
            return text
        m.graph(graph).attrs["input_updates"] = updates
        return str(m)
    except Exception:  # a stage that does not read back (printed as a note): as it is
        return text


def dump_outputs(ir_path: Path, results: Sequence[Any], graph: Graph) -> None:
    """Every result of the call, named as `ember run --out` names them: `outN` for the N-th
    returned result, the parameter's name for a result written back into a graph input."""
    stem = ir_path.name.removesuffix(".ir")
    updated = {r: graph.params[p].name for p, r in graph.input_updates}
    returned = [o for i, o in enumerate(results) if i not in updated]
    named = {f"out{i}": o for i, o in enumerate(returned)}
    named.update({name: results[r] for r, name in updated.items()})
    path = ir_path.parent / f"{stem}.outputs.safetensors"
    _guarded(ir_path.parent, lambda: _atomic(path, lambda tmp: save_tensors(tmp, named)))


# ---- training compiles ---------------------------------------------------------------------------
# A training compile runs the captured graph as two graphs (training.py): its stages are dumped
# under names of their own beside STEM.ir, each with the inputs and outputs of the first call,
# so every one replays (docs/debugging.md, "Dumps of every stage"):
#   STEM[.pieceN].prims.ir      the captured graph decomposed to prims (inputs: STEM.inputs)
#   STEM[.pieceN].joint.ir      @forward and @backward in one module (as the `joint` pass gives)
#   STEM[.pieceN].forward.ir    @forward, with .inputs/.outputs.safetensors of the first call
#   STEM[.pieceN].backward.ir   @backward: inputs are the saved values and the cotangents
#   ....forward.stageNN.PASS.ir, ....forward.kernels.ir (and backward's): each pipeline's stages
# A DDP cut (distributed.py) dumps each piece as STEM.pieceN.*, and the cut as STEM.stage00.buckets.


@dataclass
class TrainingDump:
    """One training graph pair to dump (made by compile's _training where dumps are on): the
    modules and stage texts now, the first call's inputs and outputs when it runs (`runner`)."""

    label: str  # "" or "pieceN." (a DDP cut's piece)
    prims: Module | None
    forward: Module
    backward: Module
    stages: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    compiled: dict[str, Module] = field(default_factory=dict)
    producer: str = ""
    base: Path | None = None  # STEM path prefix, once `write` ran
    pending: set[str] = field(default_factory=lambda: {"forward", "backward"})

    def _path(self, what: str) -> Path:
        assert self.base is not None
        return self.base.with_name(f"{self.base.name}.{self.label}{what}")

    def write(self, ir_path: Path) -> None:
        """The modules and stages beside the captured graph's dump at `ir_path`."""
        self.base = ir_path.with_name(ir_path.name.removesuffix(".ir"))
        stem = self.base.name + "." + self.label
        d = ir_path.parent
        prod = "ember.runtime training (plan_training: decompose, joint, partition)"
        files: list[tuple[Path, str, str]] = []
        if self.prims is not None:  # it states the captured graph's input updates again
            up = _input_updates(ir_path)
            prims = str(self.prims) if up is None else _with_updates(str(self.prims), *up)
            files.append((self._path("prims.ir"), prims,
                          f"prims (replays with {stem.rstrip('.')}.inputs.safetensors)"))
        joint = self.forward.clone()
        joint.items["backward"] = self.backward.graph()
        files.append((self._path("joint.ir"), str(joint),
                      f"joint: @forward replays with {stem}forward.inputs.safetensors "
                      f"(--graph forward), @backward with {stem}backward.inputs.safetensors "
                      f"(--graph backward)"))
        for which in ("forward", "backward"):
            files.append((self._path(f"{which}.ir"),
                          str(self.forward if which == "forward" else self.backward),
                          f"{which} (replays with {stem}{which}.inputs.safetensors)"))
        for path, text, stage in files:
            _guarded(d, functools.partial(_write_text, path, with_header(text, prod, stage)))
        for which in ("forward", "backward"):
            g = (self.forward if which == "forward" else self.backward).graph()
            updates = g.attrs.get("input_updates")
            for i, (stage, text) in enumerate(self.stages.get(which, [])):
                name = stage.split("{", 1)[0]
                if updates is not None:
                    text = _with_updates(text, g.name, updates)
                body = with_header(text, self.producer or "a pipeline",
                                   f"{which}: after {stage}")
                _guarded(d, functools.partial(_write_text,
                                              self._path(f"{which}.stage{i:02d}.{name}.ir"), body))
            if which in self.compiled:
                kernels = self.compiled[which]
                if updates is not None and g.name in kernels.items:
                    kernels = kernels.clone()
                    kernels.graph(g.name).attrs["input_updates"] = updates
                _guarded(d, functools.partial(
                    _write_text, self._path(f"{which}.kernels.ir"),
                    with_header(str(kernels), self.producer or "a compiling backend",
                                f"{which}: compiled")))

    def runner(self, which: str, run: Callable[[Sequence[Any]], list[Any]]
               ) -> Callable[[Sequence[Any]], list[Any]]:
        """`run`, writing the inputs (before: the backward frees its saved values as it goes)
        and outputs of its first call after `write` as STEM.WHICH.inputs/outputs."""
        g = (self.forward if which == "forward" else self.backward).graph()

        def dumping(inputs: Sequence[Any]) -> list[Any]:
            if self.base is None or which not in self.pending:
                return run(inputs)
            self.pending.discard(which)
            _guarded(self.base.parent, functools.partial(self._write_inputs, which, inputs))
            outs = run(inputs)
            dump_outputs(self._path(f"{which}.ir"), outs, g)
            if which == "forward" and self.label and self.prims is not None:
                # a piece's prims graph: the piece's inputs and results (STEM.pieceN.*)
                pg = self.prims.graph()
                _guarded(self.base.parent, functools.partial(
                    self._write_inputs, which, inputs, self._path("inputs.safetensors")))
                dump_outputs(self._path("ir"), outs[:len(pg.outputs)], pg)
            return outs

        return dumping

    def _write_inputs(self, which: str, inputs: Sequence[Any], path: Path | None = None
                      ) -> None:
        """The call's inputs by parameter name; a graph with random ops is given its philox
        seed and offset by the runner, not the caller: those of a first call are added."""
        module = self.forward if which == "forward" else self.backward
        g = module.graph()
        names = [p.name for p in g.params if p.name not in (PHILOX_SEED, PHILOX_OFFSET)]
        if len(names) != len(inputs):
            raise ValueError(f"@{g.name} takes {len(names)} inputs, its runner got {len(inputs)}")
        tensors: dict[str, Any] = dict(zip(names, inputs, strict=True))
        tensors.update(_first_call_philox() if len(names) < len(g.params)
                       else philox_inputs(module, g))
        path = path or self._path(f"{which}.inputs.safetensors")
        _atomic(path, functools.partial(save_tensors, tensors=tensors))
