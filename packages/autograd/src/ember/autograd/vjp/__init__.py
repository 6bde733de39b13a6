"""Per-op vector-Jacobian product rules (`@vjp`), and the table of ops without one.

Importing this package registers every rule (elementwise, structure, contraction modules).
"""

from ember.autograd.vjp.core import (
    VJP_RULES,
    Grad,
    Rule,
    VJPContext,
    VJPError,
    is_float_tensor,
    vjp,
)
from ember.autograd.vjp.nondiff import NO_DERIVATIVE

# The rule families; each registers into VJP_RULES on import.
from ember.autograd.vjp import contraction as _contraction  # noqa: E402,F401  isort: skip
from ember.autograd.vjp import attention_cuda as _attention_cuda  # noqa: E402,F401  isort: skip
from ember.autograd.vjp import elementwise as _elementwise  # noqa: E402,F401  isort: skip
from ember.autograd.vjp import structure as _structure  # noqa: E402,F401  isort: skip


def rule_for(op: str) -> Rule | None:
    return VJP_RULES.get(op)


__all__ = ["NO_DERIVATIVE", "VJP_RULES", "Grad", "Rule", "VJPContext", "VJPError",
           "is_float_tensor", "rule_for", "vjp"]
