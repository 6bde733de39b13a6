"""Symbolic integer expressions: sympy inside, ember's canonical text outside.

Shapes, strides and integer arguments may be expressions over a module's declared symbols
(`s0 * 2 + 1`). They are held as sympy expressions so passes can simplify and compare them, but
they are printed by this module (never sympy's printer) and read by ember's own parser (never
`sympify`; `parse_expr` here is that parser's public door). ir-v1 has `+ - * // mod max min`;
`//` and `mod` are Python's floor division and modulo, defined here as sympy functions that fold
only what is exact. Since ir-v1.1 an expression in a node's arguments may also name loop
variables (`i0`, `r1`: the loops of a kernel body's declared domain).

`print_expr` writes an expression in a target language (C++, Python, Triton) from one table of
operator spellings per language (`ExprLanguage`), so every code generator prints sizes and
indices the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
# ir-v1.1 loop variables: i<k> ranges over a kernel's k-th output dim, r<k> over its k-th reduced
# dim. Like size symbols they are integers, never negative.
LOOP_VAR = re.compile(r"[ir][0-9]+")


def is_loop_var(name: str) -> bool:
    return LOOP_VAR.fullmatch(name) is not None


def loop_var_names(e: Dim) -> set[str]:
    """The loop variables an expression mentions."""
    return {n for n in free_symbol_names(e) if is_loop_var(n)}


def parse_expr(text: str, *, loop_vars: bool = True) -> Dim:
    """Read one ir-v1 expression (`i0 * 8 + mod(r0, 4)`) with ember's IR parser: the same grammar
    and checks as inside a module (int64 literals, nesting depth). Size symbols need no
    declaration here; loop variables are allowed unless `loop_vars` is False. Raises
    `ember.ir.IRParseError` (line and column inside `text`), nothing else."""
    from ember.ir.parser import parse_expression  # the parser imports this module

    return parse_expression(text, loop_vars=loop_vars)


def symbol(name: str) -> sympy.Symbol:
    """The sympy symbol for an ir-v1 size symbol (`s0`) or loop variable (`i0`): an integer,
    never negative."""
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


# ---- target languages ----------------------------------------------------------------------
@dataclass(frozen=True)
class ExprLanguage:
    """How a target language spells ir-v1's integer operators. `floordiv`/`mod` are templates
    over the operands `{0}`, `{1}` (Python semantics: the language's own operator where it
    has them, a helper function where not); `max`/`min` name a function, applied to all
    operands at once (`nary`) or folded left two at a time; `big_int` writes an integer that
    needs more than 32 bits; `negate` writes `not x` for a guard's relations (None: none);
    `floordiv_pos`/`mod_pos` (None: `floordiv`/`mod`) where the dividend is provably
    non-negative and the divisor a positive integer, as loop indices are: there truncating
    division is floor division, so C++ needs no helper."""

    name: str
    floordiv: str
    mod: str
    max: str
    min: str
    nary: bool = False
    big_int: str = "{0}"
    negate: str | None = None
    floordiv_pos: str | None = None
    mod_pos: str | None = None


# C++'s own / and % on non-negative indices: the helpers' sign fix-up is a branch that kept g++
# from hoisting a loop-invariant `mod(i0, 64)` out of an `omp simd` loop (its loads became
# gathers: a masked softmax ran 3.5x slower)
CPP = ExprLanguage("C++", floordiv="ember_floordiv({0}, {1})", mod="ember_mod({0}, {1})",
                   max="std::max<int64_t>", min="std::min<int64_t>", big_int="{0}LL",
                   floordiv_pos="({0} / {1})", mod_pos="({0} % {1})")
PYTHON = ExprLanguage("Python", floordiv="({0} // {1})", mod="({0} % {1})", max="max",
                      min="min", nary=True, negate="not ({0})")
TRITON = ExprLanguage("Triton", floordiv="_floordiv({0}, {1})", mod="_mod({0}, {1})",
                      max="tl.maximum", min="tl.minimum")


def print_expr(e: Dim | sympy.Basic, lang: ExprLanguage, name: Callable[[str], str] = str,
               error: Callable[[str], Exception] = ValueError) -> str:
    """`e` as source in `lang`: every sum and product parenthesised, so the text needs no
    precedence table. `name(symbol)` spells (or refuses, raising) each symbol; an operator the
    language cannot write raises `error(message)`."""
    if isinstance(e, bool):
        raise error(f"{e!r} is not an integer expression")
    if isinstance(e, int):
        return lang.big_int.format(e) if abs(e) >= 2**31 else str(e)
    if not isinstance(e, sympy.Basic):
        raise error(f"{e!r} is not an integer expression")
    if e.is_Integer:
        return print_expr(int(e), lang, name, error)
    if e.is_Symbol:
        return name(str(e.name))
    if isinstance(e, sympy.Not) and lang.negate is not None:
        return lang.negate.format(print_expr(e.args[0], lang, name, error))
    if isinstance(e, sympy.core.relational.Relational) and lang.negate is not None:
        return (f"{print_expr(e.lhs, lang, name, error)} {e.rel_op} "
                f"{print_expr(e.rhs, lang, name, error)}")
    args = [print_expr(a, lang, name, error) for a in e.args]
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(args) + ")"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + " * ".join([args[0]] * int(e.exp)) + ")"
    if isinstance(e, (FloorDiv, PyMod)):
        if e.args[1].is_Integer and int(e.args[1]) == 0:
            # a divisor of 0 comes from a dimension of size 0 (repeat(2, 0)'s index math), whose
            # every access is masked or never runs, so any value does: Triton evaluates masked
            # lanes too, and its compiler aborts folding a constant x % 0 (H200, 2026-12-03)
            return "0"
        pos = _nonneg_by_positive(e)
        if isinstance(e, FloorDiv):
            return (lang.floordiv_pos if pos and lang.floordiv_pos else lang.floordiv).format(*args)
        return (lang.mod_pos if pos and lang.mod_pos else lang.mod).format(*args)
    if isinstance(e, (sympy.Max, sympy.Min)):
        fn = lang.max if isinstance(e, sympy.Max) else lang.min
        if lang.nary:
            return f"{fn}({', '.join(args)})"
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out
    raise error(f"expression {_short(str(e))} has no {lang.name} form")


def _nonneg_by_positive(e: sympy.Expr) -> bool:
    """A // or mod whose dividend is never negative and whose divisor is a positive integer."""
    a, b = e.args
    return bool(b.is_Integer and int(b) > 0) and _nonneg(a)


def _nonneg(e: sympy.Expr) -> bool:
    """`e` is never negative: built by +, *, //, mod, max and min from non-negative integers
    and symbols (loop variables and size symbols are non-negative integers, `symbol`)."""
    if e.is_Integer or e.is_Symbol:
        return bool(e.is_nonnegative)
    if isinstance(e, (sympy.Add, sympy.Mul, sympy.Min)):
        return all(_nonneg(a) for a in e.args)
    if isinstance(e, sympy.Max):
        return any(_nonneg(a) for a in e.args)
    if isinstance(e, (FloorDiv, PyMod)):
        return _nonneg_by_positive(e)
    return False


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:56] + "..."


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


# ---- cheap construction and substitution ---------------------------------------------------
# sympy's own Max/Min constructors prove argument order with its assumption system (relational
# `is_ge`, `factor_terms`): milliseconds per call, and every `xreplace` of an expression holding
# one rebuilds it that way. Index maps of concatenations and paddings hold one per piece, and
# fusion substitutes them thousands of times (a DenseNet spent most of its compile there). These
# build the same sympy nodes (`evaluate=False`: canonical argument order, equal to an evaluated
# one with the same arguments) after folding what interval arithmetic proves.


def _sign_env(e: sympy.Expr) -> dict[str, Interval]:
    """Each free symbol's range from its assumptions: ember's symbols are never negative."""
    return {s.name: (0, _INF) if s.is_nonnegative else (-_INF, _INF) for s in e.free_symbols
            if isinstance(s, sympy.Symbol)}


def _dominated(a: sympy.Expr, b: sympy.Expr, is_max: bool) -> bool:
    """True when `b` is always >= `a` (max) or <= `a` (min), so `a` never decides."""
    d = b - a if is_max else a - b
    if d.is_Integer:
        return int(d) >= 0
    r = value_range(d, _sign_env(d))
    return r is not None and r[0] >= 0


def _lattice(cls: type[sympy.Max] | type[sympy.Min], args: tuple[Dim, ...]) -> Dim:
    is_max = cls is sympy.Max
    flat: list[sympy.Expr] = []
    for a in args:
        e = as_sympy(a)
        flat.extend(e.args if isinstance(e, cls) else (e,))
    consts = [int(e) for e in flat if e.is_Integer]
    rest = list(dict.fromkeys(e for e in flat if not e.is_Integer))
    live: list[sympy.Expr] = [sympy.Integer(max(consts) if is_max else min(consts))] \
        if consts else []
    for e in rest:  # drop an argument another one always beats (at most a few: pairwise)
        if any(_dominated(e, o, is_max) for o in live):
            continue
        live = [o for o in live if not _dominated(o, e, is_max)] + [e]
    if len(live) == 1:
        return simplify_dim(live[0])
    return cls(*live, evaluate=False)


def max_dim(*args: Dim) -> Dim:
    """max(args...) as ir-v1 holds it (a sympy Max), built without sympy's costly evaluation:
    constants fold, nested maxima flatten, and an argument that interval arithmetic shows
    never wins is dropped."""
    return _lattice(sympy.Max, args)


def min_dim(*args: Dim) -> Dim:
    """min(args...), as `max_dim`."""
    return _lattice(sympy.Min, args)


def rebuild(e: sympy.Expr, args: list[sympy.Expr] | tuple[sympy.Expr, ...]) -> sympy.Expr:
    """`e.func(*args)`, but max/min through `max_dim`/`min_dim`."""
    if isinstance(e, sympy.Max):
        return as_sympy(max_dim(*args))
    if isinstance(e, sympy.Min):
        return as_sympy(min_dim(*args))
    return e.func(*args)


def substitute_dims(e: Dim, subst: Mapping[sympy.Symbol, Dim]) -> Dim:
    """`e` with symbols replaced at once (sympy's `xreplace`, with max/min rebuilt cheaply)."""
    if isinstance(e, int) or not subst:
        return e
    table = {k: as_sympy(v) for k, v in subst.items()}
    memo: dict[sympy.Expr, sympy.Expr] = {}

    def walk(x: sympy.Expr) -> sympy.Expr:
        if x.is_Atom:
            return table.get(x, x)
        got = memo.get(x)
        if got is None:
            args = [walk(a) for a in x.args]
            same = all(a is b for a, b in zip(args, x.args, strict=True))
            got = memo[x] = x if same else rebuild(x, args)
        return got
    return simplify_dim(walk(e))
