"""The op database's "cpu kernel" check: each op of the pointwise, activation and reduction
families, decomposed, lowered to loops, fused and compiled to C++ (backend "inductor"), against
eager torch, over the entry's hypothesis samples (non-contiguous inputs, 0- and 1-sized dims,
every dtype the entry draws).

To bound CPU time (every distinct shape and dtype is a new C++ source), one hypothesis example
draws one sample for every op of a family and builds one module holding a graph per op: one g++
call per example. A failing example names every op that failed. The compiled graph of each op
must be kernels only (`kernels.call`, `kernels.extern`, `kernels.view`): a kernel left to the reference
interpreter (`cpp_fallback`) fails the check. `SKIP` lists the ops the inductor cannot handle yet,
with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Graph, Module, Ref
from ember.prims.decomp import DECOMPOSITIONS, decompose_module
from ember.prims.testing.harness import assert_outputs_close, eager, op_module
from ember.prims.testing.opdb import CHECK_SCOPE, OpEntry, Sample, load_all

PIPELINE = "lower-loops,fuse,codegen-cpp"

# The families this check runs, and op -> why the inductor cannot run it as C++ kernels yet
# (declared with the op database, so docs/ops.md shows the same).
_FAMILIES, SKIP = CHECK_SCOPE["cpu kernel"]
FAMILIES = tuple(sorted(_FAMILIES))

OPDB = load_all()


def family_entries(family: str) -> list[OpEntry]:
    return [e for e in OPDB.entries() if e.family == family and e.op not in SKIP
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
        m.add(g)
        inputs[g.name] = ins
    return m, inputs


def not_kernels(compiled: Module, graph: str) -> list[str]:
    """The nodes of a compiled graph that do not run compiled code, with the reasons."""
    out = []
    for n in compiled.graph(graph).nodes:
        if n.op in ("kernels.call", "kernels.extern", "kernels.view"):
            continue
        ref = n.args[0] if n.args else None
        body = compiled.items.get(ref.name) if isinstance(ref, Ref) else None
        why = body.attrs.get("cpp_fallback") if isinstance(body, Graph) else None
        out.append(f"{n.op} ({why})" if why else n.op)
    return out


def check_family(entries: list[OpEntry], samples: Mapping[str, Sample]) -> dict[str, str]:
    """op -> failure, for every entry whose compiled graph is not kernels only or whose outputs
    differ from eager."""
    m, inputs = build(entries, samples)
    compiled = compile_module(m, PIPELINE)
    run = compiled_runner(compiled)
    failures: dict[str, str] = {}
    for k, e in enumerate(entries):
        name, s = _graph_name(k), samples[e.op]
        if name not in inputs:
            continue
        left = not_kernels(compiled, name)
        if left:
            failures[e.op] = f"{s!r}: not compiled: {', '.join(left)}"
            continue
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs[name]]
        try:
            got = list(run(name, args).outputs)
            want = e.reference(s) if e.reference is not None else eager(e.op, s)
            if e.results is not None:
                want = [want[i] for i in e.results]
            if e.compare is not None:
                e.compare(s, got, want)
            else:
                assert_outputs_close(e, got, want)
        except AssertionError as err:
            failures[e.op] = f"{s!r}: {str(err).splitlines()[0]}"
    return failures


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_kernels_match_eager(family: str) -> None:
    entries = family_entries(family)
    assert entries
    strategy = st.fixed_dictionaries({e.op: e.samples() for e in entries})

    @settings(max_examples=6, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(strategy)
    def run(samples: dict[str, Sample]) -> None:
        failures = check_family(entries, samples)
        assert not failures, "\n".join(f"{op}: {why}" for op, why in sorted(failures.items()))

    run()


def test_skip_reasons_name_real_entries() -> None:
    for op, why in SKIP.items():
        assert op in OPDB and OPDB[op].family in FAMILIES and why, op
