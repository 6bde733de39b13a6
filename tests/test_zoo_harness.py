"""The model-zoo runner (benchmarks/zoo.py) at smoke sizes, eager + ember only (torch.compile's
cold compiles take ~1 minute on the 2-core machine). Speed is never asserted; what is: each model
runs in its own process and reports correctness, breaks and timings; a missing library is a
skip with its reason, a hang is a timeout, a spent budget leaves models "not run"; results are
written as JSON and markdown, and shards merge into one report."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.bench_scripts import load_script

zoo = load_script("zoo")


def _run(tmp: Path, *args: str) -> dict[str, Any]:
    assert zoo.main([*args, "--out", str(tmp), "--tag", "t", "--threads", "1"]) == 0
    (js,) = tmp.glob("zoo-*-t.json")
    assert js.with_suffix(".md").exists()
    data: dict[str, Any] = json.loads(js.read_text())
    return data


def test_one_tiny_hf_model_eager_and_ember(tmp_path: Path) -> None:
    names = "hf/bert" + ("" if importlib.util.find_spec("torchvision") else ",tv/resnet18")
    data = _run(tmp_path, "--models", names, "--tiny", "--compilers", "ember", "--reps", "2",
                "--timeout", "120")
    bert = data["models"][0]
    assert bert["name"] == "hf/bert" and bert["status"] == "done", bert
    em = bert["contenders"]["ember"]
    assert em["check"] == "ok" and em["cold_s"] > 0 and em["warm_s"] > 0 and em["ms"] > 0
    assert em["info"]["compiled_graphs"] >= 1 and em["info"]["break_count"] == 0
    assert bert["contenders"]["eager"]["ms"] > 0
    s = data["summary"]
    assert s["ember"]["correct"] == 1 and s["ember"]["geomean_speedup"] > 0
    assert data["meta"]["tiny"] and data["meta"]["versions"]["transformers"]
    md = (tmp_path / next(tmp_path.glob("zoo-*-t.json")).with_suffix(".md").name).read_text()
    assert "| hf/bert |" in md and "correct 1/1" in md
    if "tv/resnet18" in names:  # this machine's torchvision does not import: a skip, not a crash
        tv = data["models"][1]
        assert tv["status"] == "skipped" and "torchvision not importable" in tv["reason"]
        assert "torchvision not importable" in md


def test_a_hang_is_a_timeout_and_the_budget_stops_new_models(tmp_path: Path) -> None:
    # 1 s is not enough for the worker to import torch: it is killed, the suite goes on (two
    # at a time, each pinned to its own core, where there are two)
    jobs = "2" if len(os.sched_getaffinity(0)) >= 2 else "1"
    data = _run(tmp_path, "--models", "hf/gpt2,hf/llama", "--compilers", "ember",
                "--timeout", "1", "--budget", "20", "--jobs", jobs)
    assert [r["status"] for r in data["models"]] == ["timeout", "timeout"]
    assert "timed out after 1 s" in data["models"][0]["reason"]
    assert data["summary"]["ran"] == 2 and data["summary"]["ember"]["correct"] == 0
    # a model still running when the budget runs out is killed and marked "budget"
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    job = zoo.Job(0, proc, tmp_path / "none.log", index=0, model=zoo.BY_NAME["hf/bert"],
                  start=time.monotonic(), timeout=0.1, events=tmp_path / "none.jsonl")
    rec = zoo.finish(job, argparse.Namespace(timeout=300.0))
    assert rec["status"] == "budget" and "budget ran out" in rec["reason"]
    assert proc.returncode is not None
    data = _run(tmp_path / "b", "--models", "all", "--budget", "0")
    assert {r["status"] for r in data["models"]} == {"not run"}
    assert data["summary"]["not_run"] == len(zoo.ZOO) >= 50


def _rec(name: str, **con: Any) -> dict[str, Any]:
    rec: dict[str, Any] = zoo.record_of(zoo.BY_NAME[name], [])
    rec["contenders"] = con
    return rec


def test_breaks_fallbacks_mismatches_and_failures_are_shown(tmp_path: Path) -> None:
    ok = {"check": "ok", "ms": 1.0, "info": {}}
    records = [
        _rec("hf/bert", eager={"ms": 2.0}, ember=ok | {"info": {
            "break_count": 1, "breaks": ["break at modeling_bert.py:12: a print()"],
            "fallbacks": ["aten.foo has no lowering"]}},
            **{"torch.compile": ok | {"ms": 0.5}}),
        _rec("hf/gpt2", eager={"ms": 2.0}, ember={"check": "MISMATCH: 3 elements", "ms": 1.0},
             **{"torch.compile": {"error": "BackendCompilerFailed: boom"}}),
        _rec("tv/resnet18") | {"status": "skipped", "reason": "torchvision not importable"},
    ]
    meta = {"date": "d", "machine": {"cpu": "c", "cores": 2, "memory_gb": 1, "os": "o"},
            "versions": {"torch": "t"}, "threads": 2, "method": "m",
            "compilers": ["torch.compile", "ember"]}
    s = zoo.summary(records, ["torch.compile", "ember"])
    assert s["ember"]["correct"] == 1 and s["torch.compile"]["correct"] == 1
    assert s["both_correct_and_timed"] == 1 and s["ember"]["with_graph_breaks"] == 1
    assert s["ember"]["geomean_speedup"] == pytest.approx(2.0)
    assert s["ember / torch.compile"] == pytest.approx(0.5)
    md = zoo.markdown(records, meta, ["torch.compile", "ember"])
    for text in ("a print()", "aten.foo has no lowering", "MISMATCH: 3 elements",
                 "torch.compile FAILED: BackendCompilerFailed: boom",
                 "skipped: torchvision not importable", "1 break(s), 1 fallback(s)"):
        assert text in md, text
    # shards merge into one report, in zoo order
    a, b = tmp_path / "a", tmp_path / "b"
    pa = zoo.write(records[1:2], meta, ["torch.compile", "ember"], a, "zoo-x-shard1of2")[0]
    pb = zoo.write(records[0:1], meta, ["torch.compile", "ember"], b, "zoo-x-shard2of2")[0]
    late = records[0] | {"status": "not run", "contenders": {}}  # a later shard's leftover
    pc = zoo.write([late], meta, ["torch.compile", "ember"], tmp_path / "c", "zoo-y")[0]
    js, _ = zoo.merge([pa, pb, pc], tmp_path / "m")
    merged = json.loads(js.read_text())
    assert [r["name"] for r in merged["models"]] == ["hf/bert", "hf/gpt2"]
    assert merged["summary"]["ran"] == 2 and js.name == "zoo-x-merged.json"
    assert merged["models"][0]["status"] == "done"


def test_select_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert zoo.main(["--list", "--shard", "2/3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(zoo.ZOO[1::3]) and lines[0].startswith(zoo.ZOO[1].name)
    assert {m.family for m in zoo.ZOO[:6]} == {"torchvision", "timm", "hf"}  # mixed early
    with pytest.raises(SystemExit, match="unknown model"):
        zoo.main(["--models", "nope", "--list"])


def test_cache_dir_is_kept_and_shared_between_runs(tmp_path: Path) -> None:
    # the 16-core run: a compile-only pass fills --cache-dir, the timed pass reuses it (its
    # compiles are then labelled as cached, not cold)
    cache = tmp_path / "cache"
    args = ("--models", "hf/bert", "--tiny", "--compilers", "ember", "--timeout", "120",
            "--cache-dir", str(cache))
    first = _run(tmp_path / "a", *args, "--check-only")
    assert first["models"][0]["contenders"]["ember"]["check"] == "ok"
    files = sorted(p.relative_to(cache) for p in (cache / "ember").rglob("*") if p.is_file())
    assert files, "the ember cache was not written into --cache-dir"
    second = _run(tmp_path / "b", *args, "--reps", "2", "--no-warm")
    assert second["models"][0]["contenders"]["ember"]["check"] == "ok"
    again = sorted(p.relative_to(cache) for p in (cache / "ember").rglob("*") if p.is_file())
    assert again == files, "the timed run compiled again instead of reusing the cache"
    assert second["meta"]["cache_dir"] == str(cache.resolve())
    md = next((tmp_path / "b").glob("zoo-*-t.md")).read_text()
    assert "cached compile" in md and "not cold" in md


_TIMING = {"cold_s", "cold_cpu_s", "warm_s", "ms", "q1", "q3", "calls", "eager_first_s",
           "seconds", "process", "log_tail"}


def _same(rec: Any) -> Any:
    """A record without its timings and process: what must not depend on how models share
    processes."""
    if isinstance(rec, dict):
        return {k: _same(v) for k, v in rec.items() if k not in _TIMING}
    return rec


def test_several_models_in_one_process_give_the_records_of_one_per_process(
        tmp_path: Path) -> None:
    args = ("--models", "hf/bert,hf/gpt2,hf/llama", "--tiny", "--compilers", "ember",
            "--reps", "1", "--no-warm", "--timeout", "300")
    one = _run(tmp_path / "one", *args)
    shared = _run(tmp_path / "shared", *args, "--per-process", "0")
    assert [_same(r) for r in shared["models"]] == [_same(r) for r in one["models"]]
    assert all(r["status"] == "done" and r["contenders"]["ember"]["check"] == "ok"
               and r["contenders"]["ember"]["ms"] > 0 for r in shared["models"])
    assert len({r["process"]["pid"] for r in one["models"]}) == 3
    assert [r["process"]["nth"] for r in shared["models"]] == [1, 2, 3]
    assert len({r["process"]["pid"] for r in shared["models"]}) == 1
    assert shared["meta"]["per_process"] == 0 and "not cold" in shared["meta"]["method"]
    md = next((tmp_path / "shared").glob("zoo-*-t.md")).read_text()
    assert "ember compile (not cold) (CPU) / warm s" in md
    rows = [line for line in md.splitlines() if line.startswith("| hf/")]
    assert ["†" in row for row in rows] == [True, False, False]  # the process's first model


@pytest.mark.parametrize("fault", ["hang", "crash"])
def test_a_hang_or_crash_in_a_shared_process_costs_only_that_model(tmp_path: Path,
                                                                     fault: str) -> None:
    # the worker is stopped once the 1st model is done: the 2nd, sent to it, hangs (and is
    # killed at its timeout) or, killed 2 s later, crashes; the 3rd runs in a new process
    a = zoo.parse_args(["--models", "hf/bert,hf/gpt2,hf/llama", "--tiny", "--compilers",
                        "ember", "--check-only", "--ember-backend", "eager", "--timeout", "60",
                        "--per-process", "0", "--threads", "1"])
    models = zoo.select(a)
    records: list[dict[str, Any]] = [zoo.record_of(m, []) for m in models]
    ended: list[int] = []

    def on_record(i: int) -> None:
        ended.append(i)
        if i == 0:
            pid = records[0]["process"]["pid"]
            os.kill(pid, signal.SIGSTOP)
            if fault == "crash":
                threading.Timer(2.0, os.kill, (pid, signal.SIGKILL)).start()

    t = time.monotonic()
    zoo.run_all(models, a, on_record, records)
    assert ended == [0, 1, 2]
    want = "timeout" if fault == "hang" else "crashed"
    assert [r["status"] for r in records] == ["done", want, "done"], records
    assert ("timed out after 60 s" if fault == "hang" else "worker exited with status -9") \
        in records[1]["reason"]
    assert records[2]["contenders"]["ember"]["check"] == "ok"
    assert records[2]["process"]["nth"] == 1
    assert records[2]["process"]["pid"] != records[0]["process"]["pid"]
    assert (records[1]["seconds"] >= 60) if fault == "hang" else (records[1]["seconds"] < 30)
    assert time.monotonic() - t < 300
