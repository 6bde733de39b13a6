"""Finding the ember layers and their source files, for the repository's structural tests."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES_DIR = ROOT / "packages"


def layers(packages_dir: Path = PACKAGES_DIR) -> list[str]:
    """The layer names: every packages/<name>/ that has a pyproject.toml."""
    return sorted(p.parent.name for p in packages_dir.glob("*/pyproject.toml"))


@dataclass(frozen=True)
class SourceFile:
    """One .py file of a layer's `src/ember/<layer>/` tree."""

    layer: str
    path: Path
    module: str  # dotted name, e.g. "ember.ir.passes.cse"
    is_package: bool  # an __init__.py: relative imports resolve against the module itself

    @cached_property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @cached_property
    def tree(self) -> ast.Module:
        return ast.parse(self.text, filename=str(self.path))


def module_name(layer: str, rel: Path) -> tuple[str, bool]:
    """`rel` (a path below src/ember/<layer>/) -> (dotted module name, is_package)."""
    parts = rel.with_suffix("").parts
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(("ember", layer, *parts)), is_package


def iter_sources(packages_dir: Path = PACKAGES_DIR) -> Iterator[SourceFile]:
    """Every .py file under packages/*/src/ember/<layer>/, in a stable order."""
    for layer in layers(packages_dir):
        base = packages_dir / layer / "src" / "ember" / layer
        for path in sorted(base.rglob("*.py")):
            module, is_package = module_name(layer, path.relative_to(base))
            yield SourceFile(layer, path, module, is_package)
