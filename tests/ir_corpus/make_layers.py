"""Regenerate the layer corpus (tests/ir_corpus/layers/): `python tests/ir_corpus/make_layers.py
[NAME ...]` (all programs, or the named ones: `bn_stats dropout`).

Each program is one graph of the aten corpus (or, for dropout, the aten text below), lowered
with today's passes and saved at every layer boundary, so the text of each layer as ember once
printed it stays readable and runnable (the compatibility promise for layers below aten):

- `NAME.prims.ir`    after `to-prims`
- `NAME.loops.ir`    after `to-prims,lower-loops`
- `NAME.fused.ir`    after `to-prims,lower-loops,fuse` (no schedule attributes: fused IR from
                     before `schedule-cpu` existed must keep compiling)
- `NAME.kernels.ir`  after `to-prims,conv-nhwc,lower-loops,fuse,schedule-cpu,codegen-cpp,
                     plan-buffers` (a `kernels.*` graph with its C++ kernel blocks)

plus `NAME.in.safetensors` (a decomposed random graph also takes `philox_seed`/`philox_offset`)
and `NAME.out.safetensors`: eager's results, from the Python functions of make_corpus.py (for
dropout: eager's ops with ember's Philox numbers, which eager's generator cannot give). Each .ir
file starts with RUN/EXPECT/TOLERANCE lines (runlines.py) that tests/test_ir_corpus_layers.py
runs. Only regenerate on purpose: the corpus is a compatibility promise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ember.ir import Module, parse, verify
from ember.ir.passes import run_pipeline
from ember.prims import philox

if __package__ in (None, ""):  # run as a script: make `tests.ir_corpus` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.ir_corpus import make_corpus  # noqa: E402

aten = torch.ops.aten
HERE = Path(__file__).parent
LAYERS = HERE / "layers"
STAGES: dict[str, str] = {
    "prims": "to-prims",
    "loops": "to-prims,lower-loops",
    "fused": "to-prims,lower-loops,fuse",
    "kernels": "to-prims,conv-nhwc,lower-loops,fuse,schedule-cpu,codegen-cpp,plan-buffers",
}

DROPOUT_IR = """\
ember.ir 1.0

symbol s0 hint=4 min=1

graph @dropout(%x: f32[s0, 8], %w: f32[8, 8]) -> (f32[s0, 8], b8[s0, 8], b8[s0, 8]) {
  %y, %m1 = aten.native_dropout.default(%x, 0.25, true) : (f32[s0, 8], b8[s0, 8])
  %h = aten.mm.default(%y, %w) : f32[s0, 8]
  %r = aten.relu.default(%h) : f32[s0, 8]
  %z, %m2 = aten.native_dropout.default(%r, 0.5, true) : (f32[s0, 8], b8[s0, 8])
  return (%z, %m1, %m2)
}
"""


def dropout(x: torch.Tensor, w: torch.Tensor, philox_seed: torch.Tensor,
            philox_offset: torch.Tensor) -> dict[str, Any]:
    """Eager's ops on ember's random numbers: the graph's draws take consecutive counters."""
    seed, off, n = int(philox_seed), int(philox_offset), x.numel()
    m1 = aten.lt.Scalar(philox.uniform(seed, off, x.shape, torch.float32), 0.75)
    y = aten.mul.Tensor(aten.mul.Tensor(x, m1), 1 / 0.75)
    r = aten.relu.default(aten.mm.default(y, w))
    m2 = aten.lt.Scalar(philox.uniform(seed, off + n, r.shape, torch.float32), 0.5)
    return make_corpus._outs(aten.mul.Tensor(aten.mul.Tensor(r, m2), 2.0), m1, m2)


@dataclass(frozen=True)
class Program:
    name: str
    source: str  # the aten module's text
    origin: str  # where it comes from, for the header
    graph: str
    eager: Callable[..., dict[str, Any]]
    inputs: dict[str, torch.Tensor]
    # how far (rtol, atol) each layer's runs may be from eager here; bitwise where they match
    tolerance: tuple[float, float] = (0.0, 0.0)


def _case(file: str, graph: str) -> tuple[Callable[..., dict[str, Any]], dict[str, torch.Tensor]]:
    ((fn, inputs),) = [(fn, i) for f, g, fn, i in make_corpus.CASES if (f, g) == (file, graph)]
    return fn, inputs


def _from_corpus(name: str, file: str, graph: str, tolerance: tuple[float, float]) -> Program:
    fn, inputs = _case(file, graph)
    return Program(name, (HERE / f"{file}.ir").read_text(), f"tests/ir_corpus/{file}.ir",
                   graph, fn, inputs, tolerance)


def programs() -> list[Program]:
    g = torch.Generator().manual_seed(21)
    drop_in = {"x": torch.randn(5, 8, generator=g), "w": torch.randn(8, 8, generator=g),
               "philox_seed": torch.tensor(1234), "philox_offset": torch.tensor(40)}
    return [
        # a symbolic sequence length through the CPU flash attention decomposition
        _from_corpus("attention_block", "attention", "block", (1e-5, 1e-5)),
        _from_corpus("convnet", "convnet", "net", (1e-5, 1e-5)),
        _from_corpus("bn_stats", "mutation", "bn_stats", (1e-6, 1e-6)),  # input_updates
        _from_corpus("norm_rows", "symbolic_multi", "norm_rows", (1e-6, 1e-6)),  # two symbols
        Program("dropout", DROPOUT_IR, "make_layers.py's DROPOUT_IR", "dropout", dropout,
                drop_in, (1e-6, 1e-6)),
    ]


def one_graph(text: str, graph: str) -> Module:
    """The module with only `graph` (and every symbol: unused ones are harmless)."""
    m = parse(text)
    return Module(symbols=dict(m.symbols), items={graph: m.graph(graph)})


def header(p: Program, stage: str) -> str:
    inp = f"%S/{p.name}.in.safetensors"
    runs = [f"ember run %s --inputs {inp} --backend reference --out %t",
            f"ember run %s --inputs {inp} --backend inductor --out %t"]
    if stage == "fused":  # the fused text compiled by the passes after fuse, without `fuse`
        runs.append(f"ember check %s -p schedule-cpu,codegen-cpp,plan-buffers --inputs {inp}")
    if stage == "kernels":  # our own golden C++: compiling it is what is being checked
        runs = [r.replace(" --out", " --allow-kernels --out") for r in runs]
    torch_v = torch.__version__.split("+")[0]
    lines = [f"{p.name}: @{p.graph} of {p.origin} at the {stage} layer, after "
             f"`{STAGES[stage]}`.",
             f"Generated by tests/ir_corpus/make_layers.py with ember {version('ember')}, "
             f"torch {torch_v}; regenerate only on purpose.",
             *[f"RUN: {r}" for r in runs],
             f"EXPECT: {p.name}.out.safetensors",
             f"TOLERANCE: rtol={p.tolerance[0]:g} atol={p.tolerance[1]:g}"]
    return "".join(f"# {line}\n" for line in lines)


def dumps(p: Program) -> dict[str, str]:
    """Each stage's file as today's passes and printer write it (what `main` saves)."""
    src = one_graph(p.source, p.graph)
    verify(src)
    return {stage: header(p, stage) + str(run_pipeline(src, pipeline))
            for stage, pipeline in STAGES.items()}


def main(names: list[str] | None = None) -> None:
    LAYERS.mkdir(exist_ok=True)
    for p in programs():
        if names and p.name not in names:
            continue
        for stage, text in dumps(p).items():
            (LAYERS / f"{p.name}.{stage}.ir").write_text(text)
        expected = p.eager(**{k: v.clone() for k, v in p.inputs.items()})
        stem = LAYERS / p.name
        save_file({k: v.contiguous() for k, v in p.inputs.items()}, f"{stem}.in.safetensors")
        save_file({k: v.contiguous() for k, v in expected.items()}, f"{stem}.out.safetensors")
        print(f"wrote layers/{p.name}.{{{','.join(STAGES)}}}.ir and its in/out safetensors")


if __name__ == "__main__":
    main(sys.argv[1:])
