"""The environment dev.py builds: every layer installed editable into the one `ember` namespace."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path

import pytest

import ember
from tools.sources import PACKAGES_DIR, layers

try:
    importlib.metadata.distribution("ember-runtime")
except importlib.metadata.PackageNotFoundError:  # e.g. sources on PYTHONPATH, nothing installed
    pytest.skip("the ember dists are not installed in this Python", allow_module_level=True)


def test_ember_is_a_namespace_spanning_every_package() -> None:
    assert getattr(ember, "__file__", None) is None  # PEP 420: no ember/__init__.py
    paths = {Path(p).resolve() for p in ember.__path__}
    assert {PACKAGES_DIR / layer / "src" / "ember" for layer in layers()} <= paths


@pytest.mark.parametrize("layer", layers())
def test_layer_is_installed_editable(layer: str) -> None:
    module = importlib.import_module(f"ember.{layer}")
    source = PACKAGES_DIR / layer / "src" / "ember" / layer
    assert source in {Path(p).resolve() for p in module.__path__}
    assert importlib.metadata.distribution(f"ember-{layer}").metadata["Name"] == f"ember-{layer}"


def test_cli_entry_point_is_installed() -> None:
    assert (Path(sys.prefix) / "bin" / "ember").exists()
    (ep,) = importlib.metadata.entry_points(group="console_scripts", name="ember")
    assert ep.value == "ember.runtime.cli:main"
