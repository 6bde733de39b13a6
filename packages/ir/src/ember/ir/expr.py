"""Symbolic integer expressions: sympy inside, ember's canonical text outside.

Shapes, strides and integer arguments may be expressions over a module's declared symbols
(`s0 * 2 + 1`). They are held as sympy expressions so passes can simplify and compare them, but
they are printed by this module (never sympy's printer) and read by ember's own parser (never
`sympify`). ir-v1 has `+ - * // mod max min`; `//` and `mod` are Python's floor division and
modulo, defined here as sympy functions that fold only what is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeAlias

import sympy

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# A dimension, stride or integer argument: a plain int, or a sympy expression with symbols.
Dim: TypeAlias = int | sympy.Expr


class FloorDiv(sympy.Function):
    """Python's `a // b` on integers. Division by zero stays unevaluated: the verifier reports it."""

    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b.is_Integer and int(b) == 0:
            return None
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if b.is_Integer and int(b) == 1:
            return a
        if a.is_Integer and int(a) == 0:
            return sympy.Integer(0)
        return None


class PyMod(sympy.Function):
    """Python's `a % b` (sign of b). Modulo by zero stays unevaluated: the verifier reports it."""

    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b.is_Integer and int(b) == 0:
            return None
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        if b.is_Integer and abs(int(b)) == 1:
            return sympy.Integer(0)
        return None


_SYMBOLS: dict[str, sympy.Symbol] = {}


def symbol(name: str) -> sympy.Symbol:
    """The sympy symbol for an ir-v1 size symbol (`s0`): an integer, never negative."""
    s = _SYMBOLS.get(name)
    if s is None:
        s = sympy.Symbol(name, integer=True, nonnegative=True)
        _SYMBOLS[name] = s
    return s


def simplify_dim(e: Dim) -> Dim:
    """Fold a dimension to a plain int when it has no free symbols."""
    if isinstance(e, bool):
        raise TypeError("bool is not a dimension")
    if isinstance(e, int):
        return e
    if isinstance(e, sympy.Integer) or (isinstance(e, sympy.Expr) and e.is_Integer):
        return int(e)
    return e


def as_sympy(e: Dim) -> sympy.Expr:
    return sympy.Integer(e) if isinstance(e, int) else e


def free_symbol_names(e: Dim) -> set[str]:
    if isinstance(e, int):
        return set()
    return {s.name for s in e.free_symbols}


class ExprEvalError(ValueError):
    pass


def evaluate(e: Dim, env: Mapping[str, int]) -> int:
    """The integer value of `e` with symbols bound by `env` (Python semantics for // and mod)."""
    if isinstance(e, int):
        return e
    return _eval(e, env)


def _eval(e: sympy.Expr, env: Mapping[str, int]) -> int:
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        try:
            return env[e.name]
        except KeyError:
            raise ExprEvalError(f"symbol {e.name} is not bound") from None
    if isinstance(e, sympy.Add):
        return sum(_eval(a, env) for a in e.args)
    if isinstance(e, sympy.Mul):
        r = 1
        for a in e.args:
            r *= _eval(a, env)
        return r
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        return int(_eval(e.base, env) ** int(e.exp))
    if isinstance(e, (FloorDiv, PyMod)):
        a, b = _eval(e.args[0], env), _eval(e.args[1], env)
        if b == 0:
            raise ExprEvalError(f"division by zero in {to_text(e)}")
        return a // b if isinstance(e, FloorDiv) else a % b
    if isinstance(e, sympy.Max):
        return max(_eval(a, env) for a in e.args)
    if isinstance(e, sympy.Min):
        return min(_eval(a, env) for a in e.args)
    raise ExprEvalError(f"not an ir-v1 expression: {e!r}")


def has_zero_division(e: Dim, env: Mapping[str, int] | None = None) -> bool:
    """True if `e` contains `// 0` or `mod(_, 0)` (with constant or env-bound divisor)."""
    if isinstance(e, int):
        return False
    for sub in sympy.preorder_traversal(e):
        if isinstance(sub, (FloorDiv, PyMod)):
            d = sub.args[1]
            if d.is_Integer and int(d) == 0:
                return True
            if env is not None:
                try:
                    if _eval(d, env) == 0:
                        return True
                except ExprEvalError:
                    pass
    return False


# ---- canonical printing ------------------------------------------------------------------
# Precedence levels of the ir-v1 expression grammar: expr (+ -) < term (* //) < factor.
_EXPR, _TERM, _FACTOR = 0, 1, 2


def to_text(e: Dim) -> str:
    """ember's canonical text for an expression; `parse_expr(to_text(e)) == e`."""
    if isinstance(e, bool):
        raise TypeError("bool is not an expression")
    if isinstance(e, int):
        return str(e)
    return _print(e, _EXPR)


def _wrap(text: str, level: int, need: int) -> str:
    return f"({text})" if level < need else text


def _sort(args: tuple[sympy.Expr, ...]) -> list[sympy.Expr]:
    return sorted(args, key=sympy.default_sort_key)


def _print(e: sympy.Expr, need: int) -> str:
    if e.is_Integer:
        v = int(e)
        return str(v) if v >= 0 else _wrap(f"-{-v}", _FACTOR, need)
    if e.is_Symbol:
        return str(e.name)
    if isinstance(e, (sympy.Max, sympy.Min)):
        name = "max" if isinstance(e, sympy.Max) else "min"
        args = _sort(e.args)
        text = _print(args[0], _EXPR)
        for a in args[1:]:  # n-ary max prints as a left fold of binary ones
            text = f"{name}({text}, {_print(a, _EXPR)})"
        return text
    if isinstance(e, PyMod):
        return f"mod({_print(e.args[0], _EXPR)}, {_print(e.args[1], _EXPR)})"
    if isinstance(e, FloorDiv):
        text = f"{_print(e.args[0], _TERM)} // {_print(e.args[1], _FACTOR)}"
        return _wrap(text, _TERM, need)
    if isinstance(e, sympy.Add):
        return _wrap(_print_add(e), _EXPR, need)
    if isinstance(e, (sympy.Mul, sympy.Pow)):
        return _print_mul(e, need)
    raise ValueError(f"not an ir-v1 expression: {e!r}")


def _print_add(e: sympy.Add) -> str:
    consts = [a for a in e.args if a.is_Integer]
    terms = _sort(tuple(a for a in e.args if not a.is_Integer)) + consts
    text = _print(terms[0], _EXPR)
    for t in terms[1:]:
        if _is_negative(t):
            text += f" - {_print(-t, _TERM)}"
        else:
            text += f" + {_print(t, _TERM)}"
    return text


def _is_negative(t: sympy.Expr) -> bool:
    """True for a term printed as `- (-t)`; not when `-t` has 2**63 in it, which no INT holds
    (`s0 - 9223372036854775808` would not parse): that one prints `+ -9223372036854775808`."""
    if t.is_Integer:
        return INT64_MIN < int(t) < 0
    coeff, _ = t.as_coeff_Mul()
    return bool(coeff.is_Integer and INT64_MIN < int(coeff) < 0)


def _factors(rest: sympy.Expr) -> list[sympy.Expr]:
    out: list[sympy.Expr] = []
    for f in _sort(rest.args) if isinstance(rest, sympy.Mul) else [rest]:
        if isinstance(f, sympy.Pow) and f.exp.is_Integer and int(f.exp) > 0:
            out.extend([f.base] * int(f.exp))  # s0 ** 2 prints as s0 * s0
        elif isinstance(f, sympy.Pow):
            raise ValueError(f"not an ir-v1 expression: {f!r}")
        else:
            out.append(f)
    return out


def _print_mul(e: sympy.Expr, need: int) -> str:
    coeff, rest = e.as_coeff_Mul()
    if not coeff.is_Integer:  # s0 / 2 has no ir-v1 spelling: sizes divide with // only
        raise ValueError(f"not an ir-v1 expression (non-integer coefficient): {e!r}")
    c = int(coeff)
    factors = _factors(rest)
    if c < 0:
        # `-f * g` reads back as `(-f) * g`, and negating an Add distributes over it (`-(a + b)`
        # reads as `-a - b`), so lead with a factor that is not an Add. With none (or when `-c`
        # is 2**63, which no INT holds), put the sign on a trailing coefficient: `f * g * -3`.
        lead = next((i for i, f in enumerate(factors) if not isinstance(f, sympy.Add)), None)
        if lead is None or c == INT64_MIN:
            text = " * ".join([_print(factors[0], _TERM)] + [_print(f, _FACTOR)
                                                              for f in factors[1:]])
            return _wrap(f"{text} * {c}", _TERM, need)
        factors.insert(0, factors.pop(lead))
    first = _print(factors[0], _TERM if c > 0 else _FACTOR)
    text = " * ".join([first] + [_print(f, _FACTOR) for f in factors[1:]])
    if c == -1:
        return _wrap(f"-{text}" if len(factors) > 1 else f"-{first}", _TERM, need)
    if c < 0:
        return _wrap(f"-{text} * {-c}", _TERM, need)
    if c == 1 and len(factors) == 1:
        return _print(factors[0], need)
    if c != 1:
        text = f"{text} * {c}"
    return _wrap(text, _TERM, need)


# ---- value ranges --------------------------------------------------------------------------
# Interval arithmetic over ir-v1 expressions: sound (every value of `e` lies in the interval),
# not always tight (`x - x` over [0, 3] gives [-3, 3]). Ends are ints, or +-inf (floats).
Bound: TypeAlias = int | float
Interval: TypeAlias = tuple[Bound, Bound]
_INF = float("inf")


def value_range(e: Dim, env: Mapping[str, Interval],
                seen: list[Interval] | None = None) -> Interval | None:
    """Inclusive [lo, hi] of `e` when each symbol takes any integer value in `env[name]`, or
    None where no bound follows (an unbound symbol, a divisor whose range holds 0, a node that is
    not ir-v1). `seen` collects the range of every subexpression (to check intermediates)."""
    if isinstance(e, int):
        return (e, e)
    r = _range(e, env, seen)
    if r is not None and seen is not None:
        seen.append(r)
    return r


def _mul(a: Bound, b: Bound) -> Bound:
    return 0 if a == 0 or b == 0 else a * b  # an unbounded end times 0 is 0, not nan


def _floordiv(a: Bound, b: Bound) -> Bound:
    if math.isinf(a):
        return a if b > 0 else -a
    if math.isinf(b):  # a finite over an unbounded divisor: the quotient tends to 0 (or -1)
        return 0 if (a >= 0) == (b > 0) or a == 0 else -1
    return int(a) // int(b)


def _range(e: sympy.Expr, env: Mapping[str, Interval],
           seen: list[Interval] | None) -> Interval | None:
    if e.is_Integer:
        return (int(e), int(e))
    if e.is_Symbol:
        return env.get(e.name)
    if isinstance(e, sympy.Pow):
        if not (e.exp.is_Integer and int(e.exp) > 0):
            return None
        b = value_range(e.base, env, seen)
        if b is None:
            return None
        r: Interval = b
        for _ in range(int(e.exp) - 1):
            ps = [_mul(x, y) for x in r for y in b]
            r = (min(ps), max(ps))
        return r
    rs = [value_range(a, env, seen) for a in e.args]
    if any(x is None for x in rs):
        return None
    args: list[Interval] = [x for x in rs if x is not None]
    if isinstance(e, sympy.Add):
        return sum(x[0] for x in args), sum(x[1] for x in args)
    if isinstance(e, sympy.Mul):
        r = args[0]
        for b in args[1:]:
            ps = [_mul(x, y) for x in r for y in b]
            r = (min(ps), max(ps))
        return r
    if isinstance(e, (sympy.Max, sympy.Min)):
        fn = max if isinstance(e, sympy.Max) else min
        return fn(x[0] for x in args), fn(x[1] for x in args)
    if isinstance(e, (FloorDiv, PyMod)):
        (alo, ahi), (blo, bhi) = args
        if blo <= 0 <= bhi:
            return None  # may divide by zero
        if isinstance(e, FloorDiv):
            if any(math.isinf(x) and math.isinf(y) for x in (alo, ahi) for y in (blo, bhi)):
                return (-_INF, _INF)
            # monotone in each argument for a divisor of one sign: the corners bound it
            qs = [_floordiv(x, y) for x in (alo, ahi) for y in (blo, bhi)]
            return min(qs), max(qs)
        if blo > 0:  # Python's modulo takes the divisor's sign
            if 0 <= alo:
                return (alo, ahi) if ahi < blo else (0, min(ahi, bhi - 1))
            return (0, bhi - 1)
        return (alo, ahi) if bhi < alo and ahi <= 0 else (blo + 1, 0)
    return None
