"""ember.runtime: compile(), guards at call time, caches, kernel launch, and the `ember` CLI.

The top of the package DAG: it may import every other ember layer; no other layer imports it.
"""

from ember.runtime.compile import CompiledFunction, CompiledModule, compile
from ember.runtime.entries import CaptureError
from ember.runtime.explain import ExplainReport, explain
from ember.runtime.fallbacks import FallbackWarning
from ember.runtime.logs import set_logs

__all__ = ["CaptureError", "CompiledFunction", "CompiledModule", "ExplainReport",
           "FallbackWarning", "compile", "explain", "set_logs"]
