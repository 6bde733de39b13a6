"""The op database's "cpu kernel" check, shared by test_opdb_cpu.py and by whoever wants to
probe one family by hand:

    .venv/bin/python -m packages.inductor.tests.opdb_cpu_check shape 20   # 20 drawn examples

What it runs comes from the data file `opdb_cpu.toml` next to this module (families, skipped
ops, ops allowed to keep a kernel on the reference interpreter, each with the reason);
ember.testing.coverage renders docs/ops.md from the same file.

One check builds one module holding a graph per op of a family (one sample each), compiles it
once (decompose -> lower-loops -> fuse -> codegen-cpp, one g++ build), and compares each graph's
outputs with eager torch (the entry's tolerance or `compare`). The compiled graph must be
kernels only (`kernels.call`, `kernels.extern`, `kernels.view`): a kernel left to the reference
interpreter (`cpp_fallback`) fails unless the op is in the fallback table. Random ops cannot
match eager's generator: they are compared with the entry's `compare` (dtype, shape, range of
values, dropout's `x * mask * scale`) and with the decomposed graph run on the reference
interpreter from the same philox seed and offset: the compiled code draws the same bits, and the
transforms after them (Box-Muller's log and cos in C++) agree within the dtype's tolerance.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the passes and the kernels dialect)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import DType, Graph, GraphBuilder, Interpreter, Module, Ref, TensorType
from ember.prims.decomp import DECOMPOSITIONS, decompose_module
from ember.prims.decomp.random import run_with_philox
from ember.testing.coverage import CheckScope, read_scope
from ember.testing.harness import assert_outputs_close, eager, op_module
from ember.testing.opdb import OpEntry, Sample, load_all

PIPELINE = "lower-loops,fuse,codegen-cpp"
SCOPE: CheckScope = read_scope(Path(__file__).with_name("opdb_cpu.toml"))
OPDB = load_all()
KERNEL_OPS = ("kernels.call", "kernels.extern", "kernels.view")


def family_entries(family: str) -> list[OpEntry]:
    """The entries of a family the check runs."""
    return [e for e in OPDB.entries() if e.family == family and e.op not in SCOPE.skip
            and "cpu kernel" not in e.gaps]


def _graph_name(k: int) -> str:
    return f"op{k}"


def _eager_rejects(e: OpEntry, s: Sample) -> bool:
    try:
        eager(e.op, s)
    except Exception:
        return True
    return False


def build(entries: list[OpEntry], samples: Mapping[str, Sample]
          ) -> tuple[Module, dict[str, list[Any]]]:
    """One decomposed module with a graph `@op<k>` per entry, and each graph's inputs. A sample
    that the op's meta kernel rejects (and eager rejects too) is left out of the module."""
    m = Module()
    inputs: dict[str, list[Any]] = {}
    for k, e in enumerate(entries):
        try:
            one, ins = op_module(e.op, samples[e.op], returns=e.results)
        except Exception:
            if _eager_rejects(e, samples[e.op]):
                continue
            raise
        d = decompose_module(one, DECOMPOSITIONS)
        g = d.graph("f")
        g.name = _graph_name(k)
        m.add(g)  # concrete sizes: the decomposed module declares no symbols
        inputs[g.name] = ins
    return m, inputs


def not_kernels(compiled: Module, graph: str, why_attr: str = "cpp_fallback") -> list[str]:
    """The nodes of a compiled graph that do not run compiled code, with the reasons (a
    body's `why_attr`: the C++ target's, or the Triton target's "triton_fallback")."""
    out = []
    for n in compiled.graph(graph).nodes:
        if n.op in KERNEL_OPS:
            continue
        ref = n.args[0] if n.args else None
        body = compiled.items.get(ref.name) if isinstance(ref, Ref) else None
        why = body.attrs.get(why_attr) if isinstance(body, Graph) else None
        out.append(f"{n.op} ({why})" if why else n.op)
    return out


def _clone(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _check_one(e: OpEntry, s: Sample, got: list[Any]) -> None:
    want = e.reference(s) if e.reference is not None else eager(e.op, s)
    if e.results is not None:
        want = [want[i] for i in e.results]
    if e.compare is not None:
        e.compare(s, got, want)
    else:
        assert_outputs_close(e, got, want)


def check_family(entries: list[OpEntry], samples: Mapping[str, Sample]) -> dict[str, str]:
    """op -> failure, for every entry whose compiled graph is not kernels only (outside the
    fallback table) or whose outputs differ from eager (random ops: from the reference)."""
    return check_compiled(entries, samples, PIPELINE, SCOPE.fallback)


def check_compiled(entries: list[OpEntry], samples: Mapping[str, Sample], pipeline: str,
                   fallback: Collection[str], why_attr: str = "cpp_fallback",
                   device: str = "cpu") -> dict[str, str]:
    """check_family's work for a target: `build`'s module compiled by `pipeline`, each graph
    required to be kernels only (`not_kernels`) unless its op is in `fallback`, its outputs
    compared with eager's (off the CPU: where eager has a kernel for the sample)."""
    m, inputs = build(entries, samples)
    compiled = compile_module(m, pipeline)
    reference = Interpreter(m)
    failures: dict[str, str] = {}
    for k, e in enumerate(entries):
        name, s = _graph_name(k), samples[e.op]
        if name not in inputs:
            continue
        left = not_kernels(compiled, name, why_attr)
        if left and e.op not in fallback:
            failures[e.op] = f"{s!r}: not compiled: {', '.join(left)}"
            continue
        if device != "cpu" and _eager_rejects(e, s):
            continue  # eager has no kernel for it on this device (e.g. int8 addmm on cuda)
        try:
            # a fresh runner per graph: its philox offset starts at 0, as the reference's does
            got = list(compiled_runner(compiled)(name, _clone(inputs[name])).outputs)
            _check_one(e, s, got)
            if e.family == "random":
                ref, _ = run_with_philox(reference, name, _clone(inputs[name]),
                                         torch.initial_seed(), 0)
                try:
                    assert_outputs_close(e, got, list(ref.outputs))
                except AssertionError as err:
                    raise AssertionError(f"differs from the reference: {err}") from None
        except AssertionError as err:
            failures[e.op] = f"{s!r}: {str(err).splitlines()[0]}"
    return failures


def prim_module(samples: Mapping[str, list[torch.Tensor]]) -> Module:
    """A module with a graph `@op<k>` per prim, calling it on tensor operands (no
    decomposition)."""
    m = Module()
    for k, (prim, operands) in enumerate(samples.items()):
        gb = GraphBuilder(m, _graph_name(k))
        params = [gb.param(f"a{j}", TensorType(DType.from_torch(x.dtype), tuple(x.shape)))
                  for j, x in enumerate(operands)]
        gb.ret(gb.emit(prim, params, {}))
    return m


def check_prims(samples: Mapping[str, list[torch.Tensor]], pipeline: str = PIPELINE,
                why_attr: str = "cpp_fallback") -> None:
    """Each prim compiled to C++ kernels only (or by another target's `pipeline`, its fallback
    reason `why_attr`), against the prim's own (torch) implementation; all in one module (one
    build)."""
    m = prim_module(samples)
    compiled = compile_module(m, pipeline)
    for k, (prim, operands) in enumerate(samples.items()):
        name = _graph_name(k)
        left = not_kernels(compiled, name, why_attr)
        assert not left, f"{prim}: not compiled: {', '.join(left)}"
        got = compiled_runner(compiled)(name, _clone(operands)).outputs
        want = Interpreter(m).run(_clone(operands), name).outputs
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=lambda msg: f"{prim}: {msg}")  # noqa: B023


def examples_from_env(var: str, default: int) -> int:
    """Hypothesis examples per family: the environment's `var`, a positive integer."""
    raw = os.environ.get(var, str(default))
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{var} must be a positive integer, not {raw!r}")
    return int(raw)


def run_family(check: Callable[[list[OpEntry], Mapping[str, Sample]], dict[str, str]],
               entries: list[OpEntry], examples: int) -> None:
    """`check` (a check_family) over `examples` hypothesis draws of one sample per entry; a
    failing draw names every op that failed."""
    assert entries
    strategy = st.fixed_dictionaries({e.op: e.samples() for e in entries})

    @settings(max_examples=examples, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(strategy)
    def run(samples: dict[str, Sample]) -> None:
        failures = check(entries, samples)
        assert not failures, "\n".join(f"{op}: {why}" for op, why in sorted(failures.items()))

    run()


def probe(family: str, examples: int) -> dict[str, str]:
    """Draw `examples` samples per op of the family (outside hypothesis's search: a quick look
    at what fails); op -> first failure."""
    from hypothesis import strategies as st

    entries = family_entries(family)
    strategy = st.fixed_dictionaries({e.op: e.samples() for e in entries})
    found: dict[str, str] = {}
    for _ in range(examples):
        samples = strategy.example()
        try:
            fails = check_family(entries, samples)
        except Exception as err:  # a crash of the whole module: report it, keep probing
            fails = {"<module>": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        for op, why in fails.items():
            found.setdefault(op, why)
    return found


if __name__ == "__main__":
    fam = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    for op, why in sorted(probe(fam, n).items()):
        print(f"{op}: {why}")
