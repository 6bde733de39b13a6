"""The docs stand alone in a fresh clone (issue 13 #11): no document links outside the
repository, every relative link resolves, and every file a document names by its repository
path (`docs/ir-spec.md`, `packages/inductor/tests/cpp_snapshot.py`) is in the repository.

The documents are the README files, docs/*.md, the examples' and benchmarks' READMEs. Only
git-tracked files count as present: a fresh clone has nothing else (no .venv/, no dumps).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tools.sources import ROOT

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
URL = re.compile(r"\b(?:https?|ftp)://[^\s)>\]`'\"]+|\bwww\.[a-z0-9-]+\.[a-z]{2,}\b", re.I)
CODE = re.compile(r"`([^`\s]+)`")
# a backticked name is read as a repository path when it starts with a top-level folder
PATH_CHARS = re.compile(r"^[\w./-]+$")


def _tracked() -> set[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: what is on disk
        return {str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if ".venv" not in p.parts and ".git" not in p.parts}
    files = {f for f in out.split("\0") if f}
    dirs = {str(Path(f).parent) for f in files}
    dirs |= {str(p) for d in list(dirs) for p in Path(d).parents}
    return files | dirs


TRACKED = _tracked()
DOCS = sorted(p for p in TRACKED if p.endswith(".md") and (
    "/" not in p or p.startswith("docs/") or p.startswith("examples/")
    or p.startswith("benchmarks/") and p.count("/") == 1
    or re.fullmatch(r"packages/[^/]+/README\.md", p)))
TOP = {p for p in TRACKED if "/" not in p}


def _present(rel: Path) -> bool:
    parts: list[str] = []
    for part in rel.parts:  # normalise a/../b without touching the file system
        if part == "..":
            if not parts:
                return False
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts) in TRACKED or not parts


def _strip_code_blocks(text: str) -> str:
    """Links inside fenced code are examples, not links; backticked paths are kept (they are
    checked separately)."""
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)


def problems(doc: str, text: str) -> list[str]:
    out = []
    here = Path(doc).parent
    prose = _strip_code_blocks(text)
    targets = [m.group(1) for m in LINK.finditer(prose)] + REF_DEF.findall(prose)
    for t in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I):
            out.append(f"links outside the repository: {t}")
            continue
        path = t.split("#", 1)[0]
        if path and not _present(here / path):
            out.append(f"broken relative link: {t}")
    for url in URL.findall(text):
        out.append(f"names a location outside the repository: {url}")
    for m in CODE.finditer(text):
        name = m.group(1).split("#", 1)[0].split("::", 1)[0].rstrip(".,;:")
        if not PATH_CHARS.match(name) or "/" not in name or name.split("/", 1)[0] not in TOP:
            continue
        if not _present(Path(name.rstrip("/"))):
            out.append(f"names a repository file that does not exist: {name}")
    return out


def test_the_documents_are_found() -> None:
    assert {"README.md", "docs/ir-spec.md", "docs/architecture.md", "docs/passes.md",
            "docs/interop.md", "docs/debugging.md"} <= set(DOCS)
    assert any(d.startswith("examples/") for d in DOCS)


@pytest.mark.parametrize("doc", DOCS)
def test_doc_stands_alone(doc: str) -> None:
    found = problems(doc, (ROOT / doc).read_text(encoding="utf-8"))
    assert not found, f"{doc}:\n  " + "\n  ".join(found)


def test_the_checker_finds_what_it_must() -> None:
    text = ("See [the spec](ir-spec.md), [gone](nowhere.md), [web](https://example.org/x),\n"
            "[ok](../README.md#top), <http://a.b/c>, `docs/missing.md`, `docs/passes.md`,\n"
            "`packages/inductor/tests/cpp_snapshot.py`, `tests/cpp_snapshot.py`, `x/y.py`.\n"
            "[ref]: ../no/such/file.md\n```\n[in code](also-missing.md)\n```\n")
    found = problems("docs/x.md", text)
    assert found == [
        "broken relative link: nowhere.md",
        "links outside the repository: https://example.org/x",
        "broken relative link: ../no/such/file.md",
        "names a location outside the repository: https://example.org/x",
        "names a location outside the repository: http://a.b/c",
        "names a repository file that does not exist: docs/missing.md",
        "names a repository file that does not exist: tests/cpp_snapshot.py",
    ], found
