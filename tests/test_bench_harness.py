"""The benchmark harness machinery (ember.runtime.bench) on tiny cases, eager + ember only (no
torch.compile: its cold compiles take 10-25 s). Speed is never asserted here; what is: every
contender is timed, ember's output is checked against eager, a fallback or a mismatch is reported
(never hidden), and the results are written as JSON, markdown and PNG."""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from ember.runtime.bench import (
    Case,
    Contender,
    Progress,
    eager_contender,
    ember_contender,
    run_case,
    run_meta,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent


def tiny(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2.0 + 1.0)


def data_branch(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # data-dependent control flow: a graph break, or a fallback to eager
        return x * 2
    return x - 2


def _case(fn: object, name: str = "tiny") -> Case:
    return Case(name, "smoke", lambda: (fn, (torch.randn(64),)), "a tiny case")  # type: ignore[return-value]


def test_run_case_times_both_and_checks_ember() -> None:
    log = io.StringIO()
    r = run_case(_case(tiny), [eager_contender(), ember_contender()], reps=3, warmup=1,
                 min_sample_s=0.0001, progress=Progress(1, stream=log))
    assert "tiny done" in log.getvalue()
    assert set(r.timings) == {"eager", "ember"} and not r.error
    em = r.timings["ember"]
    assert em.samples >= 3 and em.q1_ms <= em.median_ms <= em.q3_ms
    assert em.check == "ok"
    assert em.cold_compile_s is not None and em.cold_compile_s > 0
    assert em.warm_compile_s is not None and em.warm_compile_s > 0
    assert em.info["compiled_graphs"] == 1 and em.info["kernels"] >= 1
    assert em.info["status"].startswith("1/1 graph(s) compiled")
    assert r.timings["eager"].cold_compile_s is None and r.speedup("ember") is not None


def test_fallback_is_reported() -> None:
    r = run_case(_case(data_branch, "branch"), [eager_contender(), ember_contender()], reps=2,
                 warmup=1, min_sample_s=0.0001)
    info = r.timings["ember"].info
    # where capture stops (the whole frame eager, or a graph break), the table says so and why
    assert ("FALLBACK to eager" in info["status"] and info["fallbacks"]) or \
        ("graph break" in info["status"] and info["breaks"])
    assert r.timings["ember"].check == "ok"


def test_mismatch_and_failure_are_reported() -> None:
    wrong = Contender("ember", lambda fn: (lambda x: fn(x) + 1.0), check=True)
    r = run_case(_case(tiny), [eager_contender(), wrong], reps=2, warmup=1, min_sample_s=0.0001)
    assert (r.timings["ember"].check or "").startswith("MISMATCH")

    def boom(fn: object) -> object:
        raise RuntimeError("cannot compile this")
    r2 = run_case(_case(tiny), [eager_contender(), Contender("broken", boom)], reps=2, warmup=1,
                  min_sample_s=0.0001)
    assert "broken" not in r2.timings and "cannot compile this" in r2.error["broken"]


def test_results_are_written(tmp_path: Path) -> None:
    r = run_case(_case(tiny), [eager_contender(), ember_contender()], reps=3, warmup=1,
                 min_sample_s=0.0001)
    meta = run_meta(ROOT, "smoke")
    paths = write_results([r], meta, ["eager", "ember"], tmp_path, "smoke", extra="\n## more\n")
    data = json.loads(paths[0].read_text())
    assert data["cases"][0]["name"] == "tiny" and data["geomean_speedup"]["ember"] > 0
    assert data["meta"]["machine"]["cores"] and data["meta"]["versions"]["torch"]
    md = paths[1].read_text()
    assert "| tiny |" in md and "Geomean speedup over eager: ember" in md and "## more" in md
    assert "(smoke.png)" in md and "(latest.png)" in (tmp_path / "latest.md").read_text()
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "latest.json").exists() and (tmp_path / "latest.png").exists()
