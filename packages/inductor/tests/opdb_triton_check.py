"""The op database's "triton kernel" check, shared by test_opdb_triton.py, by the device script
(benchmarks/gpu_cuda_suite.py, real launches on CUDA with bf16) and by whoever probes a family:

    .venv/bin/python -m packages.inductor.tests.opdb_triton_check pointwise 20

What it runs comes from the data file `opdb_triton.toml` next to this module (families, skipped
ops, ops allowed to keep a kernel on the reference interpreter, each with the reason);
ember.testing.coverage renders docs/ops.md's "triton kernel" column from it.

Like the "cpu kernel" check (opdb_cpu_check.py, whose module builder and comparisons this
reuses): one module holding a graph per op of a family (one sample each) is lowered to loops,
fused and rendered as Triton kernels (`codegen-triton`), and each graph's outputs are compared
with eager. The compiled graph must be kernels only: a loop kernel left to the reference
interpreter (`triton_fallback`) fails unless the op is in the fallback table.

On `device="cpu"` (CI, no GPU) the kernels run in Triton's interpreter (TRITON_INTERPRET=1 must
be set before triton is imported; libdevice is numpy's there, interp_libdevice.py), and samples
holding bf16 tensors are left out: the interpreter's bf16 arithmetic is wrong. On
`device="cuda"` the samples are moved to the GPU, eager runs there, and bf16 is checked.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import ember.inductor  # noqa: F401  (registers the passes and the kernels dialect)
from ember.testing.coverage import CheckScope, read_scope
from ember.testing.opdb import OpEntry, Sample, load_all
from packages.inductor.tests.opdb_cpu_check import check_compiled
from packages.inductor.tests.opdb_cpu_check import check_prims as check_prims_with

PIPELINES = {"cpu": "lower-loops,fuse,schedule-cuda,codegen-triton{interpret=true},plan-buffers",
             "cuda": "lower-loops,fuse,schedule-cuda,codegen-triton,plan-buffers"}
SCOPE: CheckScope = read_scope(Path(__file__).with_name("opdb_triton.toml"))
OPDB = load_all()


def family_entries(family: str) -> list[OpEntry]:
    """The entries of a family the check runs."""
    return [e for e in OPDB.entries() if e.family == family and e.op not in SCOPE.skip
            and "triton kernel" not in e.gaps]


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    if isinstance(v, Mapping):
        return [t for x in v.values() for t in _tensors(x)]
    return []


def _move(v: Any, device: str) -> Any:
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(_move(x, device) for x in v)
    return v


def takes_device(op: str) -> bool:
    """The aten overload `op` ("aten.arange.default") has a `device` argument (a factory)."""
    _, name, overload = op.split(".")
    fn = getattr(getattr(torch.ops.aten, name, None), overload, None)
    return fn is not None and any(a.name == "device" for a in fn._schema.arguments)


def on_device(s: Sample, device: str, op: str = "") -> Sample:
    """The sample with its tensors on `device` (strides kept where `.to` keeps them); a factory
    op (arange, rand, ...) called with no device gets `device` too: called as an aten overload
    it ignores `with torch.device(...)` and would make cpu tensors beside the cuda ones."""
    if device == "cpu":
        return s
    kwargs = {k: _move(v, device) for k, v in s.kwargs.items()}
    if op and "device" not in kwargs and takes_device(op):
        kwargs["device"] = torch.device(device)
    return Sample(_move(s.args, device), kwargs)


def runnable(s: Sample, device: str) -> bool:
    """Whether the check runs the sample on `device`: the interpreter computes bf16 wrongly."""
    if device != "cpu":
        return True
    ts = _tensors(s.args) + _tensors(dict(s.kwargs))
    return not any(t.dtype == torch.bfloat16 for t in ts) and not any(
        v is torch.bfloat16 for v in [*s.args, *s.kwargs.values()])


def check_family(entries: list[OpEntry], samples: Mapping[str, Sample], device: str = "cpu"
                 ) -> dict[str, str]:
    """op -> failure, for every entry whose compiled graph is not Triton kernels only (outside
    the fallback table) or whose outputs differ from eager (random ops: from the reference)."""
    samples = {op: on_device(s, device, op) for op, s in samples.items()
               if runnable(s, device)}
    entries = [e for e in entries if e.op in samples]
    # creation ops (no tensor operand) make their tensors on the default device: the device
    # checked, in the graphs and in eager, so that a module's graphs all run on one device
    with torch.device(device) if device != "cpu" else contextlib.nullcontext():
        return _check(entries, samples, device)


def _check(entries: list[OpEntry], samples: Mapping[str, Sample], device: str
           ) -> dict[str, str]:
    return check_compiled(entries, samples, PIPELINES[device], SCOPE.fallback,
                          "triton_fallback", device)


def check_prims(samples: Mapping[str, list[torch.Tensor]], device: str = "cpu") -> None:
    """Each prim compiled to Triton kernels only, against the prim's own (torch)
    implementation; all in one module."""
    on = {p: [x.to(device) for x in xs] for p, xs in samples.items()}
    check_prims_with(on, PIPELINES[device], "triton_fallback")


def probe(family: str, examples: int, device: str = "cpu") -> dict[str, str]:
    """Draw `examples` samples per op of the family (outside hypothesis's search: a quick look
    at what fails); op -> first failure."""
    import traceback
    import warnings

    from hypothesis import strategies as st

    warnings.filterwarnings("ignore", message=".*example.*")
    entries = family_entries(family)
    strategy = st.fixed_dictionaries({e.op: e.samples() for e in entries})
    found: dict[str, str] = {}
    for _ in range(examples):
        samples = strategy.example()
        try:
            fails = check_family(entries, samples, device)
        except Exception as err:  # a crash of the whole module: report it, keep probing
            fails = {"<module>": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}\n"
                                 f"{traceback.format_exc(limit=-4)}"}
        for op, why in fails.items():
            found.setdefault(op, why)
    return found


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        sys.exit("set TRITON_INTERPRET=1 (no CUDA device here)")
    fam = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    dev = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    for op, why in sorted(probe(fam, n, dev).items()):
        print(f"{op}: {why}")
