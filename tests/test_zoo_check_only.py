"""benchmarks/zoo.py --check-only (issue 18): correctness and graph breaks without timing, for
sweeping the whole zoo on a small machine; --ember-backend picks ember's backend."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_scripts import load_script


def test_check_only_reports_correctness_and_breaks_without_timing(tmp_path: Path) -> None:
    zoo = load_script("zoo", "zoo_check")
    assert zoo.main(["--models", "hf/bert", "--tiny", "--compilers", "ember", "--check-only",
                     "--ember-backend", "eager", "--timeout", "120", "--out", str(tmp_path),
                     "--tag", "t", "--threads", "1"]) == 0
    data = json.loads(next(tmp_path.glob("zoo-*-t.json")).read_text())
    (bert,) = data["models"]
    em = bert["contenders"]["ember"]
    assert bert["status"] == "done" and em["check"] == "ok", bert
    assert em["info"]["break_count"] == 0 and em["warm_s"] is None
    assert "ms" not in em and "eager" not in bert["contenders"]  # nothing timed
    assert data["meta"]["check_only"] and data["meta"]["ember_backend"] == "eager"
