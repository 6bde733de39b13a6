"""ember.runtime: compile(), guards at call time, caches, kernel launch, and the `ember` CLI.

The top of the package DAG: it may import every other ember layer; no other layer imports it.
"""

from ember.runtime.compile import CaptureError, CompiledFunction, CompiledModule, compile
from ember.runtime.explain import ExplainReport, explain

__all__ = ["CaptureError", "CompiledFunction", "CompiledModule", "ExplainReport", "compile",
           "explain"]
