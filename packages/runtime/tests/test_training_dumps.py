"""A training compile's dumps replay (issue 13 #7): with dumps on, a graph that records
gradients writes the prims graph, the joint module (@forward and @backward), and each of the
forward's and backward's pipeline stages under names of their own, with the inputs and outputs
of the first call (the backward's: the saved values and the cotangents), so every file passes
`ember check` and `ember run` of it gives the dumped outputs."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ember.runtime as er
from ember.ir import parse
from ember.runtime.check import compare_one
from ember.runtime.cli import main


def _io(ir: Path) -> list[tuple[str | None, str]]:
    """(--graph, the STEM[.forward|.backward] its inputs and outputs are named by) per replay."""
    parts = ir.name.split(".")
    if parts[1] == "joint":
        return [(w, f"{parts[0]}.{w}") for w in ("forward", "backward")]
    if parts[1] in ("forward", "backward"):
        return [(None, f"{parts[0]}.{parts[1]}")]
    return [(None, parts[0])]  # the captured graph, its prims graph


def test_training_compile_dumps_every_stage_and_each_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 8), torch.nn.ReLU(),
        torch.nn.Linear(8, 5)).train()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(net(x), y)

    c = er.compile(step, options={"dump_dir": str(tmp_path), "dump_each": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error", er.FallbackWarning)  # the dumps are of compiled graphs
        c(torch.randn(2, 3, 6, 6), torch.tensor([1, 3])).backward()
    assert not er.explain(c).fallbacks
    names = {p.name for p in tmp_path.glob("*.ir")}
    for f in ("step_0.ir", "step_0.prims.ir", "step_0.joint.ir", "step_0.forward.ir",
              "step_0.backward.ir", "step_0.forward.kernels.ir", "step_0.backward.kernels.ir"):
        assert f in names, sorted(names)
    for w in ("forward", "backward"):  # the two pipelines' stages do not overwrite each other
        assert {"decompose", "lower-loops", "fuse", "codegen-cpp"} <= {
            n.split(".")[3] for n in names if n.startswith(f"step_0.{w}.stage")}, names
    assert not any(n.startswith("step_0.stage") for n in names)  # no unnamed training stages
    # the backward's inputs are the saved values and one cotangent (the loss's)
    bwd = load_file(tmp_path / "step_0.backward.inputs.safetensors")
    params = parse((tmp_path / "step_0.backward.ir").read_text()).graph().params
    assert set(bwd) == {p.name for p in params} and len(bwd) > 1
    assert torch.equal(bwd[params[-1].name], torch.tensor(1.0))  # d loss / d loss
    grads = load_file(tmp_path / "step_0.backward.outputs.safetensors")
    assert len(grads) == len(list(net.parameters()))
    replayed = 0
    for ir in sorted(tmp_path.glob("*.ir")):
        text = ir.read_text()
        assert re.match(r"ember\.ir \d+\.\d+\n# produced by: ", text), ir.name
        assert ir.name == "step_0.ir" or "\n# stage: " in text, ir.name
        for graph, stem in _io(ir):
            inputs = str(tmp_path / f"{stem}.inputs.safetensors")
            want = load_file(tmp_path / f"{stem}.outputs.safetensors")
            sel = ["--graph", graph] if graph else []
            rc = main(["check", str(ir), "--inputs", inputs, "--backend", "inductor",
                       "--allow-kernels", *sel])
            out = capsys.readouterr()
            assert rc == 0 and out.out.startswith("ok: "), (ir.name, out.err[-2000:])
            got_path = tmp_path / "replay.out"
            rc = main(["run", str(ir), "--inputs", inputs, "--out", str(got_path),
                       "--allow-kernels", *sel])
            err = capsys.readouterr().err
            assert rc == 0, (ir.name, err[-2000:])
            got = load_file(got_path)
            assert got.keys() == want.keys(), ir.name
            for k in want:
                d = compare_one(k, want[k], got[k])
                assert d.ok, f"{ir.name} {graph or ''}: {d.describe()}"
            replayed += 1
    assert replayed == len(names) + 1  # the joint module replays twice


def test_a_training_dump_with_dropout_replays_the_same_mask(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """@forward draws the dropout mask from the philox seed and offset its runner gives it: the
    forward's inputs file holds those of the first call, so the forward (and the backward, from
    the saved mask) replays to the dumped outputs; the prims graph too."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 4)

    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(lin(x), 0.5, training=True).pow(2).sum()

    c = er.compile(step, backend="aot_eager", options={"dump_dir": str(tmp_path)})
    c(torch.randn(3, 6)).backward()
    assert {"philox_seed", "philox_offset"} <= set(
        load_file(tmp_path / "step_0.forward.inputs.safetensors"))
    for ir in ("step_0.prims.ir", "step_0.forward.ir", "step_0.backward.ir", "step_0.joint.ir"):
        for graph, stem in _io(tmp_path / ir):
            sel = ["--graph", graph] if graph else []
            got_path = tmp_path / "replay.out"
            rc = main(["run", str(tmp_path / ir), "--inputs",
                       str(tmp_path / f"{stem}.inputs.safetensors"), "--out", str(got_path),
                       *sel])
            err = capsys.readouterr().err
            assert rc == 0, (ir, err[-2000:])
            got, want = load_file(got_path), load_file(tmp_path / f"{stem}.outputs.safetensors")
            assert got.keys() == want.keys(), ir
            for k in want:
                d = compare_one(k, want[k], got[k])
                assert d.ok, f"{ir} {graph or ''}: {d.describe()}"


def test_a_ddp_cut_dumps_each_piece_and_the_cut_under_names_of_their_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Inside DDP (one process, gloo) the graph is cut at the gradient buckets: the cut is the
    stage `buckets`, each piece's graphs are STEM.pieceN.*, and each replays."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
        d = tmp_path / "dump"
        c = er.compile(DDP(m, bucket_cap_mb=0.004), backend="aot_eager",
                       options={"dump_dir": str(d)})
        c(torch.randn(2, 8)).pow(2).sum().backward()
    finally:
        dist.destroy_process_group()
    names = {p.name for p in d.glob("*.ir")}
    assert "forward_0.stage00.buckets.ir" in names, sorted(names)
    pieces = sorted({n.split(".")[1] for n in names if ".piece" in n})
    assert len(pieces) >= 2, sorted(names)
    for piece in pieces:
        for what in ("prims", "joint", "forward", "backward"):
            ir = d / f"forward_0.{piece}.{what}.ir"
            graphs = ["forward", "backward"] if what == "joint" else [None]
            for graph in graphs:
                stem = f"forward_0.{piece}" + ("" if what == "prims" else
                                               f".{graph or what}")
                sel = ["--graph", graph] if graph else []
                out = d / "replay.out"
                rc = main(["run", str(ir), "--inputs", str(d / f"{stem}.inputs.safetensors"),
                           "--out", str(out), *sel])
                err = capsys.readouterr().err
                assert rc == 0, (ir.name, err[-2000:])
                got, want = load_file(out), load_file(d / f"{stem}.outputs.safetensors")
                assert got.keys() == want.keys(), ir.name
                for k in want:
                    assert compare_one(k, want[k], got[k]).ok, (ir.name, k)
