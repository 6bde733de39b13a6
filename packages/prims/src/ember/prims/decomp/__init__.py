"""Decompositions aten -> prims: the table, the context they build with, and the pass.

Importing this package imports every decomposition module, which register themselves.
"""

from ember.prims.decomp.context import DecompContext, DecompositionError, promote
from ember.prims.decomp.table import (
    DECOMPOSITIONS,
    DecompositionTable,
    bind_schema,
    register_decomposition,
)

# The decomposition families; each registers into DECOMPOSITIONS on import.
from ember.prims.decomp import activations as _activations  # noqa: E402,F401  isort: skip
from ember.prims.decomp import conv as _conv  # noqa: E402,F401  isort: skip
from ember.prims.decomp import creation as _creation  # noqa: E402,F401  isort: skip
from ember.prims.decomp import indexing as _indexing  # noqa: E402,F401  isort: skip
from ember.prims.decomp import linalg as _linalg  # noqa: E402,F401  isort: skip
from ember.prims.decomp import losses as _losses  # noqa: E402,F401  isort: skip
from ember.prims.decomp import norms as _norms  # noqa: E402,F401  isort: skip
from ember.prims.decomp import pointwise as _pointwise  # noqa: E402,F401  isort: skip
from ember.prims.decomp import random as _random  # noqa: E402,F401  isort: skip
from ember.prims.decomp import reductions as _reductions  # noqa: E402,F401  isort: skip
from ember.prims.decomp import shape as _shape  # noqa: E402,F401  isort: skip
from ember.prims.decomp.passes import decompose, decompose_module  # noqa: E402  isort: skip

__all__ = [
    "DECOMPOSITIONS",
    "DecompContext",
    "DecompositionError",
    "DecompositionTable",
    "bind_schema",
    "decompose",
    "decompose_module",
    "promote",
    "register_decomposition",
]
