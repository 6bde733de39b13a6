"""Index expressions of the loop-level IR: sympy inside, ir-v1 expression text outside.

A kernel body reads buffers at index expressions over its loop variables: `i0, i1, ...` range over
the output (the kernel's `ranges`), `r0, r1, ...` over the reduced dims (`reduce_ranges`). Size
symbols (`s0`) may appear too. The text is ember's canonical expression text (`to_text`), carried
as a STRING literal in ir-v1 (`loop.load(%x, index=["i0", "i1 * 2"])`), and read back by the small
parser here: it never evaluates anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from ember.ir.expr import Dim, FloorDiv, PyMod, as_sympy, simplify_dim, symbol, to_text

_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|[-+*(),]))")
_VAR = re.compile(r"^(i|r|s)\d+$")


class IndexParseError(ValueError):
    """An index string is not an ir-v1 expression over loop variables and size symbols."""


def ivar(k: int) -> sympy.Symbol:
    """The loop variable of output dim k."""
    return symbol(f"i{k}")


def rvar(k: int) -> sympy.Symbol:
    """The loop variable of reduced dim k."""
    return symbol(f"r{k}")


def index_text(e: Dim) -> str:
    return to_text(simplify_dim(e))


def parse_index(text: str) -> Dim:
    """Read an index expression: INT, i<k>, r<k>, s<k>, + - * //, mod/max/min(a, b), parens."""
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise IndexParseError(f"index {text!r}: unexpected {text[pos]!r} at {pos + 1}")
        kind = m.lastgroup or "op"
        toks.append((kind, m.group(kind)))
        pos = m.end()
    k = 0

    def peek() -> str:
        return toks[k][1] if k < len(toks) else ""

    def take(want: str | None = None) -> tuple[str, str]:
        nonlocal k
        if k >= len(toks) or (want is not None and toks[k][1] != want):
            raise IndexParseError(f"index {text!r}: expected {want or 'more'}")
        k += 1
        return toks[k - 1]

    def expr(depth: int) -> sympy.Expr:
        if depth > 64:
            raise IndexParseError(f"index {text!r}: nested too deeply")
        e = term(depth)
        while peek() in ("+", "-"):
            op = take()[1]
            t = term(depth)
            e = e + t if op == "+" else e - t
        return e

    def term(depth: int) -> sympy.Expr:
        e = factor(depth)
        while peek() in ("*", "//"):
            op = take()[1]
            f = factor(depth)
            e = e * f if op == "*" else FloorDiv(e, f)
        return e

    def factor(depth: int) -> sympy.Expr:
        kind, tok = take()
        if kind == "int":
            return sympy.Integer(int(tok))
        if tok == "-":
            return -factor(depth + 1)
        if tok == "(":
            e = expr(depth + 1)
            take(")")
            return e
        if tok in ("mod", "max", "min"):
            take("(")
            a = expr(depth + 1)
            take(",")
            b = expr(depth + 1)
            take(")")
            fn: Any = {"mod": PyMod, "max": sympy.Max, "min": sympy.Min}[tok]
            return fn(a, b)
        if kind == "name" and _VAR.match(tok):
            return symbol(tok)
        raise IndexParseError(f"index {text!r}: unexpected {tok!r}")

    e = expr(0)
    if k != len(toks):
        raise IndexParseError(f"index {text!r}: unexpected {toks[k][1]!r}")
    return simplify_dim(e)


def substitute(e: Dim, subst: Mapping[sympy.Symbol, Dim]) -> Dim:
    """Replace loop variables at once (`i0 -> r0 * 4`): the composition of index maps."""
    if isinstance(e, int) or not subst:
        return e
    return simplify_dim(e.xreplace({k: as_sympy(v) for k, v in subst.items()}))


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
