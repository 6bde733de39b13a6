"""Index expressions of the loop-level IR: sympy inside, ir-v1 expression text outside.

A kernel body reads buffers at index expressions over its loop variables: `i0, i1, ...` range over
the output (the kernel's `ranges`), `r0, r1, ...` over the reduced dims (`reduce_ranges`). Size
symbols (`s0`) may appear too. Since ir-v1.1 an index is an expression argument
(`loop.load(%x, index=[i0, i1 * 2])`, loop variables are expression atoms); ir-v1.0 text carried
the same expression text in a STRING (`index=["i0", "i1 * 2"]`), which `parse_index` reads with
ember.ir's one expression parser (`ember.ir.expr.parse_expr`). This module keeps what is
inductor-specific: simplification over loop extents, flat offsets, vectorised evaluation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from ember.ir.expr import (
    Dim,
    FloorDiv,
    PyMod,
    as_sympy,
    parse_expr,
    rebuild,
    simplify_dim,
    substitute_dims,
    symbol,
    to_text,
    value_range,
)
from ember.ir.lexer import IRParseError


class IndexParseError(ValueError):
    """An index is not an ir-v1 expression over loop variables and size symbols."""


def ivar(k: int) -> sympy.Symbol:
    """The loop variable of output dim k."""
    return symbol(f"i{k}")


def rvar(k: int) -> sympy.Symbol:
    """The loop variable of reduced dim k."""
    return symbol(f"r{k}")


@functools.lru_cache(maxsize=16384)
def index_text(e: Dim | str) -> str:
    """An index as canonical text (an ir-v1.0 STRING index is read first). Cached: fusion
    compares the same indices as text many times."""
    return to_text(parse_index(e))


def index_value(e: Dim) -> Dim:
    """An index as a loop op's argument holds it since ir-v1.1: the expression itself."""
    return simplify_dim(e)


def clip(text: str) -> str:
    """An index as error messages quote it (a hostile one may be long)."""
    return text if len(text) <= 60 else text[:56] + "..."


def parse_index(e: Dim | str) -> Dim:
    """An index of a loop op: since ir-v1.1 an expression already (returned as it is); in
    ir-v1.0 text a STRING, read by ember.ir's expression parser (`parse_expr`)."""
    if isinstance(e, str):
        return _parse_text(e)
    if isinstance(e, bool) or not isinstance(e, (int, sympy.Expr)):
        raise IndexParseError(f"index {clip(repr(e))} is not an expression")
    return e


@functools.lru_cache(maxsize=16384)
def _parse_text(text: str) -> Dim:
    """Cached: the verifier, the reference and codegen read the same strings many times (sympy
    expressions are immutable, so sharing them is safe)."""
    try:
        return parse_expr(text)
    except IRParseError as e:
        raise IndexParseError(f"index {clip(text)!r}: {e.message} (column {e.col})") from None


def substitute(e: Dim, subst: Mapping[sympy.Symbol, Dim]) -> Dim:
    """Replace loop variables at once (`i0 -> r0 * 4`): the composition of index maps. Not
    sympy's `xreplace`: that rebuilds every max/min through sympy's costly evaluation."""
    return substitute_dims(e, subst)


Bounds = tuple[int, int] | None  # inclusive [lo, hi] of an index expression, None: unknown


def _bounds(e: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> Bounds:
    """Interval arithmetic over loop variables (`ranges`: variable -> its extent); the same
    evaluation the verifier's bounds proof uses (`ember.ir.expr.value_range`)."""
    r = value_range(e, {v.name: (0, n - 1) for v, n in ranges.items() if n > 0})
    if r is None or math.isinf(r[0]) or math.isinf(r[1]):
        return None
    return int(r[0]), int(r[1])


def _split(e: sympy.Expr, d: int) -> tuple[sympy.Expr, sympy.Expr]:
    """e = d * q + r, moving every term whose coefficient d divides into q (exact for // and
    mod whatever the values: (d*q + r) // d == q + r // d)."""
    q: list[sympy.Expr] = []
    r: list[sympy.Expr] = []
    for t in sympy.Add.make_args(e):
        c, rest = t.as_coeff_Mul()
        if c.is_Integer and int(c) % d == 0:
            q.append(sympy.Integer(int(c) // d) * rest)
        else:
            r.append(t)
    return sympy.Add(*q), sympy.Add(*r)


def simplify_index(e: Dim, ranges: Mapping[sympy.Symbol, int] | None = None) -> Dim:
    """Fold `//` and `mod` by positive constants that are exact over the loop variables'
    extents (`ranges`; without them only what holds for any value): `(i0*128 + i1) // 128` is
    `i0` when i1 < 128, `mod(i1, 128)` is `i1`, `(x // a) // b` is `x // (a*b)`. Views (reshape
    of a contiguous buffer) then read with affine indices that C++ vectorises."""
    if isinstance(e, int) or e.is_Atom:
        return simplify_dim(e)
    rng = ranges or {}
    ones = {v: 0 for v, n in rng.items() if n == 1}  # a loop of one step
    out = _simp(as_sympy(substitute_dims(e, ones)) if ones else e, rng)
    if any(isinstance(a, PyMod) and not a.args[1].is_Integer
           for a in sympy.preorder_traversal(out)):
        # a flat offset through a reshape of symbolic size: s1*256*(i0 // s1) + 256*mod(i0, s1)
        out = _simp(_fold_divmod(sympy.expand(out)), rng)
    return simplify_dim(out)


def _simp(e: sympy.Expr, rng: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    if e.is_Atom:
        return e
    args = [_simp(a, rng) for a in e.args]
    if isinstance(e, (sympy.Max, sympy.Min)):  # an argument that always wins
        bs = [_bounds(a, rng) for a in args]
        for a, b in zip(args, bs, strict=True):
            if b is not None and all(o is not None and (b[0] >= o[1] if isinstance(e, sympy.Max)
                                                        else b[1] <= o[0])
                                     for o in bs if o is not b):
                return a
    if isinstance(e, (FloorDiv, PyMod)) and _size_divisor(args[1]) is not None:
        return _simp_symbolic(e, args[0], args[1], rng)
    if not isinstance(e, (FloorDiv, PyMod)) or not args[1].is_Integer or int(args[1]) <= 0:
        return rebuild(e, args) if args != list(e.args) else e
    a, d = args[0], int(args[1])
    if isinstance(e, FloorDiv):
        if isinstance(a, FloorDiv) and a.args[1].is_Integer and int(a.args[1]) > 0:
            return _simp(FloorDiv(a.args[0], sympy.Integer(int(a.args[1]) * d)), rng)
        q, r = _split(a, d)
        if _within(r, d, rng):
            return q
        g = _common(r, d, rng)
        if g is not None:  # (g*x + small) // (g*d') == x // d' when 0 <= small < g
            return q + _simp(FloorDiv(_split(r, g)[0], sympy.Integer(d // g)), rng)
        return q + FloorDiv(r, sympy.Integer(d)) if r != 0 else q
    if isinstance(a, PyMod) and a.args[1].is_Integer and int(a.args[1]) % d == 0:
        a = a.args[0]
    _, r = _split(a, d)
    if _within(r, d, rng):
        return r
    g = _common(r, d, rng)
    if g is not None:  # mod(g*x + small, g*d') == g*mod(x, d') + small
        x, small = _split(r, g)
        return g * _simp(PyMod(x, sympy.Integer(d // g)), rng) + small
    return PyMod(r, sympy.Integer(d))


def _size_divisor(d: sympy.Expr) -> tuple[int, sympy.Expr] | None:
    """`d` as c * P with c a positive int and P a product of size symbols (not loop
    variables), where P is not 1: a divisor that is a size expression (`256*s1`)."""
    c, rest = d.as_coeff_Mul()
    if not c.is_Integer or int(c) <= 0 or rest == 1:
        return None
    for f in sympy.Mul.make_args(rest):
        base = f.base if f.is_Pow and f.exp.is_Integer and int(f.exp) > 0 else f
        if not base.is_Symbol or base.name[:1] in ("i", "r"):
            return None
    return int(c), rest


def _simp_symbolic(e: sympy.Expr, a: sympy.Expr, d: sympy.Expr,
                   rng: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """`//` and `mod` by a size expression c*P (sizes are >= 1 where a loop runs):
    (x // A) // B is x // (A*B), and (g*x + small) // (g*d') is x // d' when 0 <= small < g
    (g dividing c): a reshape of a dim of symbolic size reads `i0 // s1`, not
    `(256*i0 + i1) // (256*s1)`."""
    cp = _size_divisor(d)
    assert cp is not None
    c, _ = cp
    if isinstance(e, FloorDiv):
        if isinstance(a, FloorDiv) and (a.args[1].is_Integer and int(a.args[1]) > 0
                                        or _size_divisor(a.args[1]) is not None):
            return _simp(FloorDiv(a.args[0], a.args[1] * d), rng)
        g = _common(a, c, rng)
        if g is not None:
            return _simp(FloorDiv(_split(a, g)[0], d / g), rng)
    return FloorDiv(a, d) if isinstance(e, FloorDiv) else PyMod(a, d)


def _within(r: sympy.Expr, d: int, rng: Mapping[sympy.Symbol, int]) -> bool:
    b = _bounds(r, rng)
    return b is not None and 0 <= b[0] and b[1] < d


def _common(r: sympy.Expr, d: int, rng: Mapping[sympy.Symbol, int]) -> int | None:
    """The largest g > 1 dividing d such that r = g*x + small with 0 <= small < g."""
    coefs = sorted({abs(int(t.as_coeff_Mul()[0])) for t in sympy.Add.make_args(r)
                    if t.as_coeff_Mul()[0].is_Integer and not t.is_Integer}, reverse=True)
    for c in coefs:
        g = math.gcd(c, d)
        if g > 1 and _within(_split(r, g)[1], g, rng):
            return g
    return None


def _fold_divmod(total: sympy.Expr) -> sympy.Expr:
    """k*d*(x // d) + k*mod(x, d) -> k*x (exact for Python // and mod): the flat offset of a
    contiguous buffer read through a reshape is the reshape's own flat index."""
    while True:
        terms: dict[sympy.Expr, sympy.Expr] = {}
        for t in sympy.Add.make_args(total):
            c, rest = t.as_coeff_Mul()
            terms[rest] = terms.get(rest, 0) + c
        for rest, c in terms.items():
            if not isinstance(rest, PyMod) or not (rest.args[1].is_Integer or _size_divisor(
                    rest.args[1]) is not None):  # (a size expression: s1, 256*s1)
                continue
            x, d = rest.args
            fd = FloorDiv(x.args[0], x.args[1] * d) if isinstance(x, FloorDiv) \
                and _positive(x.args[1]) and _positive(d) else FloorDiv(x, d)
            want_c, want = (c * d * fd).as_coeff_Mul()  # the k*d*(x // d) term's key
            if terms.get(want) == want_c:
                total = sympy.expand(total - c * rest - c * d * fd + c * x)
                break
        else:
            return total


def _positive(d: sympy.Expr) -> bool:
    return bool(d.is_Integer and int(d) > 0) or _size_divisor(d) is not None


def row_major_strides(shape: Sequence[Dim]) -> list[Dim]:
    out: list[Dim] = []
    acc: Dim = 1
    for d in reversed(shape):
        out.append(acc)
        acc = simplify_dim(as_sympy(acc) * as_sympy(d))
    return list(reversed(out))


def flat_offset(index: Sequence[Dim], shape: Sequence[Dim]) -> Dim:
    """Row-major element offset of `index` in a contiguous buffer of `shape`."""
    total: sympy.Expr = sympy.Integer(0)
    for i, st in zip(index, row_major_strides(shape), strict=True):
        total = total + as_sympy(i) * as_sympy(st)
    if any(isinstance(a, PyMod) for a in sympy.preorder_traversal(total)):
        total = _simp(_fold_divmod(sympy.expand(total)), {})
    return simplify_dim(total)


def eval_index(e: Dim, env: Mapping[str, Any]) -> Any:
    """Evaluate an index expression where loop variables are int64 tensors (broadcasting) and
    size symbols are ints; Python semantics for // and mod."""
    if isinstance(e, int):
        return e
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return env[e.name]
    args = [eval_index(a, env) for a in e.args]
    if isinstance(e, sympy.Add):
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if isinstance(e, sympy.Mul):
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return args[0] ** int(e.exp)
    if isinstance(e, FloorDiv):
        return _floordiv(args[0], args[1])
    if isinstance(e, PyMod):
        return _mod(args[0], args[1])
    if isinstance(e, (sympy.Max, sympy.Min)):
        out = args[0]
        for a in args[1:]:
            if isinstance(out, int) and isinstance(a, int):
                out = max(out, a) if isinstance(e, sympy.Max) else min(out, a)
            else:
                fn = torch.maximum if isinstance(e, sympy.Max) else torch.minimum
                out = fn(torch.as_tensor(out), torch.as_tensor(a))
        return out
    raise ValueError(f"not an index expression: {e!r}")


def _floordiv(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return torch.div(torch.as_tensor(a), b, rounding_mode="floor")


def _mod(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    return torch.remainder(torch.as_tensor(a), b)


Affine = tuple[list[int], list[list[int]]]  # offsets[d], coefficients[d][k] of i<k>


def affine_view(index: Sequence[Dim], rank: int) -> Affine | None:
    """`index[d] = offsets[d] + sum_k coefficients[d][k] * i<k>` with integer constants over
    the view's own loop variables i0..i<rank-1>, or None (a `//`, `mod`, size symbol, ...)."""
    vs = [ivar(k) for k in range(rank)]
    offsets: list[int] = []
    coefs: list[list[int]] = []
    for e in index:
        e = as_sympy(e)
        if not e.free_symbols <= set(vs):
            return None
        try:
            poly = sympy.Poly(e, *vs) if vs else None
        except sympy.PolynomialError:
            return None
        if poly is None:
            if not e.is_Integer:
                return None
            offsets.append(int(e))
            coefs.append([])
            continue
        if poly.total_degree() > 1 or not all(c.is_Integer for c in poly.coeffs()):
            return None
        offsets.append(int(poly.coeff_monomial(1)))
        coefs.append([int(poly.coeff_monomial(v)) for v in vs])
    return offsets, coefs
