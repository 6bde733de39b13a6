"""ember.prims: the closed primitive op set (`prims.*`) and decompositions aten -> prims.

Importing this package registers the prims in ember.ir's default op registry and the
`decompose` pass in the default pass registry.
"""

from ember.ir import Interpreter, Module, default_registry
from ember.ir.backends import Backend, Runner, default_backends
from ember.prims.ops import PRIMS, PRIMS_BY_OP, Prim, register_prims

if default_registry().lookup("prims.add") is None:
    register_prims(default_registry())

# The decompositions and the `decompose` pass (registered on import).
from ember.prims import decomp  # noqa: E402,F401  isort: skip

__all__ = ["PRIMS", "PRIMS_BY_OP", "Prim", "register_prims"]


def _prims_backend(module: Module) -> Runner:
    """Decompose to prims, then run the prims' references."""
    from ember.prims.decomp import DECOMPOSITIONS, decompose_module

    interp = Interpreter(decompose_module(module, DECOMPOSITIONS))
    return lambda graph, inputs: interp.run(inputs, graph)


def _register_backend() -> None:
    if "prims" not in default_backends().all():
        default_backends().add(Backend(
            "prims", "decompose to prims, then run each prim's reference", _prims_backend))


_register_backend()
