"""The demo (`python3 dev.py demo`) runs end to end and says what it did: part 1 (the IR
workbench) matches eager, part 2 compiles a GPT-NeoX and a conv net (shrunk by --small), checks
them against eager, reports kernels, speed and where the dumps went. Speed is never asserted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ember.runtime import demo


def test_demo_runs_and_reports(capsys: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    assert demo.main(["--small"]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out
    assert out.count("output vs eager: match") == 2
    assert "GPT-NeoX (dolly-v2's architecture)" in out and "conv net" in out
    assert len(re.findall(r"eager [\d.]+ ms, ember [\d.]+ ms per call", out)) == 2
    # either compiled (graphs, kernels) or an honest fallback note with its reason
    for model in ("GPT-NeoX", "conv net"):
        part = out.split(model, 1)[1]
        assert re.search(r"compiled to \d+ fused C\+\+ kernel", part) or "fell back" in part
    assert f"EMBER_DUMP={tmp_path}" in out and list(tmp_path.glob("*.ir"))
