"""benchmarks/ scripts as modules, for the tests that check them (benchmarks/ is no package).

Each is loaded from its file under a module name of the test's choosing, registered in
sys.modules before it runs (its dataclasses look their module up there), so two test files
loading the same script get one module each and never share its state.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(script: str, name: str | None = None) -> ModuleType:
    """benchmarks/`script`.py as the module `ember_bench_<name>` (`name` defaults to the
    script's)."""
    spec = importlib.util.spec_from_file_location(f"ember_bench_{name or script}",
                                                  BENCHMARKS / f"{script}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
