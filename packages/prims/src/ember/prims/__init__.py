"""ember.prims: the closed primitive op set (`prims.*`) and decompositions aten -> prims.

Importing this package registers the prims in ember.ir's default op registry and the
`decompose` pass in the default pass registry.
"""

from ember.ir import default_registry
from ember.prims.ops import PRIMS, PRIMS_BY_OP, Prim, register_prims

if default_registry().lookup("prims.add") is None:
    register_prims(default_registry())

# The decompositions and the `decompose` pass (registered on import).
from ember.prims import decomp  # noqa: E402,F401  isort: skip

__all__ = ["PRIMS", "PRIMS_BY_OP", "Prim", "register_prims"]
