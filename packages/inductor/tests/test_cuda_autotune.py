"""mode="max-autotune" for the CUDA target (autotune.py) and the Triton matmul template with a
fused epilogue (matmul_template.py), tested without a GPU.

Kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported) on CPU
tensors through `inductor-cuda-interpret`. The choice logic is checked with deterministic fake
timers (`tuning_timer`): interpreter timings say nothing about a GPU. Results are compared with
eager (f32 and f16; the interpreter computes bf16 wrongly). Shapes stay tiny.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.inductor.targets import Target
from ember.inductor.targets.cuda import autotune as at
from ember.inductor.targets.cuda import matmul_template as mt
from ember.ir import Module, parse, verify
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

# the interpreted Triton target in the CPU's place: the graphs here are on CPU tensors, and the
# CPU target's own rules (its packed linear for `x @ w.T`) would take the matmul first
pytestmark = [INTERPRETER_ONLY, pytest.mark.usefixtures("triton_on_cpu")]

PIPELINE = at.with_autotune("decompose,cse,dce,inductor-cuda-interpret")


def tuned(fn: Callable[..., Any], args: tuple[torch.Tensor, ...], timer: at.Timer
          ) -> tuple[Module, at.TuneReport]:
    with at.tuning_timer(timer), at.collecting() as reports:
        m = run_pipeline(capture(fn, args, {}).module, PIPELINE)  # type: ignore[union-attr]
    assert len(reports) == 1
    return m, reports[0]


@pytest.fixture(autouse=True)
def _fresh_tuning_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Each test starts with an empty tuning cache."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))


def run(m: Module, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    load_module(m)
    return list(compiled_runner(m)(None, list(args)).outputs)


def calls(m: Module) -> list[str]:
    return [n.op for g in m.graphs.values() for n in g.nodes]


def prefer(**want: Any) -> at.Timer:
    """A fake timer: 1 ms for a candidate with all of `want`'s attributes, 2 ms otherwise."""
    def timer(run: Callable[[], object], c: at.Candidate) -> float:
        return 1.0 if all(c.get(k) == v for k, v in want.items()) else 2.0
    return timer


def counting(seen: list[at.Candidate], timer: at.Timer) -> at.Timer:
    def t(run: Callable[[], object], c: at.Candidate) -> float:
        seen.append(c)
        return timer(run, c)
    return t


# ---- loop kernels -------------------------------------------------------------------------

def test_pointwise_winner_is_written_into_the_attributes_and_the_block() -> None:
    x = torch.randn(3, 300)
    m, rep = tuned(lambda a: torch.sin(a) * 2, (x,), prefer(cuda_xblock=256))
    assert [c.winner for c in rep.choices] == [{"cuda_xblock": 256, "cuda_warps": 2}]
    assert len(rep.choices[0].timings) >= 3  # a real choice among several candidates
    src = next(iter(m.kernels.values())).source
    assert "SCHEDULE = {'XBLOCK': 256, 'num_warps': 2" in src
    torch.testing.assert_close(run(m, (x,))[0], torch.sin(x) * 2)
    again = parse(str(m))  # the dump replays the chosen schedule
    verify(again)
    assert [k.source for k in again.kernels.values()] == [src]


def test_rows_choose_between_persistent_and_looped() -> None:
    x = torch.randn(2, 4500)  # a row past RMAX: looped candidates only, RBLOCK tuned
    m, rep = tuned(lambda a: torch.softmax(a, -1), (x,),
                   prefer(cuda_persistent=0, cuda_rblock=2048, cuda_xblock=1))
    assert rep.choices[0].winner["cuda_rblock"] == 2048
    assert "'R0BLOCK': 2048" in next(iter(m.kernels.values())).source
    torch.testing.assert_close(run(m, (x,))[0], torch.softmax(x, -1))
    y = torch.randn(4, 600)  # fits a row: persistent and looped both candidates
    m, rep = tuned(lambda a: a.sum(-1), (y,), prefer(cuda_persistent=0, cuda_rblock=512))
    kinds = {c["cuda_persistent"] for c, _ in rep.choices[0].timings}
    assert kinds == {0, 1}
    assert rep.choices[0].winner["cuda_persistent"] == 0
    torch.testing.assert_close(run(m, (y,))[0], y.sum(-1), atol=1e-4, rtol=1e-4)


def test_a_candidate_with_a_wrong_result_never_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    real = at.render

    def broken_at_256(name: str, node: Any, *a: Any, **kw: Any) -> Any:
        out = real(name, node, *a, **kw)
        if node.kwargs.get("cuda_xblock") == 256:  # this candidate computes cos, not sin
            out = dataclasses.replace(out, source=out.source.replace("tl.sin(", "tl.cos("))
        return out
    monkeypatch.setattr(at, "render", broken_at_256)
    x = torch.randn(3, 300)
    m, rep = tuned(lambda a: torch.sin(a) * 2, (x,), prefer(cuda_xblock=256))
    assert rep.choices[0].winner["cuda_xblock"] != 256
    assert all(c["cuda_xblock"] != 256 for c, _ in rep.choices[0].timings)


def test_a_failing_timer_keeps_the_default_schedule() -> None:
    def broken(run: Callable[[], object], c: at.Candidate) -> float:
        raise RuntimeError("no timer today")
    x = torch.randn(3, 50)
    args = (torch.randn(6, 5), torch.randn(5, 4), torch.randn(4), torch.randn(6, 4))
    m, rep = tuned(lambda a: torch.softmax(a, -1), (x,), broken)
    assert not rep.choices and list(rep.skipped.values()) == ["no candidate ran"]
    assert "not tuned" in rep.summary()
    torch.testing.assert_close(run(m, (x,))[0], torch.softmax(x, -1))
    m, rep = tuned(mlp, args, broken)
    assert "kernels.extern" in calls(m)  # the matmul stays an extern
    torch.testing.assert_close(run(m, args)[0], mlp(*args), atol=1e-4, rtol=1e-4)


def test_candidates_follow_the_kernel() -> None:
    pw = at.loop_candidates({"XBLOCK": 16, "num_warps": 1}, 15, None)
    assert pw[0] == {"cuda_xblock": 16, "cuda_warps": 1}  # the default first
    assert all(c["cuda_xblock"] <= 16 for c in pw)  # never more than the elements need
    rows = at.loop_candidates({"XBLOCK": 1, "num_warps": 4, "persistent": 0, "R0BLOCK": 1024},
                              8, 100_000)
    assert all(c["cuda_persistent"] == 0 for c in rows) and len(rows) <= 8


# ---- the tuning cache ------------------------------------------------------------------------

def test_second_compile_reads_the_tuning_cache() -> None:
    x = torch.randn(5, 70)
    f = (lambda a: torch.softmax(a, -1))  # noqa: E731
    seen: list[at.Candidate] = []
    m1, rep1 = tuned(f, (x,), counting(seen, prefer(cuda_xblock=2)))
    assert seen and not any(c.cached for c in rep1.choices)
    n = len(seen)
    m2, rep2 = tuned(f, (x,), counting(seen, prefer(cuda_xblock=4)))
    assert len(seen) == n  # no tuning the second time
    assert [c.cached for c in rep2.choices] == [True]
    assert rep2.choices[0].winner == rep1.choices[0].winner
    assert [k.source for k in m1.kernels.values()] == [k.source for k in m2.kernels.values()]

    def other_name(a: torch.Tensor) -> torch.Tensor:  # the same kernel under another name
        return torch.softmax(a, -1)
    _, rep = tuned(other_name, (x,), counting(seen, prefer(cuda_xblock=4)))
    assert len(seen) == n and rep.choices[0].cached
    files = list(at.cache_path("x").parent.glob("*.json"))
    data = [json.loads(p.read_text()) for p in files]
    assert any(d["winner"] == rep1.choices[0].winner and d["timings_ms"] for d in data)
    for p in files:  # damaged entries: ignored and tuned again, never an error
        p.write_text("{not json")
    _, rep3 = tuned(f, (x,), counting(seen, prefer(cuda_xblock=2)))
    assert len(seen) > n
    assert not rep3.choices[0].cached


def test_cache_key_names_device_and_triton_version() -> None:
    import triton
    k1 = at._key("loop", "src", "NVIDIA H200")
    assert k1 != at._key("loop", "src", "triton-interpreter")
    assert k1 != at._key("loop", "src2", "NVIDIA H200")
    assert triton.__version__  # part of the key (json of version, kind, digest, device)


# ---- the matmul template --------------------------------------------------------------------

def mlp(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w + b) + r


def template_wins(run: Callable[[], object], c: at.Candidate) -> float:
    return 1.0 if "cuda_matmul" in c else 2.0


def extern_wins(run: Callable[[], object], c: at.Candidate) -> float:
    return 1.0 if c.get("kind") == "extern" else 2.0


def test_matmul_template_is_kept_only_where_it_wins(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Any) -> None:
    args = (torch.randn(20, 9), torch.randn(9, 13), torch.randn(13), torch.randn(20, 13))
    m, rep = tuned(mlp, args, template_wins)
    assert "kernels.extern" not in calls(m)  # one kernel: matmul + bias + relu + residual
    assert calls(m).count("kernels.call") == 1
    mm = [c for c in rep.choices if c.kernel.endswith("(matmul)")]
    assert len(mm) == 1 and "cuda_matmul" in mm[0].winner
    assert {c.get("kind") for c, _ in mm[0].timings} >= {"extern", None}  # both were timed
    assert "matmul template" in next(iter(m.kernels.values())).source
    torch.testing.assert_close(run(m, args)[0], mlp(*args), atol=1e-4, rtol=1e-4)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "other"))  # not the cached choice
    m, rep = tuned(mlp, args, extern_wins)
    assert "kernels.extern" in calls(m)
    assert [c.winner for c in rep.choices if c.kernel.endswith("(matmul)")] == [
        {"kind": "extern"}]
    torch.testing.assert_close(run(m, args)[0], mlp(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_template_takes_a_batched_linear(dtype: torch.dtype) -> None:
    """x: [B, T, K] through F.linear: the product is read as [i0 * T + i1, i2] (a reshape folded
    into the epilogue's index): still one kernel, the tile's rows split into i0, i1."""
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, w, b)) + r
    args = (torch.randn(3, 7, 10).to(dtype), torch.randn(9, 10).to(dtype),
            torch.randn(9).to(dtype), torch.randn(3, 7, 9).to(dtype))
    m, rep = tuned(f, args, template_wins)
    assert "kernels.extern" not in calls(m)
    assert any("cuda_matmul" in c.winner for c in rep.choices)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(run(m, args)[0], f(*args), atol=tol, rtol=tol)


def test_template_attribute_dumps_and_replays() -> None:
    args = (torch.randn(17, 8), torch.randn(8, 5), torch.randn(5), torch.randn(17, 5))
    with at.tuning_timer(template_wins):
        c = capture(mlp, args, {})
        sched = run_pipeline(c.module, "decompose,cse,dce,lower-loops,fuse,schedule-cuda,"  # type: ignore[union-attr]
                             "autotune-cuda{interpret=true}")
    text = str(sched)
    assert "cuda_matmul=[" in text
    edited = parse(text.replace("cuda_matmul=[16, 16, 16, 8, 1]",
                                "cuda_matmul=[32, 16, 16, 4, 1]"))
    out = run_pipeline(edited, "codegen-triton{interpret=true},plan-buffers")
    src = next(iter(out.kernels.values())).source
    assert "cuda_matmul=[32, 16, 16, 4, 1]" in str(edited)
    assert "BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=4" in src
    torch.testing.assert_close(run(out, args)[0], mlp(*args), atol=1e-4, rtol=1e-4)


CUDA_MLP = """ember.ir 1.0

graph @f(%x: f16[40, 24]@cuda:0, %w: f16[24, 72]@cuda:0, %b: f16[72]@cuda:0) -> (f16[40, 72]@cuda:0) {
  %y = aten.mm.default(%x, %w) : f16[40, 72]@cuda:0
  %z = aten.add.Tensor(%y, %b) : f16[40, 72]@cuda:0
  %r = aten.relu.default(%z) : f16[40, 72]@cuda:0
  return (%r)
}
"""


def test_template_renders_for_cuda_graphs() -> None:
    """The GPU form (code generation only here): one kernels.call on cuda:0 in place of the
    extern and its epilogue; its block, imported in the interpreter, computes the result."""
    from ember.inductor.targets.cuda import codegen
    m = run_pipeline(parse(CUDA_MLP), "decompose,cse,dce,lower-loops,fuse,schedule-cuda")
    (pair,) = mt.epilogue_pairs(m.graphs["f"], m.items)
    pair.epilogue.kwargs[mt.ATTR] = [64, 32, 32, 8, 3]
    out = run_pipeline(parse(str(m)), "codegen-triton,plan-buffers")
    (node,) = out.graphs["f"].nodes
    assert node.op == "kernels.call" and node.kwargs["device"] == "cuda:0"
    (k,) = out.kernels.values()
    assert "num_stages=3" in k.source and "BLOCK_N=32" in k.source
    launch = codegen._import(k, "gpu_form_" + str(abs(hash(k.source))))
    x, w, b = torch.randn(40, 24).half(), torch.randn(24, 72).half(), torch.randn(72).half()
    y = torch.empty(40, 72, dtype=torch.float16)
    launch(x, w, b, y)
    torch.testing.assert_close(y, torch.relu(x @ w + b), atol=2e-2, rtol=2e-2)


def test_pairs_need_a_single_pointwise_reader() -> None:
    def two_readers(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ w
        return torch.relu(y), y  # the product is an output too: not fused
    args = (torch.randn(4, 3), torch.randn(3, 5))
    m = run_pipeline(capture(two_readers, args, {}).module,  # type: ignore[union-attr]
                     "decompose,cse,dce,lower-loops,fuse")
    g = next(g for g in m.graphs.values() if any(n.op == "loop.extern" for n in g.nodes))
    assert mt.epilogue_pairs(g, m.items) == []


EPILOGUES: list[Callable[..., torch.Tensor]] = [
    lambda y, b, r: y + b + r,
    lambda y, b, r: torch.relu(y + b) + r,
    lambda y, b, r: F.gelu(y + r) + b,
    lambda y, b, r: torch.sigmoid(y * 2 + b) * r,
]


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40),
       dtype=st.sampled_from([torch.float32, torch.float16]),
       epi=st.integers(0, len(EPILOGUES) - 1), data=st.data())
def test_template_matches_eager(m: int, k: int, n: int, dtype: torch.dtype, epi: int,
                                data: st.DataObject) -> None:
    cfg = data.draw(st.sampled_from(mt.candidates(m, n, k, True)))
    g = EPILOGUES[epi]

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return g(x @ w, b, r)
    args = (torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype), torch.randn(n).to(dtype),
            torch.randn(m, n).to(dtype))
    mod, rep = tuned(f, args, prefer(cuda_matmul=list(cfg[0])))
    assert "kernels.extern" not in calls(mod)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(run(mod, args)[0], f(*args), atol=tol, rtol=tol)


# ---- compile(mode="max-autotune") ---------------------------------------------------------------


def test_compile_max_autotune_tunes(triton_on_cpu: Target) -> None:
    from ember.runtime import compile as ember_compile
    seen: list[at.Candidate] = []
    x = torch.randn(3, 7)

    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.softmax(a * 2, -1)
    with at.tuning_timer(counting(seen, prefer(cuda_xblock=1))):
        cf = ember_compile(f, mode="max-autotune-no-cudagraphs")
        torch.testing.assert_close(cf(x), f(x))
    assert seen
    notes = [n for n in cf.history.notes if "autotune:" in n]  # explain's notes
    assert notes and "1 kernel(s) in" in notes[0] and "xblock=1" in notes[0]
    n = len(seen)
    with at.tuning_timer(counting(seen, prefer(cuda_xblock=1))):
        cf = ember_compile(f)  # the default mode: no tuning
        torch.testing.assert_close(cf(x), f(x))
    assert len(seen) == n


def test_symbolic_sizes_keep_the_default_schedule(triton_on_cpu: Target) -> None:
    from ember.runtime import compile as ember_compile

    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.sin(a) + 1
    seen: list[at.Candidate] = []
    with at.tuning_timer(counting(seen, prefer(cuda_xblock=1))), at.collecting() as reps:
        cf = ember_compile(f, mode="max-autotune-no-cudagraphs", dynamic=True)
        for n in (5, 9):
            x = torch.randn(n)
            torch.testing.assert_close(cf(x), f(x))
    assert not seen  # nothing timed: the best block depends on the size a call brings
    assert reps and all(set(r.skipped.values()) == {"symbolic sizes"} for r in reps)


def test_with_autotune_places_the_pass() -> None:
    assert "schedule-cuda,autotune-cuda{interpret=true},codegen-triton" in PIPELINE
    assert at.with_autotune("inductor-cuda").count("autotune-cuda") == 1
    assert at.with_autotune("inductor-cpu") == "inductor-cpu"
