"""ember.prims: the closed primitive op set (`prims.*`) and decompositions aten -> prims.

Importing this package registers the prims in ember.ir's default op registry and the
`decompose` pass in the default pass registry.
"""

from collections.abc import Sequence
from typing import Any

from ember.ir import Interpreter, Module, RunResult, default_registry
from ember.ir.backends import Backend, Runner, default_backends
from ember.ir.interpreter import eager_error
from ember.prims.ops import PRIMS, PRIMS_BY_OP, Prim, register_prims

if default_registry().lookup("prims.add") is None:
    register_prims(default_registry())

# The decompositions and the `decompose` pass (registered on import).
from ember.prims import decomp  # noqa: E402,F401  isort: skip

__all__ = ["PRIMS", "PRIMS_BY_OP", "Prim", "register_prims"]


def _prims_backend(module: Module) -> Runner:
    """Decompose to prims, then run the prims' references. Graphs with random ops get torch's
    initial seed and an offset that advances from 0 by each call's consumption."""
    from ember.prims.decomp import DECOMPOSITIONS, decompose_module
    from ember.prims.decomp.random import PhiloxOffsets, run_drawing

    interp = Interpreter(decompose_module(module, DECOMPOSITIONS))
    offsets = PhiloxOffsets()

    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        try:
            res = run_drawing(interp, graph, inputs, offsets)
        except Exception as e:  # raise what eager raises (IndexError for index_select, ...)
            err = eager_error(module, graph, inputs, e)
            if err is e:
                raise
            raise err from None
        return res
    return run


def _register_backend() -> None:
    if "prims" not in default_backends().all():
        default_backends().add(Backend(
            "prims", "decompose to prims, then run each prim's reference", _prims_backend))


_register_backend()
