"""The verifier's proof that every loop-IR index stays inside its buffer.

A kernel (`loop.pointwise` / `loop.reduction`) binds its body's loop variables: `i<k>` ranges over
[0, ranges[k]), `r<k>` over [0, reduce_ranges[k]). A `loop.reduce` in a body binds its own body's
`i0..i<k-1>` to the enclosing body's first k loop extents (as the reference interpreter and the
C++ code both do) and `r<k>` to its own `reduce_ranges`. Each index must use only variables bound
there, and its range, by interval arithmetic over those extents (`ember.ir.expr.value_range`),
must lie in [0, size) of its dim. The C++ code reads at exactly these indices without any check,
so a load the proof misses would read memory outside the buffer.

Since ir-v1.1 a body declares its domain (`domain(i0 < 4, r0 < 8)`): its loads are checked
where they stand, against that declaration (`check_index`, from loop.load's and loop.index's
type rules, the error at the index's own line and column), and each caller checks that it runs
the body over exactly that domain (`check_kernel`). A body of ir-v1.0 text declares none: its
loads are checked from each kernel that reaches it, with the extents the kernel binds.

Sizes may be symbolic: then the ends of an index's range are expressions over the size symbols
(`i0` over `ranges=[s0]` is [0, s0 - 1]) and `0 <= lo`, `hi <= size - 1` are proved for every
value in the symbols' declared ranges (`prove_le`). Loop IR has no data-dependent index: an index
is text over loop variables and size symbols only, so every load is checked statically (a gather
by loaded ids is an extern, `loop.index_select`, whose op checks its ids when it runs).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import sympy

from ember.inductor.indexing import IndexParseError, clip, parse_index
from ember.ir import Graph, Module, Node, OpTypeError, Pos, Ref, TensorType, Value
from ember.ir.expr import (
    INT64_MAX,
    INT64_MIN,
    Dim,
    FloorDiv,
    Interval,
    PyMod,
    as_sympy,
    is_loop_var,
    to_text,
    value_range,
)
from ember.ir.verifier import dims_equal

MAX_NESTING = 64  # loop.reduce bodies nested deeper than this are refused (and cycles)
SymRange = tuple[sympy.Expr, sympy.Expr]


def symbol_ranges(module: Module | None) -> dict[str, Interval]:
    """Each declared size symbol's [min, max] (sizes are never negative)."""
    out: dict[str, Interval] = {}
    for s in (module.symbols.values() if module is not None else ()):
        hi = s.max if s.max is not None else math.inf
        out[s.name] = (max(0, s.min or 0), hi if hi == math.inf else int(hi))
    return out


# ---- one index -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=8192)
def _concrete(e: Dim, extents: tuple[tuple[str, int], ...]) -> tuple[Interval | None, bool]:
    """(range of the index over concrete loop extents, whether every intermediate fits int64:
    the C++ code computes them in int64, where an overflow would wrap to any offset)."""
    seen: list[Interval] = []
    r = value_range(e, {v: (0, n - 1) for v, n in extents}, seen)
    fits = all(INT64_MIN <= lo and hi <= INT64_MAX for lo, hi in seen)
    return r, fits


def _sym_range(e: sympy.Expr, extents: Mapping[str, Dim], syms: Mapping[str, Interval]
               ) -> SymRange | None:
    """[lo, hi] of `e` as expressions over size symbols (loop variable v: [0, extent - 1]);
    None where no such bound follows."""
    if e.is_Integer:
        return e, e
    if e.is_Symbol:
        if e.name in extents:
            return sympy.Integer(0), as_sympy(extents[e.name]) - 1
        return (e, e) if e.name in syms else None
    if isinstance(e, sympy.Add):
        parts = [_sym_range(a, extents, syms) for a in e.args]
        if any(p is None for p in parts):
            return None
        return (sympy.Add(*[p[0] for p in parts if p]), sympy.Add(*[p[1] for p in parts if p]))
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        p = _sym_range(e.base, extents, syms)
        if p is None or not _nonneg(p[0], syms):
            return None
        return p[0] ** e.exp, p[1] ** e.exp
    if isinstance(e, sympy.Mul):
        coef, rest = e.as_coeff_Mul()
        if not coef.is_Integer:
            return None
        factors = sympy.Mul.make_args(rest)
        lo: sympy.Expr = sympy.Integer(1)
        hi: sympy.Expr = sympy.Integer(1)
        for f in factors:  # a product of ranges that are never negative
            p = _sym_range(f, extents, syms)
            if p is None or not _nonneg(p[0], syms):
                return None
            lo, hi = lo * p[0], hi * p[1]
        return (coef * lo, coef * hi) if coef >= 0 else (coef * hi, coef * lo)
    if isinstance(e, (sympy.Max, sympy.Min)):
        parts = [_sym_range(a, extents, syms) for a in e.args]
        if any(p is None for p in parts):
            return None
        fn: Any = sympy.Max if isinstance(e, sympy.Max) else sympy.Min
        return fn(*[p[0] for p in parts if p]), fn(*[p[1] for p in parts if p])
    if isinstance(e, (FloorDiv, PyMod)):
        a = _sym_range(e.args[0], extents, syms)
        d = _sym_range(e.args[1], extents, syms)
        if a is None or d is None or d[0] != d[1] or not prove_le(sympy.Integer(1), d[0], syms):
            return None  # a divisor that is one positive size (constant or symbolic)
        if isinstance(e, FloorDiv):  # floor(x / d) is monotone in x for d > 0
            return FloorDiv(a[0], d[0]), FloorDiv(a[1], d[0])
        if _nonneg(a[0], syms) and prove_le(a[1], d[0] - 1, syms):
            return a
        return sympy.Integer(0), d[0] - 1
    return None


def _nonneg(e: sympy.Expr, syms: Mapping[str, Interval]) -> bool:
    return prove_le(sympy.Integer(0), e, syms)


def prove_le(a: sympy.Expr, b: sympy.Expr, syms: Mapping[str, Interval], depth: int = 0) -> bool:
    """True only if a <= b for every value of the size symbols in their declared ranges."""
    diff = sympy.expand(b - a)
    if diff.is_Integer:
        return int(diff) >= 0
    if depth < 8:
        if isinstance(a, sympy.Max) and all(prove_le(x, b, syms, depth + 1) for x in a.args):
            return True
        if isinstance(a, sympy.Min) and any(prove_le(x, b, syms, depth + 1) for x in a.args):
            return True
        if isinstance(b, sympy.Min) and all(prove_le(a, y, syms, depth + 1) for y in b.args):
            return True
        if isinstance(b, sympy.Max) and any(prove_le(a, y, syms, depth + 1) for y in b.args):
            return True
        # floor(h / q) <= b  <=>  h <= b*q + q - 1, and a <= floor(h / q)  <=>  a*q <= h (q > 0)
        if isinstance(a, FloorDiv) and prove_le(sympy.Integer(1), a.args[1], syms, depth + 1) \
                and prove_le(a.args[0], b * a.args[1] + a.args[1] - 1, syms, depth + 1):
            return True
        if isinstance(b, FloorDiv) and prove_le(sympy.Integer(1), b.args[1], syms, depth + 1) \
                and prove_le(a * b.args[1], b.args[0], syms, depth + 1):
            return True
    r = value_range(diff, syms)
    return r is not None and r[0] >= 0


def _show(r: Interval | SymRange) -> str:
    return "[" + ", ".join(str(x) if isinstance(x, (int, float)) else to_text(x) for x in r) + "]"


@functools.lru_cache(maxsize=16384)
def index_names(index: Dim | str) -> tuple[str, ...]:
    """The loop variables and size symbols an index uses (it must parse)."""
    return tuple(sorted(s.name for s in as_sympy(parse_index(index)).free_symbols))


def index_violation(index: Dim | str, size: Dim, extents: Mapping[str, Dim],
                    syms: Mapping[str, Interval]) -> str | None:
    """Why `index` (it must parse) may leave [0, size) over the loop extents, or None when it
    provably stays inside. Cached: --verify-each proves the same loads after every pass."""
    e = parse_index(index)
    names = index_names(e)
    return _violation(e, size, tuple((v, extents[v]) for v in names if v in extents),
                      tuple(sorted(syms.items())))  # the size's symbols too


@functools.lru_cache(maxsize=16384)
def _violation(e: Dim, size: Dim, extents_: tuple[tuple[str, Dim], ...],
               syms_: tuple[tuple[str, Interval], ...]) -> str | None:
    names = index_names(e)
    extents, syms = dict(extents_), dict(syms_)
    used = {v: extents[v] for v in names if v in extents}
    if all(isinstance(n, int) for n in used.values()) and isinstance(size, int) \
            and len(used) == len(names):
        r, fits = _concrete(e, tuple(sorted(used.items())))
        if r is None:
            return f"cannot be bounded over the loop extents (the buffer has size {size} there)"
        if not fits:
            return (f"overflows int64 in its intermediate values, which the C++ code would "
                    f"wrap (range {_show(r)}, the buffer has size {size} there)")
        if r[0] >= 0 and r[1] <= size - 1:
            return None
        return f"ranges over {_show(r)}, but the buffer has size {size} there"
    s = _sym_range(as_sympy(e), extents, syms)
    if s is not None and _nonneg(s[0], syms) and prove_le(s[1], as_sympy(size) - 1, syms):
        return None
    where = f"ranges over {_show(s)}" if s is not None else "cannot be bounded"
    return f"{where}, not provably inside the buffer's size {to_text(size)} there"


# ---- a kernel's bodies ---------------------------------------------------------------------

def _where(n: Node, pos: Pos | None = None) -> str:
    p = pos or n.pos
    return f" at {p.line}:{p.col}" if p is not None else ""


def _bindings(extents: Mapping[str, Dim]) -> str:
    return ", ".join(f"{v} < {to_text(n)}" for v, n in extents.items()) or "no loop variable"


def _index_pos(n: Node, d: int | None) -> Pos | None:
    """Where index `d` of `n` (None: loop.index's one index) was read, else the node's own."""
    key = ("index",) if d is None else ("index", d)
    return (n.arg_pos or {}).get(key) or n.pos


def check_index(module: Module | None, body: Graph, n: Node) -> None:
    """A loop.load / loop.index of a body that declares its domain: every index uses only the
    domain's variables and declared size symbols, and stays inside its buffer over the domain.
    Raises OpTypeError at the offending index's position."""
    assert body.domain is not None
    _check_node(f"body @{body.name}", n, dict(body.domain), symbol_ranges(module),
                f"the domain of @{body.name} does not declare")


def _check_node(where: str, n: Node, extents: Mapping[str, Dim], syms: Mapping[str, Interval],
                binder: str) -> None:
    index = n.kwargs.get("index")
    one = not isinstance(index, list)
    items = [index] if one else list(index)  # type: ignore[arg-type]
    buf = n.args[0] if n.op == "loop.load" and n.args else None
    shape = buf.type.shape if isinstance(buf, Value) and isinstance(buf.type, TensorType) \
        else None
    # an empty domain runs no iteration: none of this body's loads happens
    empty = any(isinstance(x, int) and x <= 0 for x in extents.values())
    for d, ix in enumerate(items):
        try:
            e = parse_index(ix)
        except IndexParseError:
            continue  # the op's own type rule reports it
        pos = _index_pos(n, None if one else d)
        for name in index_names(e):
            if is_loop_var(name) and name not in extents:
                raise OpTypeError(
                    f"{where}: {n.op}{_where(n, pos)}: index {_quote(ix, e)!r} uses {name}, "
                    f"which {binder} (bound here: {_bindings(extents)})", pos)
            if not is_loop_var(name) and name not in syms:
                raise OpTypeError(f"{where}: {n.op}{_where(n, pos)}: index {_quote(ix, e)!r} "
                                  f"uses the undeclared size symbol {name}", pos)
        if shape is None or empty or d >= len(shape):
            continue
        why = index_violation(e, shape[d], extents, syms)
        if why is not None:
            assert isinstance(buf, Value)
            raise OpTypeError(
                f"{where}: loop.load(%{buf.name}){_where(n, pos)} may read outside its "
                f"buffer: index {_quote(ix, e)!r} of dim {d} {why} (loops: "
                f"{_bindings(extents)})", pos)


def _quote(ix: object, e: Dim) -> str:
    """An index as an error quotes it: as written (ir-v1.0 text), else canonical; clipped."""
    return clip(ix if isinstance(ix, str) else to_text(e))


def _domain_of(ranges: Sequence[Dim], red: Sequence[Dim]) -> dict[str, Dim]:
    out: dict[str, Dim] = {f"i{k}": n for k, n in enumerate(ranges)}
    out.update({f"r{k}": n for k, n in enumerate(red)})
    return out


def check_domain(where: str, body: Graph, ranges: Sequence[Dim], red: Sequence[Dim],
                 pos: Pos | None = None) -> None:
    """A caller runs `body` over `ranges` x `red`: that must be the domain the body declares."""
    assert body.domain is not None
    want = _domain_of(ranges, red)
    have = body.domain
    if list(have) != list(want) or not all(dims_equal(have[k], want[k]) for k in want):
        raise OpTypeError(f"{where}: body @{body.name} declares domain({_bindings(have)}), but "
                          f"runs over {_bindings(want)}", pos)


def check_kernel(module: Module | None, op: str, body: Graph, ranges: Sequence[Dim],
                 reduce_ranges: Sequence[Dim]) -> None:
    """Raise OpTypeError naming the first load of the kernel (its body and the bodies of its
    fused reductions) whose index is unbound or may leave its buffer; a body that declares its
    domain is only checked to be run over it (its loads are checked where they stand)."""
    walk = _Walk(module, f"{op}(@{body.name})", symbol_ranges(module))
    walk.body(body, list(ranges), list(reduce_ranges), (body.name,))


class _Walk:
    def __init__(self, module: Module | None, kernel: str, syms: Mapping[str, Interval]):
        self.module, self.kernel, self.syms = module, kernel, syms
        # (body, its extents) already checked: a body reached again through another
        # loop.reduce is not walked twice (shared sub-bodies would otherwise cost 2**depth)
        self.done: set[tuple[str, str]] = set()

    def body(self, body: Graph, ranges: list[Dim], red: list[Dim], path: tuple[str, ...],
             pos: Pos | None = None) -> None:
        key = (body.name, f"{[to_text(x) for x in ranges]}{[to_text(x) for x in red]}")
        if key in self.done:
            return
        self.done.add(key)
        if body.domain is not None:
            check_domain(self.kernel, body, ranges, red, pos)
            return
        _check_body(self, body, ranges, red, path)


def _check_body(walk: _Walk, body: Graph, ranges: list[Dim], red: list[Dim],
                path: tuple[str, ...]) -> None:
    extents = _domain_of(ranges, red)
    where = f"{walk.kernel}: body @{body.name}"
    for n in body.nodes:
        if n.op in ("loop.load", "loop.index"):
            _check_node(where, n, extents, walk.syms, "no enclosing loop binds")
        elif n.op == "loop.reduce":
            _check_reduce(walk, where, n, ranges + red, path)


def reduce_extents(n: Node, domain: Sequence[Dim], where: str) -> tuple[list[Dim], list[Dim]]:
    """The extents a `loop.reduce` node runs its body over inside a body of `domain`: the
    enclosing loops' first len(ranges=) extents, then its reduce_ranges=."""
    outer, red = n.kwargs.get("ranges"), n.kwargs.get("reduce_ranges")
    assert isinstance(outer, list) and isinstance(red, list)
    k = len(outer)
    if k > len(domain):
        raise OpTypeError(f"{where}: loop.reduce{_where(n)} has {k} outer ranges, but its "
                          f"enclosing loops are only {len(domain)} deep")
    return list(domain[:k]), list(red)


def _check_reduce(walk: _Walk, where: str, n: Node, domain: list[Dim], path: tuple[str, ...]
                  ) -> None:
    module = walk.module
    ref, outer, red = (n.args[0] if n.args else None, n.kwargs.get("ranges"),
                       n.kwargs.get("reduce_ranges"))
    sub = module.items.get(ref.name) if isinstance(ref, Ref) and module is not None else None
    if not isinstance(sub, Graph) or not isinstance(outer, list) or not isinstance(red, list):
        return  # loop.reduce's own type rule reports it
    if sub.name in path or len(path) >= MAX_NESTING:
        raise OpTypeError(f"{where}: loop.reduce{_where(n)}: body @{sub.name} is nested in "
                          f"itself or more than {MAX_NESTING} deep")
    ranges, red = reduce_extents(n, domain, where)
    walk.body(sub, ranges, red, (*path, sub.name), n.pos)
