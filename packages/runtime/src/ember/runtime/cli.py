"""The `ember` command line: opt, run, check, minimize, passes.

    ember opt IN.ir [-p PIPELINE] [-o OUT.ir] [--verify-each] [--print-after-all]
    ember run IN.ir (--inputs IN.safetensors | --random [--seed N]) [--out OUT.safetensors]
    ember check IN.ir [-p PIPELINE] [--backend B] [--inputs F | --seed N] [--rtol R --atol A]
    ember minimize IN.ir --backend B [--inputs F] [-o OUT.ir]
    ember passes
    ember explain SCRIPT.py:NAME [--inputs FN]
    ember verify

Errors are one line on stderr (`FILE:LINE:COL: error: ...` for IR errors) with exit status 1,
2 for usage errors; `--debug` shows the traceback instead. A mistake in the input (the IR, the
inputs file, a flag, an output path) is always such an error; `ember: internal error` means a
bug in ember.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

import ember.autograd  # noqa: F401  (registers the joint pass)
import ember.inductor  # noqa: F401  (loop IR, kernels, the inductor backend)
import ember.prims  # noqa: F401  (registers the prims and the decompose pass)
from ember.ir import (
    InterpretError,
    IRParseError,
    Module,
    PrintError,
    VerificationError,
    parse,
    verify,
)
from ember.ir.backends import Runner, default_backends
from ember.ir.effects import allow_effects
from ember.ir.interpreter import failed_node
from ember.ir.passes import PipelineError, default_pass_registry, run_pipeline
from ember.runtime.check import (
    Diff,
    Tolerance,
    compare_results,
    graph_inputs,
    has_random_ops,
    torch_seeded,
)
from ember.runtime.explain import add_explain_command
from ember.runtime.minimize import MinimizeError, minimize
from ember.runtime.tensors import (
    MAX_INPUT_BYTES_ENV,
    InputError,
    check_result_names,
    check_storable,
    max_input_bytes,
    result_names,
    save_tensors,
)
from ember.runtime.verify import add_verify_command


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 1."""

    def __init__(self, message: str, file: str | None = None, line: int = 0, col: int = 0):
        super().__init__(message)
        self.file, self.line, self.col = file, line, col

    def render(self) -> str:
        if self.file and self.line:
            return f"{self.file}:{self.line}:{self.col}: error: {self}"
        if self.file:
            return f"{self.file}: error: {self}"
        return f"ember: error: {self}"


def _read(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise CLIError("no such file", path) from None
    except UnicodeDecodeError as e:
        raise CLIError(f"not UTF-8 text ({e.reason} at byte {e.start})", path) from None
    except OSError as e:
        raise CLIError(e.strerror or str(e), path) from None


def load_module(path: str, *, verify_it: bool = True, allow_unregistered: bool = False) -> Module:
    """Read, parse and verify an .ir file, turning errors into CLIError with positions."""
    text = _read(path)
    try:
        m = parse(text)
    except IRParseError as e:
        raise CLIError(e.message, path, e.line, e.col) from None
    if verify_it:
        _verify(m, path, allow_unregistered)
    return m


def _verify(m: Module, path: str, allow_unregistered: bool) -> None:
    try:
        verify(m, allow_unregistered=allow_unregistered)
    except VerificationError as e:
        first = e.errors[0]
        more = f" (and {len(e.errors) - 1} more)" if len(e.errors) > 1 else ""
        line, col = (first.pos.line, first.pos.col) if first.pos else (0, 0)
        raise CLIError(first.message + more, path, line, col) from None
    except (RecursionError, MemoryError) as e:  # a module too deep or too large to check
        raise CLIError(f"cannot verify the module: {type(e).__name__}", path) from None


def _check_writable(path: str, flag: str) -> None:
    """Refuse an output path that cannot be written, before anything runs."""
    if path == "-" and flag != "-o":
        raise CLIError(f"{flag} -: safetensors is a binary file format, give a file path")
    if os.path.isdir(path):
        raise CLIError(f"{flag} {path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CLIError(f"{flag} {path}: no such directory {parent}")
    # safetensors writes a temporary file next to the target, then renames it
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {path}: directory {parent} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CLIError(f"{flag} {path}: not writable")


def _write(text: str, out: str | None, stream: TextIO) -> None:
    if out is None or out == "-":
        stream.write(text)
        return
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}") from None


def _print_module(m: Module) -> str:
    try:
        return str(m)
    except PrintError as e:
        raise CLIError(f"cannot print the module: {e}") from None


def cmd_opt(a: argparse.Namespace) -> int:
    if a.output not in (None, "-"):
        _check_writable(a.output, "-o")
    m = load_module(a.input, allow_unregistered=a.allow_unregistered)

    def after(stage: str, mod: Module) -> None:
        if a.print_after_all:
            sys.stderr.write(f"# ----- IR after {stage}\n{_print_module(mod)}\n")

    try:
        m = run_pipeline(m, a.pipeline or "", verify_each=a.verify_each, print_after=after,
                         allow_unregistered=a.allow_unregistered)
    except PipelineError as e:
        raise CLIError(f"-p {a.pipeline!r}: {e}") from None
    except VerificationError as e:
        raise CLIError(f"after a pass of {a.pipeline!r}: {e}", a.input) from None
    _write(_print_module(m), a.output, sys.stdout)
    return 0


def _kernel_gate(m: Module, path: str, allowed: bool) -> None:
    if m.kernels and not allowed:
        names = ", ".join("@" + k for k in m.kernels)
        raise CLIError(f"the module holds kernel blocks ({names}); running it compiles and "
                       f"executes their source: pass --allow-kernels if you trust it", path)


def _runner(m: Module, backend: str) -> Runner:
    try:
        b = default_backends().get(backend)
    except KeyError as e:
        raise CLIError(str(e.args[0])) from None
    try:
        return b.prepare(m)
    except Exception as e:  # a backend that cannot take the module says why, in one line
        raise CLIError(f"backend {backend}: {type(e).__name__}: {e}") from None


def _run(runner: Runner, path: str, graph: str | None, inputs: list[object]
         ) -> tuple[list[Any], dict[int, Any]]:
    try:
        res = runner(graph, inputs)
    except InterpretError as e:
        node = e.node
        if node is not None and node.pos is not None:
            raise CLIError(str(e).split(": ", 1)[-1], path, node.pos.line, node.pos.col) \
                from None
        raise CLIError(str(e), path) from None
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        # An op raised on this module and these inputs (an out-of-range index, say): the
        # input's fault, reported where it happened, as eager would raise it.
        node = failed_node(e)
        msg = _one_line(e)
        if node is not None:
            line, col = (node.pos.line, node.pos.col) if node.pos is not None else (0, 0)
            raise CLIError(f"{node.op} failed: {msg}", path, line, col) from None
        raise CLIError(f"running the graph failed: {msg}", path) from None
    return res.outputs, res.updates


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:500]}{'...' if len(text) > 500 else ''}"


def _graph(m: Module, name: str | None, path: str):  # type: ignore[no-untyped-def]
    try:
        return m.graph(name)
    except KeyError as e:
        raise CLIError(str(e.args[0]), path) from None


def cmd_run(a: argparse.Namespace) -> int:
    # Output paths are checked before anything runs: a typo must not cost a long run.
    for flag, path in (("--out", a.out), ("--save-inputs", a.save_inputs)):
        if path:
            _check_writable(path, flag)
    if a.out and a.save_inputs and os.path.realpath(a.out) == os.path.realpath(a.save_inputs):
        raise CLIError(f"--out and --save-inputs name the same file {a.out}")
    m = load_module(a.input, allow_unregistered=a.allow_unregistered)
    _kernel_gate(m, a.input, a.allow_kernels)
    g = _graph(m, a.graph, a.input)
    extras: dict[str, Any] = {}  # a dumped aten graph's philox_seed/philox_offset
    random = has_random_ops(m)
    try:
        if a.out:
            check_result_names(g)
        check_storable(g, results=bool(a.out), params=bool(a.save_inputs))
        limit = 0 if a.inputs else max_input_bytes(a.max_input_bytes)
        inputs = graph_inputs(m, g, a.inputs, a.seed, limit, extras)
    except InputError as e:
        raise CLIError(str(e)) from None
    saved = {p.name: x for p, x in zip(g.params, inputs, strict=True)}
    if random:  # so that `--inputs` of the saved file replays the same random numbers
        saved.update(extras)
    try:
        with torch_seeded(extras, random):
            outputs, updates = _run(_runner(m, a.backend), a.input, a.graph, inputs)
    except InputError as e:
        raise CLIError(str(e), a.input) from None
    if a.out:
        _save(a.out, result_names(g, outputs, updates))
    if a.save_inputs:
        _save(a.save_inputs, saved)
    for i, o in enumerate(outputs):
        print(f"out{i}: {_describe(o)}")
    for p, v in updates.items():
        print(f"{g.params[p].name}: {_describe(v)}")
    return 0


def _save(path: str, tensors: dict[str, Any]) -> None:
    try:
        save_tensors(path, tensors)
    except InputError as e:
        raise CLIError(f"cannot write {path}: {e}") from None
    except Exception as e:  # safetensors' own errors have no common base class
        raise CLIError(f"cannot write {path}: {_one_line(e)}") from None


def _describe(v: object) -> str:
    import torch

    if isinstance(v, torch.Tensor):
        flat = v.detach().reshape(-1)[:6].tolist()
        more = ", ..." if v.numel() > 6 else ""
        return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)} [{', '.join(map(str, flat))}{more}]"
    return repr(v)


def _tolerance(a: argparse.Namespace) -> Tolerance:
    try:
        return Tolerance(a.rtol, a.atol)
    except ValueError as e:
        raise CLIError(str(e)) from None


def cmd_check(a: argparse.Namespace) -> int:
    tol = _tolerance(a)
    before = load_module(a.input, allow_unregistered=a.allow_unregistered)
    _kernel_gate(before, a.input, a.allow_kernels)
    if not a.pipeline and a.backend == "reference":
        raise CLIError("nothing to check: give -p PIPELINE and/or --backend B")
    what = " and ".join(x for x in (repr(a.pipeline) if a.pipeline else "",
                                    f"backend {a.backend}" if a.backend != "reference" else "")
                        if x)
    try:
        after = run_pipeline(before, a.pipeline, verify_each=True,
                             allow_unregistered=a.allow_unregistered)
    except PipelineError as e:
        raise CLIError(f"-p {a.pipeline!r}: {e}") from None
    except VerificationError as e:
        raise CLIError(f"after a pass of {a.pipeline!r}: {e}", a.input) from None
    # an inputs file fits one graph: --graph, else the first
    names = [a.graph] if a.graph else [_graph(before, None, a.input).name] if a.inputs \
        else list(before.graphs)
    ref_runner, new_runner = _runner(before, "reference"), _runner(after, a.backend)
    random = has_random_ops(before)
    diffs: list[Diff] = []
    for name in names:
        g = _graph(before, name, a.input)
        if name not in after.graphs:
            raise CLIError(f"@{name} disappeared under {a.pipeline!r}", a.input)
        if len(after.graph(name).params) != len(g.params):
            raise CLIError(f"@{name} takes {len(after.graph(name).params)} inputs after "
                           f"{a.pipeline!r}, {len(g.params)} before (decomposing random ops "
                           f"adds %philox_seed, %philox_offset: check the decomposed module "
                           f"instead)", a.input)
        extras: dict[str, Any] = {}
        try:
            limit = 0 if a.inputs else max_input_bytes(a.max_input_bytes)
            inputs = graph_inputs(before, g, a.inputs, a.seed, limit, extras)
            with torch_seeded(extras, random):
                ref_out, ref_upd = _run(ref_runner, a.input, name, [_clone(x) for x in inputs])
            with torch_seeded(extras, random):
                try:
                    new_out, new_upd = _run(new_runner, a.input, name,
                                            [_clone(x) for x in inputs])
                except CLIError as e:
                    raise CLIError(f"{what} fails where the reference runs: {e}", e.file,
                                   e.line, e.col) from None
        except InputError as e:
            raise CLIError(str(e), a.input) from None
        labels = [f"@{name} out{i}" for i in range(len(ref_out))]
        labels += [f"@{name} update of %{g.params[p].name}" for p in ref_upd]
        if len(new_out) != len(ref_out) or set(new_upd) != set(ref_upd):
            raise CLIError(f"@{name}: {what} changed the number of results", a.input)
        diffs += compare_results(ref_out + list(ref_upd.values()),
                                 new_out + [new_upd[p] for p in ref_upd], labels, tol)
    bad = [d for d in diffs if not d.ok]
    for d in bad:
        print(f"MISMATCH {d.describe()}")
    if bad:
        hint = (" (the graph draws random numbers: the reference from torch's generator, a "
                "decomposing backend from philox; decompose it first with ember opt -p "
                "decompose)") if random else ""
        raise CLIError(f"mismatch with {what}: {len(bad)} of {len(diffs)} result(s) differ "
                       f"beyond tolerance; first: {bad[0].describe()}{hint}", a.input)
    worst = max(diffs, key=lambda d: d.max_abs / d.scale, default=None)
    print(f"ok: {len(diffs)} result(s) of {len(names)} graph(s) match with {what} within "
          f"{tol.describe()}" + (f"; closest call: {worst.describe()}" if worst else ""))
    return 0


def cmd_minimize(a: argparse.Namespace) -> int:
    tol = _tolerance(a)
    if a.output is None and a.input == "-":
        raise CLIError("-o OUT.ir is needed when the module comes from stdin")
    out = a.output or (a.input[:-3] if a.input.endswith(".ir") else a.input) + ".min.ir"
    inputs_out = (out[:-3] if out.endswith(".ir") else out) + ".inputs.safetensors"
    _check_writable(out, "-o")
    _check_writable(inputs_out, "-o")
    m = load_module(a.input, allow_unregistered=a.allow_unregistered)
    _kernel_gate(m, a.input, a.allow_kernels)
    g = _graph(m, a.graph, a.input)
    try:
        default_backends().get(a.backend)
    except KeyError as e:
        raise CLIError(str(e.args[0])) from None
    try:
        limit = 0 if a.inputs else max_input_bytes(a.max_input_bytes)
        inputs = graph_inputs(m, g, a.inputs, a.seed, limit)
    except InputError as e:
        raise CLIError(str(e), a.input) from None

    def log(line: str) -> None:
        sys.stderr.write(f"ember minimize: {line}\n")

    try:
        rep = minimize(m, inputs, a.backend, graph=g.name, tol=tol, log=log)
    except MinimizeError as e:
        raise CLIError(str(e), a.input) from None
    try:
        ir_path, in_path = rep.write(out)
    except (OSError, InputError) as e:
        raise CLIError(f"cannot write the repro: {e}") from None
    print(f"minimized @{g.name} from {rep.nodes_before} to {rep.nodes} node(s) "
          f"({rep.runs} backend runs); it still fails: {rep.failure.summary}")
    print(f"wrote {ir_path} and {in_path}; replay: ember check {ir_path} --backend "
          f"{a.backend} --inputs {in_path}")
    return 0


def _clone(x: object) -> object:
    import torch

    return x.clone() if isinstance(x, torch.Tensor) else x


def cmd_passes(a: argparse.Namespace) -> int:
    for p in default_pass_registry().all().values():
        opts = ""
        if p.options:
            opts = " {" + ", ".join(f"{o.name}: {o.type.__name__} = {o.default}"
                                    for o in p.options.values()) + "}"
        print(f"{p.name:<16}{p.summary}{opts}")
    # named pipelines: usable wherever a pass name is (`ember opt -p inductor`)
    print("pipelines:")
    for pl in default_pass_registry().pipelines().values():
        print(f"{pl.name:<16}{pl.summary}\n{'':<16}= {pl.text}")
    from ember.prims.decomp.table import decomposition_tables

    print("decomposition tables (decompose{table=NAME}):")
    for name, t in decomposition_tables().all().items():
        print(f"{name:<16}{len(t)} ops")
    from ember.inductor.lowering_plugins import lowering_tables

    print("lowering tables (lower-loops{table=NAME}):")
    for name, rules in lowering_tables().items():
        print(f"{name:<16}{len(rules)} prims")
    return 0


def cmd_backends(a: argparse.Namespace) -> int:
    """Every backend of the one protocol (ember.ir.backends): ember's, and third parties' from
    the `ember.backends` entry point group; `run`, `check`, `minimize` and compile() take each."""
    for b in default_backends().all().values():
        caps = [c for c, on in (("training", getattr(b, "supports_training", False)),
                                (f"pipeline {getattr(b, 'pipeline', '')}",
                                 getattr(b, "pipeline", None))) if on]
        extra = f" [{'; '.join(caps)}]" if caps else ""
        print(f"{b.name:<16}{b.summary}{extra}")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"ember: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ember", description="ember: dump, edit, optimize and replay ir-v1 modules")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("input", help="an ir-v1 file ('-' for stdin)")
        sp.add_argument("--allow-unregistered", action="store_true",
                        help="let the verifier accept ops it does not know")
        sp.add_argument("--allow-effects", action="store_true",
                        help="accept and run ops with effects outside the graph (aten.from_file "
                             "reads a file, aten.save writes one, printing, seeding, "
                             "collectives): only for IR you trust")
        sp.add_argument("--load", action="append", default=[], metavar="MODULE",
                        help="import this Python module first (repeatable), e.g. one that "
                             "registers torch.library custom ops the IR names: it runs the "
                             "module's code, as `python -m MODULE` would")
        sp.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)

    o = sub.add_parser("opt", help="run a pass pipeline over a module (like mlir-opt)")
    common(o)
    o.add_argument("-p", "--pipeline", default="", help="e.g. 'dce,cse' or 'fuse{max_nodes=64}'")
    o.add_argument("-o", "--output", help="write the result here (default: stdout)")
    o.add_argument("--verify-each", action="store_true", help="verify after every pass")
    o.add_argument("--print-after-all", action="store_true",
                   help="print the IR after every pass to stderr")
    o.set_defaults(fn=cmd_opt)

    r = sub.add_parser("run", help="run a graph on inputs and write its outputs")
    common(r)
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--inputs", help="safetensors file keyed by parameter name (without %%), "
                     "each of exactly its parameter's declared type; scalars as 0-dim tensors "
                     "(an integer for f64 is fine, a float for i64 is not)")
    src.add_argument("--random", action="store_true",
                     help="random inputs at the symbols' hints (integers in [0, 2)); a "
                     "decomposed graph's %%philox_seed gets --seed, its %%philox_offset 0, and "
                     "an aten graph's random ops draw from torch seeded with --seed")
    r.add_argument("--seed", type=int, default=0, help="seed for --random")
    r.add_argument("--out", help="write the results: outputs as out0, out1, ..., updated "
                   "parameters under their own name (out<N> is reserved for outputs: a "
                   "module that updates a parameter named so is refused)")
    r.add_argument("--save-inputs", help="also write the inputs used (with --random)")
    r.add_argument("--max-input-bytes", metavar="SIZE",
                   help=f"refuse --random inputs larger than this (e.g. 16G; default: "
                        f"${MAX_INPUT_BYTES_ENV} or 4G)")
    r.add_argument("--graph", help="the graph to run (default: the first)")
    r.add_argument("--backend", default="reference",
                   help="how to run it (see `ember backends`; default: reference)")
    r.add_argument("--allow-kernels", action="store_true",
                   help="allow running a module that holds kernel blocks")
    r.set_defaults(fn=cmd_run)

    def inputs_and_tolerances(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--inputs", help="inputs from this safetensors file (as for `run`; an "
                        "EMBER_DUMP's NAME.inputs.safetensors) instead of random ones")
        sp.add_argument("--seed", type=int, default=0, help="seed for random inputs")
        sp.add_argument("--max-input-bytes", metavar="SIZE",
                        help=f"refuse random inputs larger than this (default: "
                             f"${MAX_INPUT_BYTES_ENV} or 4G)")
        sp.add_argument("--rtol", type=float, help="relative tolerance for every float dtype "
                        "(default per dtype: f32 1e-4, f16 1e-2, bf16 5e-2, f64 1e-7)")
        sp.add_argument("--atol", type=float, help="absolute tolerance, times max(1, the "
                        "largest |value| of the expected result) (default per dtype: f32 1e-5, "
                        "f16 1e-3, bf16 1e-2, f64 1e-7)")
        sp.add_argument("--allow-kernels", action="store_true",
                        help="allow running a module that holds kernel blocks")

    c = sub.add_parser("check", help="compare the reference run of a graph with its run after "
                       "passes and/or on a backend, within whole-graph tolerances")
    common(c)
    c.add_argument("-p", "--pipeline", default="", help="passes to check")
    c.add_argument("--backend", default="reference",
                   help="run the transformed module with this backend (vs the reference)")
    c.add_argument("--graph", help="check only this graph (default: all; with --inputs, the "
                   "first)")
    inputs_and_tolerances(c)
    c.set_defaults(fn=cmd_check)

    mn = sub.add_parser("minimize", help="shrink a graph on which a backend raises or "
                        "disagrees with the reference to a small repro (.ir + inputs)")
    common(mn)
    mn.add_argument("--backend", required=True, help="the backend that fails")
    mn.add_argument("-o", "--output", help="the repro's .ir (default: IN.min.ir); its inputs "
                    "go to OUT.inputs.safetensors")
    mn.add_argument("--graph", help="the graph to minimize (default: the first)")
    inputs_and_tolerances(mn)
    mn.set_defaults(fn=cmd_minimize)

    ps = sub.add_parser("passes", help="list the registered passes")
    ps.set_defaults(fn=cmd_passes)

    bs = sub.add_parser("backends", help="list the backends `run`, `check` and compile() "
                        "can use")
    bs.set_defaults(fn=cmd_backends)

    add_explain_command(sub)
    add_verify_command(sub)
    return p


def load_modules(names: Sequence[str]) -> None:
    """`--load MODULE`: import each module before the IR is read, so the custom ops it
    registers (torch.library) resolve. Importing runs the module's code: loading it is the
    user's explicit choice, as with `python -m`; the current directory is searched last."""
    import importlib

    for name in names:
        added = os.getcwd() not in sys.path
        if added:
            sys.path.append(os.getcwd())
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise CLIError(f"--load {name}: {type(e).__name__}: {e}") from None
        except Exception as e:  # the module's own code failed
            raise CLIError(f"--load {name}: importing it raised {type(e).__name__}: {e}") \
                from None
        finally:
            if added:
                sys.path.remove(os.getcwd())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # ember.ir refuses ops with effects outside the graph unless this says otherwise
        load_modules(getattr(args, "load", []))
        with allow_effects(bool(getattr(args, "allow_effects", False))):
            return int(args.fn(args))
    except CLIError as e:
        if args.debug:
            raise
        sys.stderr.write(e.render() + "\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # unexpected: one line unless --debug
        if args.debug:
            raise
        sys.stderr.write(f"ember: internal error: {type(e).__name__}: {e} "
                         f"(run with --debug for the traceback)\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
