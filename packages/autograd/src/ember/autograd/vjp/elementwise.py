"""VJP rules of the elementwise prims: unary math, binary arithmetic, where, conversion.

Each formula is the one torch's derivatives.yaml / FunctionsManual.cpp uses, in the same order
of operations (so f32 results agree to rounding), including its conventions at the edges:
abs' gradient at 0 is 0 (sign), maximum/minimum split the gradient in half where the operands
tie, pow's exponent gradient is 0 where the base is 0 and the exponent >= 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ember.autograd.vjp.core import Grad, VJPContext, is_float_tensor, vjp
from ember.ir import Node, Value

Unary = Callable[[VJPContext, Value, Value, Value], Value]  # (ctx, x, out, ct) -> grad

_LN2 = 0.6931471805599453
_LN10 = 2.3025850929940456
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_HALF_SQRT_PI = 0.5 * math.sqrt(math.pi)


def _sq(c: VJPContext, x: Value) -> Value:
    return c.mul(x, x)


UNARY: dict[str, Unary] = {
    "exp": lambda c, x, y, g: c.mul(g, y),
    "exp2": lambda c, x, y, g: c.mul(c.mul(g, y), _LN2),
    "expm1": lambda c, x, y, g: c.mul(g, c.add(y, 1.0)),
    "log": lambda c, x, y, g: c.div(g, x),
    "log2": lambda c, x, y, g: c.div(g, c.mul(x, _LN2)),
    "log10": lambda c, x, y, g: c.div(g, c.mul(x, _LN10)),
    "log1p": lambda c, x, y, g: c.div(g, c.add(x, 1.0)),
    "sqrt": lambda c, x, y, g: c.div(g, c.mul(y, 2.0)),
    "rsqrt": lambda c, x, y, g: c.mul(c.mul(g, -0.5), c.mul(_sq(c, y), y)),
    "sin": lambda c, x, y, g: c.mul(g, c.p("cos", x)),
    "cos": lambda c, x, y, g: c.mul(g, c.neg(c.p("sin", x))),
    "tan": lambda c, x, y, g: c.mul(g, c.add(_sq(c, y), 1.0)),
    "asin": lambda c, x, y, g: c.mul(g, c.p("rsqrt", c.add(c.mul(c.neg(x), x), 1.0))),
    "acos": lambda c, x, y, g: c.mul(g, c.neg(c.p("rsqrt", c.add(c.mul(c.neg(x), x), 1.0)))),
    "atan": lambda c, x, y, g: c.div(g, c.add(_sq(c, x), 1.0)),
    "sinh": lambda c, x, y, g: c.mul(g, c.p("cosh", x)),
    "cosh": lambda c, x, y, g: c.mul(g, c.p("sinh", x)),
    "tanh": lambda c, x, y, g: c.mul(g, c.sub(1.0, _sq(c, y))),
    "asinh": lambda c, x, y, g: c.mul(g, c.p("rsqrt", c.add(_sq(c, x), 1.0))),
    "acosh": lambda c, x, y, g: c.mul(g, c.p("rsqrt", c.sub(_sq(c, x), 1.0))),
    "atanh": lambda c, x, y, g: c.mul(g, c.div(1.0, c.sub(1.0, _sq(c, x)))),
    "erf": lambda c, x, y, g: c.mul(c.mul(c.p("exp", c.neg(_sq(c, x))), _TWO_OVER_SQRT_PI), g),
    "erfc": lambda c, x, y, g: c.mul(c.mul(c.p("exp", c.neg(_sq(c, x))), -_TWO_OVER_SQRT_PI),
                                     g),
    "erfinv": lambda c, x, y, g: c.mul(c.mul(c.p("exp", _sq(c, y)), _HALF_SQRT_PI), g),
    "lgamma": lambda c, x, y, g: c.mul(g, c.p("digamma", x)),
    "abs": lambda c, x, y, g: c.mul(g, c.p("sign", x)),  # 0 at 0, as torch's sgn
    "neg": lambda c, x, y, g: c.neg(g),
}


def _unary_rule(fn: Unary) -> Callable[[VJPContext, Node, list[Value | None]], list[Grad]]:
    def rule(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
        x, ct = node.args[0], cts[0]
        if ct is None or not is_float_tensor(x):
            return [None]
        assert isinstance(x, Value)
        return [fn(ctx, x, node.results[0], ct)]
    return rule


for _name, _fn in UNARY.items():
    vjp(f"prims.{_name}")(_unary_rule(_fn))


def _binary(node: Node) -> tuple[Any, Any]:
    return node.args[0], node.args[1]


def _only_tensors(node: Node, grads: list[Any]) -> list[Grad]:
    """Drop cotangents of number operands (and of integer tensors)."""
    return [g if is_float_tensor(a) else None for a, g in zip(node.args, grads, strict=True)]


@vjp("prims.add")
def _add(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    ct = cts[0]
    return _only_tensors(node, [ct, ct])


@vjp("prims.sub")
def _sub(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    ct = cts[0]
    assert ct is not None
    b = node.args[1]
    return _only_tensors(node, [ct, ctx.neg(ct) if is_float_tensor(b) else None])


@vjp("prims.mul")
def _mul(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    ct = cts[0]
    a, b = _binary(node)
    return _only_tensors(node, [ctx.mul(ct, b) if is_float_tensor(a) else None,
                                ctx.mul(a, ct) if is_float_tensor(b) else None])


@vjp("prims.div")
def _div(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    ct = cts[0]
    assert ct is not None
    a, b = _binary(node)
    ga = ctx.div(ct, b) if is_float_tensor(a) else None
    # torch: -grad * ((self / other) / other), which overflows where b * b would not
    gb = ctx.mul(ctx.neg(ct), ctx.div(ctx.div(a, b), b)) if is_float_tensor(b) else None
    return _only_tensors(node, [ga, gb])


def _mod_rule(rounding: str) -> Callable[[VJPContext, Node, list[Value | None]], list[Grad]]:
    def rule(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
        ct = cts[0]
        assert ct is not None
        a, b = _binary(node)
        gb = None
        if is_float_tensor(b):
            q = ctx.p(rounding, ctx.div(ctx.tensor(a, ctx.t(b)), b))
            gb = ctx.mul(ctx.neg(ct), q)
        return _only_tensors(node, [ct, gb])
    return rule


vjp("prims.fmod")(_mod_rule("trunc"))  # torch: -grad * self.div(other, rounding_mode="trunc")
vjp("prims.remainder")(_mod_rule("floor"))  # torch: ... rounding_mode="floor"


@vjp("prims.pow")
def _pow(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    ct = cts[0]
    assert ct is not None
    a, b = _binary(node)
    out = node.results[0]
    ga = gb = None
    if is_float_tensor(a):
        if not isinstance(b, Value):  # a literal exponent: torch's Scalar overload
            ga = (ctx.zeros(ctx.t(a)) if b == 0
                  else ctx.mul(ct, ctx.mul(b, ctx.p("pow", a, b - 1))))
        else:
            bt = ctx.tensor(b, ctx.t(a))
            d = ctx.mul(ct, ctx.mul(bt, ctx.p("pow", a, ctx.sub(bt, 1.0))))
            ga = ctx.where(ctx.p("eq", bt, 0.0), 0.0, d)
    if is_float_tensor(b):
        at = ctx.tensor(a, ctx.t(b))
        zero_base = ctx.p("bitwise_and", ctx.p("eq", at, 0.0), ctx.p("ge", b, 0.0))
        gb = ctx.mul(ct, ctx.where(zero_base, 0.0, ctx.mul(out, ctx.p("log", at))))
    return _only_tensors(node, [ga, gb])


def _minmax_rule(name: str) -> Callable[[VJPContext, Node, list[Value | None]], list[Grad]]:
    # torch's maximum: self gets where(self == other, grad / 2, grad) masked to 0 where
    # self < other; other likewise where self > other (NaN: no mask, both get grad). Against
    # a number (clamp_min / clamp_max) the tensor gets the whole gradient where it is the
    # result or ties (torch's clamp: where(self >= min, grad, 0)).
    lose, win = ("lt", "ge") if name == "maximum" else ("gt", "le")
    lose_b = "gt" if name == "maximum" else "lt"

    def rule(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
        ct = cts[0]
        assert ct is not None
        a, b = _binary(node)
        if not is_float_tensor(a) and not is_float_tensor(b):
            return [None, None]
        if not is_float_tensor(b):
            return [ctx.where(ctx.p(win, a, b), ct, 0.0), None]
        if not is_float_tensor(a):
            win_b = "le" if name == "maximum" else "ge"
            return [None, ctx.where(ctx.p(win_b, a, b), ct, 0.0)]
        g = ctx.where(ctx.p("eq", a, b), ctx.div(ct, 2.0), ct)
        return [ctx.where(ctx.p(lose, a, b), 0.0, g), ctx.where(ctx.p(lose_b, a, b), 0.0, g)]
    return rule


vjp("prims.maximum")(_minmax_rule("maximum"))
vjp("prims.minimum")(_minmax_rule("minimum"))


@vjp("prims.atan2")
def _atan2(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    ct = cts[0]
    assert ct is not None
    a, b = _binary(node)
    like = ctx.t(a if is_float_tensor(a) else b)
    at, bt = ctx.tensor(a, like), ctx.tensor(b, like)
    recip = ctx.div(1.0, ctx.add(_sq(ctx, at), _sq(ctx, bt)))
    return _only_tensors(node, [ctx.mul(ctx.mul(ct, bt), recip),
                                ctx.mul(ctx.mul(ct, ctx.neg(at)), recip)])


@vjp("prims.where")
def _where(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    ct = cts[0]
    assert ct is not None
    c, a, b = node.args
    assert isinstance(c, Value)
    return [None,
            ctx.where(c, ct, 0.0) if is_float_tensor(a) else None,
            ctx.where(c, 0.0, ct) if is_float_tensor(b) else None]


@vjp("prims.convert_element_type")
def _convert(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    x, ct = node.args[0], cts[0]
    if ct is None or not is_float_tensor(x):
        return [None]  # from an integer or bool: no gradient
    return [ctx.convert(ct, ctx.t(x).dtype)]
