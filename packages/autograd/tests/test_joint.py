"""The joint graph and its split: cotangent accumulation, outputs without cotangents, unused
and integer inputs, random ops, symbolic sizes, the text format, and the `joint` pass."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ember.autograd.joint import build_joint, joint_graph, split_joint
from ember.autograd.testing import run_joint
from ember.autograd.vjp import VJPError
from ember.ir import Interpreter, Module, parse, verify
from ember.ir.passes import run_pipeline
from ember.prims.decomp import DECOMPOSITIONS, decompose_module

MULTI_USE = """ember.ir 1.0

graph @f(%x: f32[3], %w: f32[3], %i: i64[3]) -> (f32[3], f32[], i64[3]) {
  %a = prims.mul(%x, %x) : f32[3]
  %b = prims.sin(%x) : f32[3]
  %c = prims.add(%a, %b) : f32[3]
  %s = prims.sum(%c, dims=[0]) : f32[]
  %j = prims.add(%i, 1) : i64[3]
  return (%c, %s, %j)
}
"""


def _grads(text: str, inputs: list[torch.Tensor], cts: list[torch.Tensor | None],
           **kw: object) -> list[torch.Tensor]:
    m = build_joint(parse(text), **kw)  # type: ignore[arg-type]
    verify(m)
    assert str(parse(str(m))) == str(m)
    return run_joint(m, inputs, cts)


def test_multiple_uses_accumulate_and_unused_inputs_get_zeros() -> None:
    x, w, i = torch.randn(3), torch.randn(3), torch.arange(3)
    c1, c2 = torch.randn(3), torch.randn(())
    gx, gw = _grads(MULTI_USE, [x, w, i], [c1, c2, None])
    torch.testing.assert_close(gx, (c1 + c2) * (2 * x + x.cos()))
    assert torch.equal(gw, torch.zeros(3))  # %w is never used: zeros of its shape


def test_outputs_without_cotangents_are_pruned() -> None:
    x = torch.randn(3)
    c2 = torch.randn(())
    m = build_joint(parse(MULTI_USE), inputs=["x"], outputs=[1])
    bwd = m.graph("backward")
    assert bwd.attrs["tangents"] == [1] and bwd.attrs["grad_inputs"] == [0]
    (gx,) = run_joint(m, [x, torch.randn(3), torch.arange(3)], [None, c2, None])
    torch.testing.assert_close(gx, c2 * (2 * x + x.cos()))


def test_integer_inputs_and_outputs_have_no_gradient() -> None:
    g = joint_graph(parse(MULTI_USE))
    assert g.attrs["grad_inputs"] == [0, 1] and g.attrs["tangents"] == [0, 1]
    with pytest.raises(VJPError, match="only floating tensors have gradients"):
        joint_graph(parse(MULTI_USE), inputs=[2])
    with pytest.raises(VJPError, match="no input 'nope'"):
        joint_graph(parse(MULTI_USE), inputs=["nope"])


def test_split_saves_only_what_the_backward_reads() -> None:
    m = build_joint(parse(MULTI_USE))
    fwd, bwd = m.graph("forward"), m.graph("backward")
    saved = [o.name for o in fwd.outputs[3:]]
    assert fwd.attrs["saved"] == len(saved) == 1 and saved == ["x"]  # cos(x) is recomputed
    assert [p.name for p in bwd.params] == ["x", "ct_c", "ct_s"]
    assert all(n.op != "prims.cos" for n in fwd.nodes)


def test_random_ops_stay_in_the_forward_and_their_seed_has_no_gradient() -> None:
    aten = parse("""ember.ir 1.0

graph @f(%x: f32[4, 5]) -> (f32[4, 5]) {
  %y, %mask = aten.native_dropout.default(%x, 0.5, true) : (f32[4, 5], b8[4, 5])
  return (%y)
}
""")
    d = decompose_module(aten, DECOMPOSITIONS)
    m = build_joint(d)
    verify(m)
    fwd, bwd = m.graph("forward"), m.graph("backward")
    assert [p.name for p in fwd.params][-2:] == ["philox_seed", "philox_offset"]
    assert fwd.attrs["philox"] == d.graph().attrs["philox"]
    assert bwd.attrs["grad_inputs"] == [0]  # the seed and offset are i64 scalars
    assert not any(n.op == "prims.philox_uniform" for n in bwd.nodes)
    x, ct = torch.randn(4, 5), torch.randn(4, 5)
    res = Interpreter(m).run([x, 7, 0], "forward").outputs
    (gx,) = Interpreter(m).run([*res[1:], ct], "backward").outputs
    kept = res[0] != 0
    torch.testing.assert_close(gx, torch.where(kept, ct * 2, 0.0))


SYMBOLIC = """ember.ir 1.0

symbol s0 hint=4 min=2

graph @f(%x: f32[s0, 3]) -> (f32[]) {
  %s = prims.sum(%x, dims=[0, 1]) : f32[]
  return (%s)
}
"""


def test_symbolic_sizes_travel_to_the_backward() -> None:
    """sum's gradient is a broadcast to x's shape: the backward gets s0 from a saved
    zero-element tensor, since it reads nothing else of that shape."""
    m = build_joint(parse(SYMBOLIC))
    verify(m)
    bwd = m.graph("backward")
    assert [str(p.type) for p in bwd.params] == ["b8[s0, 0]", "f32[]"]
    for n in (2, 5):
        x, ct = torch.randn(n, 3), torch.randn(())
        (g,) = run_joint(m, [x], [ct])
        torch.testing.assert_close(g, ct.expand(n, 3))


def test_joint_graph_unsplit_and_split_agree() -> None:
    src = parse(MULTI_USE)
    joint = joint_graph(src)
    j = Module()
    j.add(joint)
    verify(j)
    assert str(parse(str(j))) == str(j)
    x, w, i = torch.randn(3), torch.randn(3), torch.arange(3)
    c1, c2 = torch.randn(3), torch.randn(())
    out = Interpreter(j).run([x, w, i, c1, c2]).outputs
    fwd, bwd = split_joint(src, joint)
    m = Module()
    m.add(fwd)
    m.add(bwd)
    res = Interpreter(m).run([x, w, i], "forward").outputs
    grads = Interpreter(m).run([*res[3:], c1, c2], "backward").outputs
    for a, b in zip(out[3:], grads, strict=True):
        assert torch.equal(a, b)


def test_missing_rule_names_the_op() -> None:
    m = parse("""ember.ir 1.0

graph @f(%x: f32[3]) -> (f32[3]) {
  %y = aten.sin.default(%x) : f32[3]
  return (%y)
}
""")
    with pytest.raises(VJPError, match="no VJP rule for aten.sin.default"):
        build_joint(m)


def test_the_joint_pass() -> None:
    m = run_pipeline(parse(MULTI_USE), "joint{inputs=x,outputs=0}", verify_each=True)
    assert list(m.graphs) == ["forward", "backward"]
    assert m.graph("backward").attrs["grad_inputs"] == [0]
    j = run_pipeline(parse(MULTI_USE), "joint{split=false}", verify_each=True)
    assert list(j.graphs) == ["joint"]


def test_ember_opt_runs_the_joint_pass(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "f.ir"
    path.write_text(MULTI_USE)
    exe = Path(sys.executable).with_name("ember")
    r = subprocess.run([str(exe), "opt", str(path), "-p", "joint"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "graph @forward(" in r.stdout and "graph @backward(" in r.stdout
    verify(parse(r.stdout))
