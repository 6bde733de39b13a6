"""The package DAG of docs/architecture.md, checked over the sources and the pyproject files.

ir  <-  capture
ir  <-  prims  <-  autograd
ir  <-  prims  <-  inductor
all of them    <-  runtime
ir  <-  prims  <-  testing   (test support: the `test` extra of the layers whose tests use it)
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tools.sources import PACKAGES_DIR, ROOT, SourceFile, iter_sources, layers, module_name

# The ember layers each layer may import (and must declare as dependencies).
ALLOWED: dict[str, frozenset[str]] = {
    "ir": frozenset(),
    "capture": frozenset({"ir"}),
    "prims": frozenset({"ir"}),
    "autograd": frozenset({"ir", "prims"}),
    "inductor": frozenset({"ir", "prims"}),
    "runtime": frozenset({"ir", "capture", "prims", "autograd", "inductor"}),
    "testing": frozenset({"ir", "prims"}),
}
# Test support, not library (the op database): no layer depends on it or ships it. A layer's
# tests and its own test helpers (`ember.<layer>.testing`) may import it; the layer then
# declares ember-testing as its `test` extra.
TEST_LAYERS = frozenset({"testing"})


def _is_test_helper(layer: str, module: str) -> bool:
    return module == f"ember.{layer}.testing" or module.startswith(f"ember.{layer}.testing.")


def _layer_of(dotted: str) -> str | None:
    """'ember.prims.decomp' -> 'prims'; anything outside ember -> None."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ember" else None


def imported_layers(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(ember layer, line) for every import of ember.<layer> in `tree`, which is `module`.

    Covers `import ember.x`, `from ember.x... import`, `from ember import x`, relative imports
    (resolved against `module`), and importlib.import_module / __import__ with a literal name.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[str, int]] = []

    def add_target(target: str, names: list[str], line: int) -> None:
        if target == "ember":  # from ember import x, y
            found.extend((n, line) for n in names)
        elif (layer := _layer_of(target)) is not None:
            found.append((layer, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add_target(alias.name, [], node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(package):
                    raise ValueError(f"{module}:{node.lineno}: relative import beyond top level")
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            add_target(target, [a.name for a in node.names], node.lineno)
        elif isinstance(node, ast.Call) and node.args:
            func, arg = node.func, node.args[0]
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                if isinstance(arg.value, str):
                    add_target(arg.value, [], node.lineno)
    return found


def dag_violations(layer: str, source: str, module: str, is_package: bool = False) -> list[str]:
    """Messages for every import in `source` (module `module` of `layer`) the DAG forbids."""
    tree = ast.parse(source)
    allowed = ALLOWED[layer] | {layer}
    if _is_test_helper(layer, module):
        allowed |= TEST_LAYERS
    return [
        f"{module}:{line}: ember.{layer} imports ember.{other} (allowed: {sorted(ALLOWED[layer])})"
        for other, line in imported_layers(tree, module, is_package)
        if other not in allowed
    ]


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pyproject_violations(layer: str, pyproject: dict[str, Any]) -> list[str]:
    """The layer's declared ember-* dependencies must equal the DAG's; no pinned versions."""
    deps: list[str] = pyproject["project"].get("dependencies", [])
    declared = {
        name.removeprefix("ember-") for name in map(_dist_name, deps) if name.startswith("ember-")
    }
    problems = []
    if declared != ALLOWED[layer]:
        problems.append(
            f"ember-{layer} declares {sorted(declared)}, the DAG says {sorted(ALLOWED[layer])}"
        )
    problems += [f"ember-{layer} pins {d!r}: declare a range" for d in deps if "==" in d]
    return problems


def namespace_violations(packages_dir: Path) -> list[str]:
    """PEP 420: no package may ship an ember/__init__.py."""
    return [str(p) for p in packages_dir.glob("**/ember/__init__.py")]


# -- the repository ---------------------------------------------------------------------------


def test_dag_covers_exactly_the_packages() -> None:
    assert set(layers()) == set(ALLOWED)


SOURCES = list(iter_sources())


def test_every_layer_has_sources() -> None:
    assert {s.layer for s in SOURCES} == set(ALLOWED)


@pytest.mark.parametrize("src", SOURCES, ids=lambda s: s.module)
def test_imports_follow_the_dag(src: SourceFile) -> None:
    assert dag_violations(src.layer, src.text, src.module, src.is_package) == []


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_pyproject_dependencies_follow_the_dag(layer: str) -> None:
    with open(PACKAGES_DIR / layer / "pyproject.toml", "rb") as f:
        assert pyproject_violations(layer, tomllib.load(f)) == []


def test_no_ember_init_anywhere() -> None:
    assert namespace_violations(PACKAGES_DIR) == []


def test_umbrella_depends_on_every_package() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    assert {_dist_name(d) for d in deps} == {f"ember-{layer}" for layer in ALLOWED
                                             if layer not in TEST_LAYERS}


def _imports_test_layers(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(other in TEST_LAYERS for other, _ in imported_layers(tree, "tests.t", False))


@pytest.mark.parametrize("layer", sorted(set(ALLOWED) - TEST_LAYERS))
def test_layers_whose_tests_use_the_op_database_declare_it_as_their_test_extra(
        layer: str) -> None:
    users = [p for p in (PACKAGES_DIR / layer / "tests").rglob("*.py") if _imports_test_layers(p)]
    users += [s.path for s in SOURCES if s.layer == layer and _imports_test_layers(s.path)]
    with open(PACKAGES_DIR / layer / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extra = {_dist_name(d) for d in project.get("optional-dependencies", {}).get("test", [])}
    declared = {f"ember-{t}" for t in TEST_LAYERS} & extra
    assert bool(users) == bool(declared), (
        f"ember-{layer}: {len(users)} of its files import ember.testing "
        f"({', '.join(p.name for p in users[:3])}...), its `test` extra declares {sorted(extra)}")


def test_the_library_ships_no_test_support() -> None:
    """Only test layers (and a layer's own test helpers) import hypothesis: the op database
    and its strategies are not part of any installed library layer."""
    for src in SOURCES:
        if src.layer in TEST_LAYERS or _is_test_helper(src.layer, src.module):
            continue
        names = {a.name for n in ast.walk(src.tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(src.tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m.split(".")[0] == "hypothesis" for m in names), src.module


def test_test_helpers_may_import_the_test_layers_and_nothing_else_may() -> None:
    source = "from ember.testing.opdb import OpEntry\n"
    assert dag_violations("autograd", source, "ember.autograd.testing") == []
    assert dag_violations("autograd", source, "ember.autograd.joint") != []


# -- the checkers catch violations ----------------------------------------------------------------

VIOLATING = """
import ember.runtime
from ember.inductor.loops import LoopIR
from ember import capture, ir
from .. import autograd
from ..runtime.cli import main
import importlib
importlib.import_module("ember.runtime.demo")
"""


def test_checker_flags_forbidden_imports() -> None:
    found = dag_violations("prims", VIOLATING, "ember.prims.decomp")
    flagged = sorted(re.findall(r"imports ember\.(\w+)", "\n".join(found)))
    assert flagged == ["autograd", "capture", "inductor", "runtime", "runtime", "runtime"]


def test_checker_resolves_relative_imports_in_packages() -> None:
    # In ember/prims/__init__.py, `from . import x` is ember.prims.x and `..` is ember.
    source = "from . import table\nfrom .. import ir\nfrom ..autograd import vjp\n"
    found = dag_violations("prims", source, "ember.prims", is_package=True)
    assert len(found) == 1 and "ember.autograd" in found[0]


def test_checker_accepts_allowed_imports() -> None:
    source = "from ember.ir import Graph\nfrom ember.prims import PRIMS\nfrom . import joint\n"
    assert dag_violations("autograd", source, "ember.autograd.partition") == []


def test_pyproject_checker_flags_wrong_deps_and_pins() -> None:
    bad = {"project": {"dependencies": ["ember-ir==0.1.0", "ember-runtime", "torch>=2.9"]}}
    problems = pyproject_violations("prims", bad)
    assert len(problems) == 2
    assert "runtime" in problems[0] and "pins" in problems[1]


def test_namespace_checker_flags_ember_init(tmp_path: Path) -> None:
    (tmp_path / "ir" / "src" / "ember" / "ir").mkdir(parents=True)
    assert namespace_violations(tmp_path) == []
    (tmp_path / "ir" / "src" / "ember" / "__init__.py").write_text("")
    assert len(namespace_violations(tmp_path)) == 1


def test_module_name() -> None:
    assert module_name("ir", Path("passes/__init__.py")) == ("ember.ir.passes", True)
    assert module_name("ir", Path("passes/cse.py")) == ("ember.ir.passes.cse", False)
