"""The benchmark harness machinery (ember.runtime.bench) on tiny cases, eager + ember only (no
torch.compile: its cold compiles take 10-25 s). Speed is never asserted here; what is: every
contender is timed, ember's output is checked against eager, a fallback or a mismatch is reported
(never hidden), and the results are written as JSON, markdown and PNG."""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from ember.runtime.bench import (
    Case,
    Contender,
    Progress,
    calibrate,
    eager_contender,
    ember_contender,
    interleaved,
    quartiles,
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


class _FakeClock:
    """A clock that only moves when a contender runs: contender i costs i + 1 seconds a call."""

    def __init__(self) -> None:
        self.now, self.log, self.syncs = 0.0, [], 0

    def __call__(self) -> float:
        return self.now

    def run(self, i: int) -> object:
        def f(*args: object) -> None:
            assert args == (7,)
            self.log.append(i)
            self.now += i + 1
        return f


@given(st.integers(1, 4), st.integers(0, 7), st.integers(1, 3))
def test_interleaved_rotates_and_batches(n: int, reps: int, number: int) -> None:
    # the loop eager/ember/torch.compile are timed by (bench.run_case, the zoo, training,
    # dynamic): round robin, the order rotating by one each repetition, `number` calls a sample
    clock = _FakeClock()
    seen: list[int] = []

    def sync() -> None:
        clock.syncs += 1
    runs = {f"c{i}": clock.run(i) for i in range(n)}
    s = interleaved(runs, (7,), reps, number=number, clock=clock, sync=sync, on_rep=seen.append)
    order = [i for r in range(reps) for i in [*range(r % n, n), *range(r % n)]]
    assert clock.log == [i for i in order for _ in range(number)]
    assert s == {f"c{i}": [(i + 1) * 1e3] * reps for i in range(n)}  # ms per call
    assert seen == list(range(reps)) and clock.syncs == n * reps


def test_calibrate_and_quartiles() -> None:
    clock = _FakeClock()
    assert calibrate(clock.run(0), (7,), 0.0, clock) == 1
    assert calibrate(clock.run(1), (7,), 9.5, clock) == 5  # 2 s a call: 5 calls >= 9.5 s
    assert calibrate(clock.run(0), (7,), 1e9, clock) == 10_000  # (capped)
    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0]
    q = statistics.quantiles(xs, n=4)
    assert quartiles(xs) == (statistics.median(xs), q[0], q[2])
    assert quartiles([2.5]) == (2.5, 2.5, 2.5)
