"""RUN lines: the corpus's own small, lit-like way for an .ir file to say how it is run.

A corpus file starts with `#` comment lines (the IR parser skips them); the runner reads these
directives from them, never a shell:

    # RUN: ember run %s --inputs %S/NAME.in.safetensors --backend reference --out %t
    # RUN: ember check %s --inputs %S/NAME.in.safetensors --backend inductor
    # EXPECT: NAME.out.safetensors
    # TOLERANCE: rtol=0 atol=0

- `RUN:` one `ember` command. Its words are split with shlex (POSIX quoting, no globbing, no
  variables, no pipes) and, after `ember`, passed to `ember.runtime.cli.main` in this process.
  Substitutions: `%s` this file, `%S` its directory, `%t` a fresh temporary path for this line,
  `%%` a literal `%`. Every RUN line must exit 0. A line that writes `--out %t` has its outputs
  compared (below); other lines (`ember check`, which compares within itself) only need rc 0.
- `EXPECT:` the file, relative to `%S`, holding the expected outputs in `ember run --out`'s
  layout: eager's results, written when the corpus was generated (make_layers.py).
- `TOLERANCE:` how far this file's runs may be from eager computed on the machine running the
  test (`rtol=0 atol=0`: bitwise); the stored EXPECT file, written on another machine, is met
  within the corpus's cross-machine tolerance plus this one. Default: bitwise.

Unknown directives (`# FOO: ...`) are errors, so a typo is not a silently skipped check; other
comment lines are free text.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ember.runtime import cli

DIRECTIVE = re.compile(r"#\s*([A-Z][A-Z-]*):\s?(.*)$")
KNOWN = ("RUN", "EXPECT", "TOLERANCE")


class RunLineError(Exception):
    """A malformed directive: the message names the file and line."""


@dataclass
class RunLine:
    lineno: int
    words: list[str]  # after `ember`, before substitution

    def argv(self, path: Path, tmp: Path) -> list[str]:
        return [_substitute(w, path, tmp) for w in self.words]

    @property
    def writes_outputs(self) -> bool:
        return self.words[:1] == ["run"] and "%t" in self.words


@dataclass
class Directives:
    path: Path
    runs: list[RunLine] = field(default_factory=list)
    expect: Path | None = None
    rtol: float = 0.0
    atol: float = 0.0


def _substitute(word: str, path: Path, tmp: Path) -> str:
    subs = {"%%": "%", "%s": str(path), "%S": str(path.parent), "%t": str(tmp)}
    return re.sub(r"%[%sSt]", lambda m: subs[m.group(0)], word)


def parse_directives(path: Path) -> Directives:
    """The directives in the file's leading comment block (up to the first non-comment line)."""
    d = Directives(path)
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#"):
            break
        m = DIRECTIVE.match(s)
        if m is None:
            continue
        key, rest = m.group(1), m.group(2).strip()
        where = f"{path.name}:{lineno}"
        if key not in KNOWN:
            raise RunLineError(f"{where}: unknown directive {key}: (known: {', '.join(KNOWN)})")
        if key == "RUN":
            try:
                words = shlex.split(rest)
            except ValueError as e:
                raise RunLineError(f"{where}: RUN: {e}") from None
            if words[:1] != ["ember"] or len(words) < 2:
                raise RunLineError(f"{where}: a RUN line is `ember <command> ...`")
            d.runs.append(RunLine(lineno, words[1:]))
        elif key == "EXPECT":
            if d.expect is not None or not rest or "/" in rest:
                raise RunLineError(f"{where}: one EXPECT: FILE (a name in this directory)")
            d.expect = path.parent / rest
        else:
            d.rtol, d.atol = _tolerance(rest, where)
    if not d.runs:
        raise RunLineError(f"{path.name}: no RUN lines")
    if any(r.writes_outputs for r in d.runs) and d.expect is None:
        raise RunLineError(f"{path.name}: RUN lines write outputs but there is no EXPECT:")
    return d


def _tolerance(text: str, where: str) -> tuple[float, float]:
    vals: dict[str, float] = {}
    for item in text.split():
        k, _, v = item.partition("=")
        if k not in ("rtol", "atol") or k in vals:
            raise RunLineError(f"{where}: TOLERANCE: rtol=R atol=A, not {text!r}")
        try:
            vals[k] = float(v)
        except ValueError:
            raise RunLineError(f"{where}: TOLERANCE: {v!r} is not a number") from None
    return vals.get("rtol", 0.0), vals.get("atol", 0.0)


@dataclass
class Result:
    line: RunLine
    rc: int
    stderr: str
    out: Path | None  # the outputs written through %t


def run_line(d: Directives, line: RunLine, tmp: Path) -> Result:
    """Run one RUN line in this process; stdout (the printed results) is dropped."""
    argv = line.argv(d.path, tmp)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return Result(line, rc, err.getvalue(), tmp if line.writes_outputs else None)
