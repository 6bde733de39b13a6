"""Golden pass tests in the IR's own text (input IR, pipeline, expected IR).

Each `golden/*.ir` file is:

    # RUN: <pipeline>
    # intent: <one line>
    <input module>
    # ----- expected
    <expected output>

The expected part is compared byte for byte with
`str(run_pipeline(parse(input), pipeline, verify_each=True))`. `EMBER_UPDATE_GOLDEN=1` rewrites
the expected part of every file from the actual output (review the diff before committing).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from ember.ir import parse, verify
from ember.ir.passes import run_pipeline

GOLDEN_DIR = Path(__file__).parent / "golden"
SEPARATOR = "# ----- expected\n"
UPDATE = os.environ.get("EMBER_UPDATE_GOLDEN") == "1"


@dataclass
class GoldenCase:
    path: Path
    pipeline: str
    intent: str
    input: str
    expected: str
    head: str  # the file up to and including the separator line, kept byte for byte on update


def read_case(path: Path) -> GoldenCase:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if len(lines) < 3 or not lines[0].startswith("# RUN: "):
        raise ValueError(f"{path.name}:1: the first line must be '# RUN: <pipeline>'")
    if not lines[1].startswith("# intent: "):
        raise ValueError(f"{path.name}:2: the second line must be '# intent: <one line>'")
    if lines.count(SEPARATOR) != 1:
        raise ValueError(f"{path.name}: needs exactly one line {SEPARATOR.strip()!r}")
    sep = lines.index(SEPARATOR)
    return GoldenCase(
        path=path,
        pipeline=lines[0][len("# RUN: "):].strip(),
        intent=lines[1][len("# intent: "):].strip(),
        input="".join(lines[2:sep]),
        expected="".join(lines[sep + 1:]),
        head="".join(lines[:sep + 1]),
    )


def golden_files() -> list[Path]:
    return sorted(GOLDEN_DIR.glob("*.ir"))


def diff(expected: str, actual: str, name: str) -> str:
    return "".join(difflib.unified_diff(
        expected.splitlines(keepends=True), actual.splitlines(keepends=True),
        fromfile=f"{name} (expected)", tofile=f"{name} (actual)"))


def test_there_are_golden_files() -> None:
    assert len(golden_files()) >= 8


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.name)
def test_golden(path: Path) -> None:
    case = read_case(path)
    assert case.intent, f"{path.name}: the intent line is empty"
    module = parse(case.input)
    verify(module)
    actual = str(run_pipeline(module, case.pipeline, verify_each=True))
    if UPDATE:
        if actual != case.expected:
            path.write_text(case.head + actual, encoding="utf-8")
        return
    if actual != case.expected:
        pytest.fail(f"{path.name}: output of `{case.pipeline}` differs from the expected text "
                    f"(EMBER_UPDATE_GOLDEN=1 rewrites it)\n{diff(case.expected, actual, path.name)}",
                    pytrace=False)
    # The expected part is itself canonical ir-v1 text.
    assert str(parse(case.expected)) == case.expected


def test_reader_rejects_malformed_files(tmp_path: Path) -> None:
    good = "# RUN: dce\n# intent: x\nember.ir 1.0\n" + SEPARATOR + "ember.ir 1.0\n"
    p = tmp_path / "ok.ir"
    p.write_text(good)
    case = read_case(p)
    assert (case.pipeline, case.intent, case.input, case.expected) == (
        "dce", "x", "ember.ir 1.0\n", "ember.ir 1.0\n")
    assert case.head + case.expected == good
    for bad, why in [(good.replace("# RUN: ", "# RUN ", 1), "first line"),
                     (good.replace("# intent: ", "# why: ", 1), "second line"),
                     (good.replace(SEPARATOR, ""), "exactly one line"),
                     (good + SEPARATOR, "exactly one line")]:
        p.write_text(bad)
        with pytest.raises(ValueError, match=why):
            read_case(p)
