"""`cuda_evict=1` (render.py): L2 eviction hints on the loads of a one-pass rows kernel, as
TorchInductor gives them (a load every row reads again, such as layernorm's weight:
evict_last; a load read once: evict_first). Off by default (not yet measured on the H200);
max-autotune times the default schedule with it. Checked in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.backend import compiled_runner
from ember.inductor.launch import load_module
from ember.inductor.targets.cuda import autotune as at
from ember.ir import parse
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY


def ln(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w)


def test_evict_hints_on_a_one_pass_row() -> None:
    x, w = torch.randn(6, 64), torch.randn(64)
    text = str(run_pipeline(capture(ln, (x, w), {}).module,  # type: ignore[arg-type]
                            "decompose,cse,dce,lower-loops,fuse,schedule-cuda"))
    assert "cuda_evict" not in text  # off by default
    plain = run_pipeline(parse(text), "codegen-triton{interpret=true},plan-buffers")
    assert "eviction_policy" not in next(iter(plain.kernels.values())).source
    assert "'one_pass': 1" in next(iter(plain.kernels.values())).source
    m = run_pipeline(parse(text.replace("cuda_warps=", "cuda_evict=1, cuda_warps=")),
                     "codegen-triton{interpret=true},plan-buffers")
    src = next(iter(m.kernels.values())).source
    x_load = [ln_ for ln_ in src.splitlines() if "tl.load(in0" in ln_]
    w_load = [ln_ for ln_ in src.splitlines() if "tl.load(in1" in ln_]
    assert x_load and all("eviction_policy='evict_first'" in s for s in x_load)
    assert w_load and all("eviction_policy='evict_last'" in s for s in w_load)
    load_module(m)
    torch.testing.assert_close(compiled_runner(m)(None, [x, w]).outputs[0], ln(x, w),
                               atol=1e-5, rtol=1e-5)


def test_no_hints_where_a_pass_reads_a_row_again() -> None:
    x = torch.randn(3, 20000)  # a looped softmax (past PMAX_ROW): three passes over each row
    text = str(run_pipeline(capture(lambda a: torch.softmax(a, -1), (x,), {}).module,  # type: ignore[arg-type]
                            "decompose,cse,dce,lower-loops,fuse,schedule-cuda"))
    m = run_pipeline(parse(text.replace("cuda_warps=", "cuda_evict=1, cuda_warps=")),
                     "codegen-triton{interpret=true},plan-buffers")
    src = next(iter(m.kernels.values())).source
    assert "eviction_policy" not in src and "'one_pass': 0" in src


def test_autotune_times_the_hints_for_one_pass_rows_only() -> None:
    one = at.loop_candidates({"XBLOCK": 1, "num_warps": 4, "persistent": 1, "one_pass": 1},
                             64, 4096)
    assert one[-1] == {**one[0], "cuda_evict": 1}
    more = at.loop_candidates({"XBLOCK": 1, "num_warps": 4, "persistent": 0, "R0BLOCK": 1024,
                               "one_pass": 0}, 8, 100_000)
    assert all("cuda_evict" not in c for c in more)


@pytest.mark.parametrize(("fn", "cols", "hinted"), [
    (lambda a: a.sum(-1), 256, True), (lambda a: a.amax(-1) * 2, 256, True),
    (lambda a: a.argmax(-1), 256, True),  # persistent: the row loaded once for both passes
    (lambda a: a.argmax(-1), 20000, False),  # looped: the index pass reads the row again
], ids=["sum", "amax", "argmax", "argmax-looped"])
def test_row_reductions(fn, cols: int, hinted: bool) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(4, cols)
    text = str(run_pipeline(capture(fn, (x,), {}).module,  # type: ignore[arg-type]
                            "decompose,cse,dce,lower-loops,fuse,schedule-cuda"))
    m = run_pipeline(parse(text.replace("cuda_warps=", "cuda_evict=1, cuda_warps=")),
                     "codegen-triton{interpret=true},plan-buffers")
    src = next(iter(m.kernels.values())).source
    assert ("eviction_policy='evict_first'" in src) == hinted
    assert src.count("tl.load(in0") == 1 or not hinted  # hinted: one load of the row
    load_module(m)
    torch.testing.assert_close(compiled_runner(m)(None, [x]).outputs[0], fn(x))
