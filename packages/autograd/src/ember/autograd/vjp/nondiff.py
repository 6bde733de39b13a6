"""The ops without a VJP rule, each with the reason (one table; the coverage test reads it).

An op listed here stops gradients: the joint graph never asks for its rule, and a value that
only such ops produce from the inputs gets no cotangent (an input reached only through them
gets a zero gradient, as in eager, where these ops' derivatives are zero or undefined).
"""

from __future__ import annotations

_ZERO = "zero gradient almost everywhere; torch's derivative is zeros"
_BOOL = "b8 result (a comparison): no gradient"
_BITS = "integer/b8 operands only: no gradient"

NO_DERIVATIVE: dict[str, str] = {
    # piecewise constant: torch returns zeros_like(grad)
    "prims.sign": _ZERO,
    "prims.floor": _ZERO,
    "prims.ceil": _ZERO,
    "prims.round": _ZERO,
    "prims.trunc": _ZERO,
    # not differentiable in ember yet
    "prims.digamma": "its derivative, trigamma (polygamma(1, x)), is not a prim",
    # integer and bool ops
    "prims.bitwise_not": _BITS,
    "prims.bitwise_and": _BITS,
    "prims.bitwise_or": _BITS,
    "prims.bitwise_xor": _BITS,
    "prims.shift_left": _BITS,
    "prims.shift_right": _BITS,
    "prims.eq": _BOOL,
    "prims.ne": _BOOL,
    "prims.lt": _BOOL,
    "prims.le": _BOOL,
    "prims.gt": _BOOL,
    "prims.ge": _BOOL,
    "prims.argmax": "i64 result (an index): no gradient",
    "prims.argmin": "i64 result (an index): no gradient",
    # creation: no tensor operands
    "prims.iota": "no tensor operands (an integer range)",
    "prims.full": "no tensor operands (a constant)",
    "prims.philox_uniform": "random draw: its seed and offset are integers, the numbers have no "
                            "gradient with respect to anything",
}
