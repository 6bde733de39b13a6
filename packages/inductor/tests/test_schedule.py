"""The schedule stage (issue 15 #3): `schedule-cpu` writes each loop kernel's schedule as `sched_*`
attributes that print, parse and verify; `codegen-cpp` renders them (the default schedule where a
kernel has none, so old dumps compile to the same C++); a hand-edited schedule changes the C++
and still computes eager's numbers; a schedule pass can be swapped by name."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.inductor.schedule import ScheduleError
from ember.inductor.targets.cpu.schedule import schedule_cpu
from ember.ir import Interpreter, Module, parse
from ember.ir.passes import register_pass, run_pipeline
from ember.ir.verifier import VerificationError, verify

LOOPS = "to-prims,conv-nhwc,lower-loops,fuse"
SCHEDULED = f"{LOOPS},schedule-cpu"
BACK = "codegen-cpp,plan-buffers"

# aten graphs, one per loop form of cppkernel.py (small sizes: tests compile fast)
GRAPHS: dict[str, str] = {
    # plain pointwise over 3 dims (loop order and collapse edits)
    "pointwise": """graph @pointwise(%x: f32[4, 6, 40], %b: f32[40]) -> (f32[4, 6, 40]) {
  %e = aten.exp.default(%x) : f32[4, 6, 40]
  %y = aten.add.Tensor(%e, %b) : f32[4, 6, 40]
  return (%y)
}""",
    # softmax: the rescale plan
    "softmax": """graph @softmax(%x: f32[8, 50]) -> (f32[8, 50]) {
  %y = aten._softmax.default(%x, -1, false) : f32[8, 50]
  return (%y)
}""",
    # a sum over dim 0: the column plan
    "sum0": """graph @sum0(%x: f32[30, 70]) -> (f32[70]) {
  %y = aten.sum.dim_IntList(%x, [0]) : f32[70]
  return (%y)
}""",
    # full sum and amax of one input: the split plan (large enough to split by default)
    "full": """graph @full(%x: f32[200, 200]) -> (f32[], f32[]) {
  %s = aten.sum.default(%x) : f32[]
  %m = aten.amax.default(%x, [0, 1]) : f32[]
  return (%s, %m)
}""",
    # x - mean(x) over rows: a plain reduction fused into a pointwise kernel
    "center": """graph @center(%x: f32[6, 90]) -> (f32[6, 90]) {
  %mu = aten.mean.dim(%x, [1], keepdim=true) : f32[6, 1]
  %c = aten.sub.Tensor(%x, %mu) : f32[6, 90]
  return (%c)
}""",
}


def _module(name: str) -> Module:
    return parse("ember.ir 1.0\n\n" + GRAPHS[name] + "\n")


def _inputs(m: Module, name: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.type.concrete_shape({}), generator=g)  # type: ignore[union-attr]
            for p in m.graph(name).params]


def _kernel_nodes(m: Module) -> list[Any]:
    return [n for g in m.graphs.values() for n in g.nodes
            if n.op in ("loop.pointwise", "loop.reduction")]


def _cpp(m: Module) -> str:
    return "\n".join(k.source for k in m.kernels.values())


def _run_against_eager(src: Module, name: str, scheduled: Module) -> Module:
    compiled = run_pipeline(scheduled, BACK)
    assert "cpp_fallback" not in str(compiled)
    load_module(compiled)
    ins = _inputs(src, name)
    got = compiled_runner(compiled)(name, ins).outputs
    want = Interpreter(src).run(ins, name).outputs
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    return compiled


def _edit(m: Module, idx: int, **attrs: Any) -> Module:
    """A copy of `m` with the `sched_*` attributes of its idx-th kernel node replaced, through
    the text (as a person editing a dump would)."""
    out = parse(str(m))
    n = _kernel_nodes(out)[idx]
    for k, v in attrs.items():
        if v is None:
            n.kwargs.pop(f"sched_{k}", None)
        else:
            n.kwargs[f"sched_{k}"] = v
    return parse(str(out))


# ---- the attributes ----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(GRAPHS))
def test_schedule_attrs_print_parse_verify(name: str) -> None:
    m = run_pipeline(_module(name), SCHEDULED)
    nodes = _kernel_nodes(m)
    assert nodes and all("sched_order" in n.kwargs and "sched_plan" in n.kwargs for n in nodes)
    text = str(m)
    again = parse(text)
    verify(again)
    assert str(again) == text


def test_default_plans_are_named() -> None:
    plans = {name: [n.kwargs["sched_plan"] for n in _kernel_nodes(
        run_pipeline(_module(name), SCHEDULED))] for name in GRAPHS}
    assert plans["softmax"] == ["rescale"]
    assert plans["sum0"] == ["column"]
    assert plans["full"] == ["split"]
    assert plans["pointwise"] == ["plain"]
    sum0 = _kernel_nodes(run_pipeline(_module("sum0"), SCHEDULED))[0]
    assert sum0.kwargs["sched_blocks"] == [16, 5]  # static: [block, count]


BAD = [
    ({"order": [0, 0, 1]}, "not a permutation|names a dim twice"),
    ({"order": [0, 1]}, "not a permutation"),
    ({"order": [0, 1, 3]}, "outside the kernel's 3 loop dims"),
    ({"parallel": [1]}, "prefix"),
    ({"parallel": [5]}, "outside"),
    ({"vector": [0]}, "innermost"),
    ({"plan": "tiled"}, "sched_plan= must be one of"),
    ({"plan": 3}, "sched_plan= must be one of"),
    ({"blocks": [16, 1]}, "column plan's"),
    ({"threshold": -1}, "non-negative"),
    ({"order": "0,1,2"}, "list of dims"),
    ({"tile": [4]}, "unknown schedule attribute sched_tile="),
]


@pytest.mark.parametrize(("edit", "why"), BAD)
def test_verifier_rejects_bad_schedules(edit: dict[str, Any], why: str) -> None:
    m = _edit(run_pipeline(_module("pointwise"), SCHEDULED), 0, **edit)
    with pytest.raises(VerificationError, match=why) as e:
        verify(m)
    assert "\n" not in str(e.value).strip()


def test_verifier_rejects_bad_column_blocks() -> None:
    m = _edit(run_pipeline(_module("sum0"), SCHEDULED), 0, blocks=[0, 3])
    with pytest.raises(VerificationError, match=r"\[block, count\]"):
        verify(m)


# ---- codegen renders the attributes ----------------------------------------------------------

@pytest.mark.parametrize("name", list(GRAPHS))
def test_old_ir_without_schedule_compiles_identically(name: str) -> None:
    """A module without sched_* attributes (an older dump, hand-written IR) gets the default
    schedule: the same C++ as through schedule-cpu."""
    loops = run_pipeline(_module(name), LOOPS)
    assert str(run_pipeline(loops, BACK)) == str(run_pipeline(schedule_cpu(loops), BACK))


UNFIT = [
    ("full", {"plan": "column"}, "column"),
    ("center", {"order": [1, 0], "vector": [0], "parallel": []}, "stay outermost"),
    ("pointwise", {"plan": "split"}, "full reduction"),
    ("pointwise", {"plan": "rescale"}, "quotient"),
    ("sum0", {"blocks": [64, 3]}, "count covers"),
    ("sum0", {"blocks": [2048, 1]}, "holds 1.."),
    ("pointwise", {"parallel": [0, 1, 2]}, "at most 2 outer"),
    ("pointwise", {"order": [2, 1, 0], "vector": [0], "parallel": [0]}, "prefix"),
]


@pytest.mark.parametrize(("name", "edit", "why"), UNFIT)
def test_codegen_refuses_a_schedule_that_does_not_fit(name: str, edit: dict[str, Any],
                                                      why: str) -> None:
    m = _edit(run_pipeline(_module(name), SCHEDULED), 0, **edit)
    with pytest.raises(ScheduleError, match=why) as e:
        run_pipeline(m, BACK)
    assert "\n" not in str(e.value)


# legal edits of each graph's (first) kernel: attribute -> value
EDITS: dict[str, list[dict[str, Any]]] = {
    "pointwise": [{"order": [0, 2, 1], "parallel": [0], "vector": [1]},
                  {"order": [2, 1, 0], "parallel": [], "vector": [0]},
                  {"order": [1, 0, 2], "parallel": [1, 0]},
                  {"parallel": [0, 1]}, {"vector": []}],
    "softmax": [{"plan": "plain"}, {"plan": "column"}, {"parallel": [0]}, {"vector": []}],
    "sum0": [{"plan": "plain", "blocks": None, "vector": []}, {"blocks": [64, 2]}, {"parallel": [0]},
             {"blocks": [32, 3], "parallel": []}],
    "full": [{"plan": "plain"}, {"threshold": 1 << 40}],
    "center": [{"parallel": [0]}, {"vector": []}, {"order": [0, 1], "parallel": []}],
}
LEGAL = [(name, i) for name, edits in EDITS.items() for i in range(len(edits))]


@settings(max_examples=8, deadline=None)
@given(case=st.sampled_from(LEGAL))
def test_edited_schedule_changes_the_cpp_and_matches_eager(case: tuple[str, int]) -> None:
    name, i = case
    src = _module(name)
    scheduled = run_pipeline(src, SCHEDULED)
    edited = _edit(scheduled, 0, **EDITS[name][i])
    verify(edited)
    before = _cpp(run_pipeline(scheduled, BACK))
    after = _cpp(_run_against_eager(src, name, edited))
    no_change = name == "center" and EDITS[name][i].get("order") == [0, 1] \
        and "parallel" not in _kernel_nodes(scheduled)[0].kwargs
    assert before != after or no_change


def test_swapped_loop_order_is_rendered() -> None:
    src = _module("pointwise")
    edited = _edit(run_pipeline(src, SCHEDULED), 0, order=[2, 0, 1], parallel=[2],
                   vector=[1])
    cpp = _cpp(_run_against_eager(src, "pointwise", edited))
    loops = re.findall(r"for \(int64_t (i\d) = 0", cpp)
    assert loops == ["i2", "i0", "i1"]
    assert re.search(r"#pragma omp parallel for schedule\(static\)\n\s*for \(int64_t i2", cpp)
    assert re.search(r"#pragma omp simd\n\s*for \(int64_t i1", cpp)


def test_parallel_off_and_split_plan_off_leave_no_threads() -> None:
    src = _module("full")
    scheduled = run_pipeline(src, SCHEDULED)
    assert "omp parallel" in _cpp(run_pipeline(scheduled, BACK))
    edited = scheduled
    for k in range(len(_kernel_nodes(scheduled))):
        edited = _edit(edited, k, plan="plain", parallel=[])
    assert "omp parallel" not in _cpp(_run_against_eager(src, "full", edited))


# ---- another schedule pass, by name ----------------------------------------------------------

@register_pass("test-serial-schedule", "tests: schedule-cpu, then every kernel on one thread")
def _serial(m: Module) -> Module:
    out = schedule_cpu(m)
    for n in _kernel_nodes(out):
        n.kwargs["sched_parallel"] = []
        n.kwargs["sched_plan"] = str(n.kwargs["sched_plan"]).replace("split+", "").replace(
            "split", "plain")
    return out


def test_schedule_pass_swapped_by_name() -> None:
    name = "full"  # large enough for threads by default
    src = _module(name)
    default = _cpp(run_pipeline(src, f"{LOOPS},schedule-cpu,{BACK}"))
    scheduled = run_pipeline(src, f"{LOOPS},test-serial-schedule")
    cpp = _cpp(_run_against_eager(src, name, scheduled))
    assert "omp parallel" in default and "omp parallel" not in cpp


# ---- symbolic sizes: per-call decisions stay per call ----------------------------------------

SYM = """ember.ir 1.0

symbol s0 hint=8 min=0

graph @cols(%x: f32[40, s0]) -> (f32[s0]) {
  %y = aten.sum.dim_IntList(%x, [0]) : f32[s0]
  return (%y)
}
"""


def test_symbolic_schedule_keeps_per_call_decisions() -> None:
    src = parse(SYM)
    scheduled = run_pipeline(src, SCHEDULED)
    (node,) = _kernel_nodes(scheduled)
    assert node.kwargs["sched_plan"] == "column" and node.kwargs["sched_blocks"] == "auto"
    cpp = _cpp(run_pipeline(scheduled, BACK))
    assert "if(parallel: " in cpp and ">= 32768)" in cpp
    edited = _edit(scheduled, 0, threshold=1000)
    compiled = run_pipeline(edited, BACK)
    assert ">= 1000)" in _cpp(compiled) and ">= 32768)" not in _cpp(compiled)
    load_module(compiled)
    run = compiled_runner(compiled, src)
    for s0 in (0, 3, 100):
        x = torch.randn(40, s0)
        torch.testing.assert_close(run("cols", [x]).outputs[0], x.sum(0))
    with pytest.raises(ScheduleError, match="computed per call"):
        run_pipeline(_edit(scheduled, 0, blocks=[16, 3]), BACK)


# ---- the command line: dump, edit, replay ----------------------------------------------------

def test_cli_dump_edit_replay(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ember.runtime.cli import main

    src = tmp_path / "model.ir"
    src.write_text("ember.ir 1.0\n\n" + GRAPHS["pointwise"] + "\n")
    sched = tmp_path / "sched.ir"
    assert main(["opt", str(src), "-p", SCHEDULED, "-o", str(sched)]) == 0
    text = sched.read_text()
    assert "sched_order=[0, 1, 2]" in text
    edited = tmp_path / "edited.ir"
    edited.write_text(text.replace("sched_order=[0, 1, 2]", "sched_order=[1, 2, 0]")
                      .replace("sched_vector=[2]", "sched_vector=[0]"))
    out = tmp_path / "compiled.ir"
    assert main(["opt", str(edited), "-p", BACK, "-o", str(out)]) == 0
    compiled = parse(out.read_text())
    assert re.findall(r"for \(int64_t (i\d) = 0", _cpp(compiled)) == ["i1", "i2", "i0"]
    load_module(compiled)
    m = _module("pointwise")
    ins = _inputs(m, "pointwise")
    torch.testing.assert_close(compiled_runner(compiled)("pointwise", ins).outputs[0],
                               Interpreter(m).run(ins, "pointwise").outputs[0])
    # a bad edit: a one-line error, from the verifier (form) or from codegen-cpp (fit)
    capsys.readouterr()
    bad = tmp_path / "bad.ir"
    bad.write_text(text.replace("sched_order=[0, 1, 2]", "sched_order=[0, 0, 2]"))
    assert main(["opt", str(bad), "-p", BACK]) != 0
    err = capsys.readouterr().err
    assert "sched_order=[0, 0, 2] names a dim twice" in err and "Traceback" not in err
    bad.write_text(text.replace('sched_plan="plain"', 'sched_plan="split"'))
    assert main(["opt", str(bad), "-p", BACK]) != 0
    err = capsys.readouterr().err
    assert "sched_plan split needs a full reduction" in err and len(err.strip().splitlines()) == 1
