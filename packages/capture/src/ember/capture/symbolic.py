"""Dynamic shapes in capture: ember's own shape environment (sympy), without torch's ShapeEnv.

A dimension marked dynamic becomes a size symbol `s0` whose *hint* is the call's real size. The
function is recorded on fake tensors whose symbolic dims have a *probe* size instead: a large,
unusual number (10007, 13001, ...) that no static size of the program is likely to equal. Every
integer the recording produces (a result dim, a `view` size computed inside a composite op) is
then a function of the probes, and `ShapeEnv.expr_of` reads it back as a size expression: exactly
where Python computed it (`SymInt` arithmetic registers its value), else by fitting
`c * monomial + d` over the symbols. After the recording `symbolize` rewrites the graph's ints
into expressions. A second recording with other probes must give the same text; otherwise the
capture is redone with static shapes (a value was misread), so a wrong fit costs a recompile,
never a wrong graph.

Python code sees sizes as `SymInt`s (an `int` subclass holding its expression). Comparing one
decides the branch at the *real* sizes and records the relation as a guard (`s0 > 8`); where the
probes would take the other branch the capture restarts with the symbol's range narrowed (a
linear relation in one symbol) or the symbol made static. A size used as a float or as a loop
count makes its symbols static (`Specialize`). Sizes 0 and 1 are never symbolic (as torch).

`.item()` of a one-element integer tensor is an *unbacked* symbol `u0` (torch.compile's
`capture_scalar_outputs`): no input's shape binds it, the graph does (`graph.bind_symbol`, ir-v1.2)
from the tensor's value at run time. It is recorded at a probe value like a size, so it flows into
shapes (`x.new_zeros(n)`, `x[:n]`, `view(n, -1)`). What capture cannot know about it is asserted
at run time instead of guarded: it is >= 0 where it is a size, and where a slice would clamp it at
its probe (`x[:n]` with n above x's length) the capture restarts with `u0 <= len` asserted and a
probe below the length. A branch on it, a use as a float or as a loop count is data-dependent
control flow: the capture gives up being symbolic (`Unbacked`), and the static capture breaks the
graph at the `.item()`.
"""

from __future__ import annotations

import contextvars
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from ember.ir.expr import (
    PYTHON,
    FloorDiv,
    PyMod,
    evaluate,
    print_expr,
    symbol,
    to_text,
    value_range,
)

INF = math.inf
_MAX_FIT_OFFSET = 64


class Specialize(BaseException):  # noqa: N818  (not an error: it restarts the capture)
    """Restart the capture with these symbols static. A BaseException so that no `except
    Exception` of the symbolic interpreter (which models the user's try/except) catches it."""

    def __init__(self, names: set[str], why: str, fact: sympy.Basic | None = None):
        super().__init__(why)
        unbacked = sorted(n for n in names if n[:1] == "u")
        if unbacked:  # a value read by .item() cannot be made static: it is not an input's
            raise Unbacked(f"{why} ({', '.join(unbacked)}, a value .item() read)")
        self.names = set(names)
        self.why = why
        self.fact = fact  # the branch's relation, where a branch on sizes caused it


class Unbacked(BaseException):  # noqa: N818
    """A value read by `.item()` decides control flow (a branch, a float, a loop count): no
    symbolic capture (the static capture then breaks the graph at the `.item()`)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class BoundUnbacked(BaseException):  # noqa: N818
    """Restart the capture with unbacked symbol `name` asserted <= `bound` (a slice that its
    probe value would clamp), its probe then chosen below the bound."""

    def __init__(self, name: str, bound: sympy.Expr | int):
        super().__init__(f"{name} <= {bound}")
        self.name, self.bound = name, bound
        self.avoid: set[int] = set()  # the ints of the recording: probes below must differ


class Narrow(BaseException):  # noqa: N818
    """Restart the capture with symbol `name` in the range [lo, hi] (a branch on its size)."""

    def __init__(self, name: str, lo: int, hi: int | float):
        super().__init__(f"{name} in [{lo}, {hi}]")
        self.name, self.lo, self.hi = name, lo, hi


@dataclass
class SymInfo:
    name: str
    hint: int  # the real size at this capture
    lo: int
    hi: int | float
    probe: int
    origins: list[str]  # the input dims it stands for (`x.size()[0]`), first one first


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n ** 0.5) + 1))


def _next_prime(n: int, taken: set[int]) -> int:
    n = max(n, 2)
    while not _is_prime(n) or n in taken:
        n += 1
    return n


def _probe(k: int, run: int, lo: int, hi: int | float, taken: set[int]) -> int:
    """An unusual size for the k-th symbol in probe run `run` (0 or 1), within [lo, hi]."""
    if hi >= 40000:
        n = max(lo, 10007 + 3001 * k + 1499 * run + (k * k * 37) % 211)
        while not _is_prime(n) or n in taken:
            n += 1
        return n
    cands = [v for v in range(int(hi), lo - 1, -1) if v not in taken] or [int(hi)]
    # the largest odd values first (powers of two are the likeliest static sizes)
    cands.sort(key=lambda v: (v % 2 == 0, -v))
    return cands[min(run, len(cands) - 1)]


@dataclass
class Restarts:
    """What earlier attempts of one capture learnt, by input dim (`x.size()[0]`)."""

    static: set[str] = field(default_factory=set)
    ranges: dict[str, tuple[int, int | float]] = field(default_factory=dict)
    # sizes whose symbol was made static: an input dim of that size met later in the recording
    # would have shared the symbol (duck sizing), so it is static too. Without this each of a
    # KV cache's 2 x layers tensors costs its own restart (its head dim meets the weights').
    sizes: set[int] = field(default_factory=set)

    # input dim -> (another input dim, c): its size is the other's + c at the real sizes, and
    # the next attempt writes it as the other's symbol + c (torch's ShapeEnv replacements). A
    # branch comparing two symbols (a KV cache's length with an attention mask one longer)
    # goes the real way only where the probes keep their real difference; independent probes
    # take the other branch, which made both static: a recompile per decode step.
    ties: dict[str, tuple[str, int]] = field(default_factory=dict)
    # unbacked symbol -> the bounds it is asserted not to exceed (ints or backed expressions)
    unbacked_le: dict[str, list[Any]] = field(default_factory=dict)
    unbacked_avoid: set[int] = field(default_factory=set)  # ints a small probe must not equal

    def make_static(self, info: SymInfo) -> None:
        self.static |= set(info.origins)
        self.sizes.add(info.hint)

    def tie(self, fact: sympy.Basic | None, symbols: Mapping[str, SymInfo]) -> bool:
        """Learn a tie from a branch on `fact` that the probes took the other way, where it
        compares two symbols by their difference (`s1 + 1 - s0 > 0`): the next attempt writes
        the later-lifted one as the other's symbol + their real difference (`s0 + 1`), which
        its input's guard checks.
        False where the relation is of another form (its symbols are then made static)."""
        if not isinstance(fact, sympy.Rel | sympy.Not):
            return False
        rel = fact.args[0] if isinstance(fact, sympy.Not) else fact
        if not isinstance(rel, sympy.Rel) or len(rel.free_symbols) != 2:
            return False
        a, b = sorted(rel.free_symbols, key=lambda x: x.name)
        diff = sympy.expand(rel.lhs - rel.rhs)
        ca, cb = diff.coeff(a), diff.coeff(b)
        if ca == 0 or ca + cb != 0 or (diff - ca * a - cb * b).free_symbols:
            return False
        return self._learn_tie(symbols[a.name], symbols[b.name])

    def tie_from_error(self, text: str, env: ShapeEnv) -> bool:
        """Learn a tie from an op that failed only at the probe sizes because two sizes that
        are equal at the real sizes were not at the probes (`The size of tensor a (10008) must
        match the size of tensor b (13045)`: a cache's length + 1 against a mask's length)."""
        exprs = []
        for v in {int(t) for t in re.findall(r"\d+", text)}:
            e = env.expr_of(v)
            if e is not None and len(e.free_symbols) == 1:
                x = next(iter(e.free_symbols))
                if sympy.expand(e - x).is_Integer:  # s + c
                    exprs.append((x.name, e))
        hints = env.hints()
        for i, (na, ea) in enumerate(exprs):
            for nb, eb in exprs[i + 1:]:
                if na != nb and evaluate(ea, hints) == evaluate(eb, hints) and \
                        self._learn_tie(env.symbols[na], env.symbols[nb]):
                    return True
        return False

    def _learn_tie(self, ia: SymInfo, ib: SymInfo) -> bool:
        wa, wb = ia.origins[0], ib.origins[0]
        if wa in self.ties or wb in self.ties:
            return False  # tied already, and still the other way: give up (make static)
        self.ties[wa] = (wb, ia.hint - ib.hint)
        self.ties[wb] = (wa, ib.hint - ia.hint)
        return True


@dataclass
class ShapeEnv:
    """Symbols, their ranges and probes, and the relations guarded during one recording."""

    run: int = 0
    learnt: Restarts = field(default_factory=Restarts)
    symbols: dict[str, SymInfo] = field(default_factory=dict)
    known: dict[int, sympy.Expr] = field(default_factory=dict)  # probe value -> expression
    relations: list[sympy.Basic] = field(default_factory=list)
    int_args: dict[str, str] = field(default_factory=dict)  # symbol -> the int argument it is
    tied_sizes: dict[int, sympy.Expr] = field(default_factory=dict)  # real size -> `s0 - 1`
    # `.item()` results (`u0`): hint is only a planning size (the value is known at run time)
    unbacked: dict[str, SymInfo] = field(default_factory=dict)

    def unbacked_symbol(self, where: str, avoid: set[int]) -> tuple[str, int, list[Any]]:
        """A new unbacked symbol for the value `.item()` reads at `where`: (its name, its probe
        value, the bounds it is asserted not to exceed). The k-th `.item()` of a recording is
        `u<k>` in every attempt, so what one attempt learnt applies to the next."""
        name = f"u{len(self.unbacked)}"
        le = list(self.learnt.unbacked_le.get(name, []))
        taken = {s.probe for s in [*self.symbols.values(), *self.unbacked.values()]}
        taken |= avoid | self.learnt.unbacked_avoid  # a probe equal to a static int is misread
        probes = self.probes()
        caps = [int(evaluate(b, probes)) if not isinstance(b, int) else b for b in le]
        if caps:  # below every bound: a small range takes _probe's unusual values
            cap = min(caps)
            free = [v for v in range(2, cap + 1) if v not in taken]
            if cap < 1000 and len(free) < 2:  # two recordings need two probes to compare
                raise Unbacked(f"{name} <= {cap} leaves no two unused probe sizes")
            probe = _probe(0, self.run, 2, cap, taken) if cap < 1000 else \
                _next_prime(cap * 2 // 3 - 211 * self.run - 37 * len(self.unbacked), taken)
            hints = self.hints()
            hint = min([64, *(int(evaluate(b, hints)) if not isinstance(b, int) else b
                              for b in le)])
        else:
            probe = _next_prime(20011 + 4001 * len(self.unbacked) + 1499 * self.run, taken)
            hint = 64
        info = SymInfo(name, max(hint, 0), 0, INF, probe, [where])
        self.unbacked[name] = info
        self.known[probe] = symbol(name)
        return name, probe, le

    def is_unbacked(self, e: sympy.Basic) -> bool:
        return any(s.name in self.unbacked for s in e.free_symbols)

    def dim_symbol(self, hint: int, lo: int, hi: int | float, where: str
                   ) -> sympy.Expr | None:
        """The symbol for input dim `where` of real size `hint`, or None where it stays static
        (0/1, or made static by an earlier attempt). Equal sizes share a symbol (duck sizing);
        a dim tied to another's symbol (Restarts.ties) is that symbol + the real difference."""
        if hint < 2 or where in self.learnt.static or hint in self.learnt.sizes:
            return None
        lo, hi = self.learnt.ranges.get(where, (max(lo, 2), hi))
        for s in self.symbols.values():
            if s.hint == hint:
                s.origins.append(where)
                return symbol(s.name)
        tied = self.tied_sizes.get(hint)  # (duck sizing for tied dims too)
        if tied is None:
            tied = self._tied(where, hint, lo, hi)
        if tied is not None:
            self.tied_sizes[hint] = tied
            return tied
        name = f"s{len(self.symbols)}"
        taken = {s.probe for s in self.symbols.values()}
        info = SymInfo(name, hint, lo, hi, _probe(len(self.symbols), self.run, lo, hi, taken),
                       [where])
        self.symbols[name] = info
        s = symbol(name)
        self.known[info.probe] = s
        return s

    def _tied(self, where: str, hint: int, lo: int, hi: int | float) -> sympy.Expr | None:
        """`other + c` where `where` is tied to a dim that has a symbol already (its guard
        then checks `x.shape[d] == other + c` after the other's guard bound it); the other's
        range narrows so that `where` stays in its own (a cache of length >= 2 needs a mask
        of length >= 3). None: no tie, or the ranges or probe do not fit."""
        tie = self.learnt.ties.get(where)
        if tie is None:
            return None
        other_where, c = tie
        for other in self.symbols.values():
            if other_where in other.origins and other.hint + c == hint:
                new_lo, new_hi = max(other.lo, lo - c), min(other.hi, hi - c)
                if not new_lo <= min(other.hint, other.probe) <= max(other.hint, other.probe) \
                        <= new_hi:
                    return None
                other.lo, other.hi = new_lo, new_hi
                e = symbol(other.name) + c
                self.remember(other.probe + c, e)
                return e
        return None

    def probe_of(self, name: str) -> int:
        return self.symbols[name].probe

    def hints(self) -> dict[str, int]:
        return {n: s.hint for n, s in self.symbols.items()}

    def probes(self) -> dict[str, int]:
        return {n: s.probe for n, s in [*self.symbols.items(), *self.unbacked.items()]}

    def intervals(self) -> dict[str, tuple[int | float, int | float]]:
        return {n: (s.lo, s.hi) for n, s in self.symbols.items()}

    # -- reading values back as expressions --------------------------------------------------
    def remember(self, value: int, e: sympy.Expr) -> None:
        if not e.free_symbols:
            return
        self.known.setdefault(value, e)

    def expr_of(self, v: int) -> sympy.Expr | None:
        """The size expression whose value at the probes is `v`, or None (a static int)."""
        if isinstance(v, bool):
            return None
        got = self.known.get(v)
        if got is not None and self.is_unbacked(got):
            return got  # an unbacked probe (small where a bound asserts it): read exactly
        fit = self._fit_symbols()
        if not fit:
            return None
        least = min(fit.values())
        if abs(v) < least // 64:
            return None  # far below every probe: a static int (even where a size made it)
        got = self.known.get(v)
        if got is not None:
            return got
        monomials = list(self._monomials(list(fit)))
        if least < 1000:
            # small probes (a narrowed range, a sequence capped by a static cache) stand
            # unfitted: an int near them, or a multiple of them, is as likely static. A product
            # with a large probe is still read back (a linear's `view(b * s, k)`)
            large = {symbol(n) for n, p in fit.items() if p >= 1000}
            if not large or abs(v) < min(fit[x.name] for x in large) // 2:
                return None
            monomials = [m for m in monomials if m.free_symbols & large]
        elif abs(v) < least // 2:
            return None
        best: tuple[tuple[int, int], sympy.Expr] | None = None
        for m in monomials:
            mv = int(evaluate(m, fit))
            c = round(v / mv)
            d = v - c * mv
            if c < 1 or abs(d) > _MAX_FIT_OFFSET:
                continue
            score = (abs(d) > 0, c)
            if best is None or score < best[0]:
                best = (score, c * m + d)
        if best is None:
            return None
        self.known[v] = best[1]
        return best[1]

    def _fit_symbols(self) -> dict[str, int]:
        """The symbols ints are fitted over, by probe: every backed one, and the unbacked ones
        with a large probe (a small one, below a bound, is only read back exactly)."""
        out = {n: s.probe for n, s in self.symbols.items()}
        out.update({n: s.probe for n, s in self.unbacked.items() if s.probe >= 1000})
        return out

    def _monomials(self, names: list[str]) -> Iterator[sympy.Expr]:
        syms = [symbol(n) for n in names]
        yield from syms
        for i, a in enumerate(syms):
            for b in syms[i:]:
                yield a * b
        if len(syms) <= 4:
            for i, a in enumerate(syms):
                for j, b in enumerate(syms[i:], i):
                    for c in syms[j:]:
                        yield a * b * c

    # -- deciding branches -----------------------------------------------------------------
    def decide(self, rel: sympy.Basic, probe_result: bool) -> bool:
        """The outcome of a size relation at the real sizes; guarded unless the ranges imply it.
        Restarts the capture where the probes would take the other branch."""
        if isinstance(rel, sympy.logic.boolalg.BooleanAtom):
            return bool(rel)  # sympy decided it for every size (`s0 == s0 + 1`): no guard
        if self.is_unbacked(rel):
            ranges = {**self.intervals(), **{n: (s.lo, s.hi) for n, s in self.unbacked.items()}}
            for outcome in (True, False):
                if _implied(rel, outcome, ranges):
                    return outcome  # (`u0 >= 0` of a size)
            names = ", ".join(sorted(n.name for n in rel.free_symbols
                                     if n.name in self.unbacked))
            raise Unbacked(f"a branch on {rel_text(rel)} ({names}, a value .item() read: "
                           f"data-dependent control flow)")
        hints = self.hints()
        real = bool(rel.subs({symbol(n): v for n, v in hints.items()}))
        if _implied(rel, real, self.intervals()):
            return real
        fact = rel if real else sympy.Not(rel)
        if real != probe_result:
            self._narrow_or_specialize(fact)
        if fact not in self.relations:
            self.relations.append(fact)
        return real

    def _narrow_or_specialize(self, fact: sympy.Basic) -> None:
        names = {s.name for s in fact.free_symbols}
        if len(names) == 1 and isinstance(fact, sympy.Rel | sympy.Not):
            name = next(iter(names))
            s = symbol(name)
            info = self.symbols[name]
            try:
                sol = sympy.solve_univariate_inequality(fact, s, relational=False)
            except Exception:
                sol = None
            if isinstance(sol, sympy.Interval):
                lo = max(info.lo, math.ceil(sol.start) if sol.start.is_finite else info.lo)
                hi: int | float = info.hi
                if sol.end.is_finite:
                    end = math.floor(sol.end)
                    hi = min(info.hi, end - 1 if sol.right_open and end == sol.end else end)
                if sol.left_open and sol.start.is_finite and lo == sol.start:
                    lo += 1
                if lo <= info.hint <= hi and lo < hi:
                    raise Narrow(name, int(lo), hi)
        raise Specialize(names, f"the probe sizes take the other branch of {fact}", fact)


def _implied(rel: sympy.Basic, real: bool, ranges: Mapping[str, tuple[Any, Any]]) -> bool:
    """The relation's outcome follows from the symbols' ranges alone (no guard needed)."""
    if not isinstance(rel, sympy.Rel):
        return False
    r = value_range(sympy.expand(rel.lhs - rel.rhs), ranges)
    if r is None:
        return False
    lo, hi = r
    outcomes = {
        sympy.StrictGreaterThan: (lo > 0, hi <= 0), sympy.GreaterThan: (lo >= 0, hi < 0),
        sympy.StrictLessThan: (hi < 0, lo >= 0), sympy.LessThan: (hi <= 0, lo > 0),
        sympy.Eq: (lo == hi == 0, lo > 0 or hi < 0), sympy.Ne: (lo > 0 or hi < 0, lo == hi == 0),
    }.get(type(rel))
    if outcomes is None:
        return False
    return outcomes[0] if real else outcomes[1]


# -- the capture's environment, and Python-level sizes -----------------------------------------
_ENV: contextvars.ContextVar[ShapeEnv | None] = contextvars.ContextVar("ember_shape_env",
                                                                      default=None)


def current_env() -> ShapeEnv | None:
    return _ENV.get()


def using_env(env: ShapeEnv | None) -> contextvars.Token[ShapeEnv | None]:
    return _ENV.set(env)


def reset_env(token: contextvars.Token[ShapeEnv | None]) -> None:
    _ENV.reset(token)


def _expr(x: Any) -> sympy.Expr | None:
    if isinstance(x, SymInt):
        return x.expr
    if isinstance(x, int) and not isinstance(x, bool):
        return sympy.Integer(x)
    return None


class SymInt(int):
    """A Python int that is a size expression: its int value is the probe value (what the fake
    tensors hold); arithmetic keeps the expression, comparisons are decided at the real sizes
    and guarded (ShapeEnv.decide)."""

    expr: sympy.Expr
    env: ShapeEnv

    def __new__(cls, value: int, expr: sympy.Expr, env: ShapeEnv) -> SymInt:
        obj = int.__new__(cls, value)
        obj.expr = expr
        obj.env = env
        env.remember(value, expr)
        return obj

    def _make(self, value: int, e: sympy.Expr) -> int:
        e = sympy.sympify(e)
        if not e.free_symbols:
            return int(value)
        return SymInt(value, e, self.env)

    def _arith(self, other: Any, fn: Any, sym: Any, rev: bool = False) -> Any:
        o = _expr(other)
        if o is None:
            if isinstance(other, float):
                raise Specialize({s.name for s in self.expr.free_symbols},
                                 "a size used as a float")
            return NotImplemented
        a, b = (o, self.expr) if rev else (self.expr, o)
        x, y = (int(other), int(self)) if rev else (int(self), int(other))
        return self._make(fn(x, y), sym(a, b))

    def __add__(self, o: Any) -> Any:
        return self._arith(o, int.__add__, lambda a, b: a + b)

    def __radd__(self, o: Any) -> Any:
        return self._arith(o, int.__add__, lambda a, b: a + b, True)

    def __sub__(self, o: Any) -> Any:
        return self._arith(o, int.__sub__, lambda a, b: a - b)

    def __rsub__(self, o: Any) -> Any:
        return self._arith(o, int.__sub__, lambda a, b: a - b, True)

    def __mul__(self, o: Any) -> Any:
        return self._arith(o, int.__mul__, lambda a, b: a * b)

    def __rmul__(self, o: Any) -> Any:
        return self._arith(o, int.__mul__, lambda a, b: a * b, True)

    def __floordiv__(self, o: Any) -> Any:
        return self._arith(o, int.__floordiv__, FloorDiv)

    def __rfloordiv__(self, o: Any) -> Any:
        return self._arith(o, int.__floordiv__, FloorDiv, True)

    def __mod__(self, o: Any) -> Any:
        return self._arith(o, int.__mod__, PyMod)

    def __rmod__(self, o: Any) -> Any:
        return self._arith(o, int.__mod__, PyMod, True)

    def __neg__(self) -> Any:
        return self._make(-int(self), -self.expr)

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return self  # sizes are never negative

    def _float(self) -> Any:
        raise Specialize({s.name for s in self.expr.free_symbols}, "a size used as a float")

    def __float__(self) -> float:
        return self._float()  # type: ignore[no-any-return]

    def __truediv__(self, o: Any) -> Any:
        return self._float()

    def __rtruediv__(self, o: Any) -> Any:
        return self._float()

    def __pow__(self, o: Any, mod: Any = None) -> Any:
        if isinstance(o, int) and not isinstance(o, (bool, SymInt)) and o >= 0 and mod is None:
            return self._make(int(self) ** o, self.expr ** o)
        return self._float()

    def _cmp(self, other: Any, rel: Any, fn: Any) -> Any:
        o = _expr(other)
        if o is None:
            if isinstance(other, float):
                return self._float()
            return NotImplemented
        return self.env.decide(rel(self.expr, o), bool(fn(int(self), int(other))))

    def __eq__(self, o: object) -> Any:
        return self._cmp(o, sympy.Eq, int.__eq__)

    def __ne__(self, o: object) -> Any:
        return self._cmp(o, sympy.Ne, int.__ne__)

    def __lt__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Lt, int.__lt__)

    def __le__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Le, int.__le__)

    def __gt__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Gt, int.__gt__)

    def __ge__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Ge, int.__ge__)

    def __bool__(self) -> bool:
        return bool(self.env.decide(sympy.Ne(self.expr, 0), int(self) != 0))

    __hash__ = int.__hash__

    def __repr__(self) -> str:
        return to_text(self.expr)


class SymSize(tuple):
    """`tensor.shape` with symbolic dims (torch.Size cannot hold SymInts)."""

    def numel(self) -> Any:
        n: Any = 1
        for d in self:
            n = n * d
        return n

    def __getitem__(self, i: Any) -> Any:
        got = tuple.__getitem__(self, i)
        return SymSize(got) if isinstance(i, slice) else got

    def __add__(self, o: Any) -> Any:
        return SymSize(tuple(self) + tuple(o))

    def __radd__(self, o: Any) -> Any:
        return SymSize(tuple(o) + tuple(self))

    def __repr__(self) -> str:
        return f"torch.Size([{', '.join(map(repr, self))}])"


def as_sym(v: Any) -> Any:
    """A recorded Python value with its sizes as SymInts (ints read back as expressions)."""
    env = current_env()
    if env is None or not (env.symbols or env.unbacked):
        return v
    if isinstance(v, int) and not isinstance(v, (bool, SymInt)):
        e = env.expr_of(v)
        return SymInt(v, e, env) if e is not None else v
    if type(v) in (tuple, torch.Size):
        items = [as_sym(x) for x in v]
        if not any(isinstance(x, SymInt) for x in items):
            return v
        return SymSize(items) if isinstance(v, torch.Size) else tuple(items)
    return v


def note_slice(size: int, start: Any, end: Any, length: int) -> None:
    """A slice bounded by a value `.item()` read (`x[n:]`): its length `end - start` read back
    as that expression, where the length is large enough to be told from static sizes (the
    second recording catches a collision). `x[:n]`'s length is the symbol itself."""
    env = current_env()
    if env is None or not env.unbacked or length < 1000:
        return
    parts = []
    for v, default in ((start, 0), (end, size)):
        v = default if v is None or (isinstance(v, int) and v >= 2 ** 62) else v
        if not isinstance(v, int) or v < 0:
            return
        e = env.expr_of(v)
        parts.append(sympy.Integer(v) if e is None else e)
    e = sympy.expand(parts[1] - parts[0])
    if env.is_unbacked(e):
        env.remember(length, e)


def int_argument(value: int, where: str) -> int:
    """A Python int argument of the call as a SymInt where the policy makes it dynamic (its
    symbol is bound by the argument's guard, and by a size-carrier input in the graph)."""
    env, policy = current_env(), current_policy()
    if env is None or policy is None:
        return value
    rng = policy.int_range(where, value)
    if rng is None:
        return value
    s = env.dim_symbol(value, rng[0], rng[1], where)
    if not isinstance(s, sympy.Symbol):  # static, or tied to another symbol: kept static
        return value
    env.int_args.setdefault(s.name, where)
    return SymInt(env.probe_of(s.name), s, env)


def concrete(v: Any, why: str) -> Any:
    """`v` where a plain int is needed (a loop count): a SymInt makes its symbols static."""
    if isinstance(v, SymInt):
        raise Specialize({s.name for s in v.expr.free_symbols}, why)
    return v


# -- guard code ---------------------------------------------------------------------------------
def py_var(name: str) -> str:
    return f"_S_{name}"


def pyexpr(e: Any) -> str:
    """A sympy size expression (or relation) as Python over the guard function's `_S_<name>`
    (ember.ir's Python table)."""
    return print_expr(e, PYTHON, py_var)


def rel_text(e: sympy.Basic) -> str:
    """A relation as readable text (`s0 > 8`, `s0 * 2 != s1`)."""
    if isinstance(e, sympy.Not):
        return f"not ({rel_text(e.args[0])})"
    if isinstance(e, sympy.Rel):
        return f"{to_text(e.lhs)} {e.rel_op} {to_text(e.rhs)}"
    return str(e)


# -- inputs -------------------------------------------------------------------------------------
Layout = tuple[tuple[Any, ...], tuple[Any, ...], tuple[int, ...], tuple[int, ...]]


def symbolic_layout(env: ShapeEnv, shape: tuple[int, ...], stride: tuple[int, ...],
                    dims: Mapping[int, tuple[int, int | float]], name: str) -> Layout | None:
    """(symbolic shape, symbolic strides, probe shape, probe strides) of a dense input with
    `dims` dynamic, or None: nothing symbolic, or a layout with gaps (kept static)."""
    order = sorted(range(len(shape)), key=lambda d: (stride[d], -d))
    expect = 1
    for d in order:  # dense: a permuted row-major (size-1 dims are free)
        if shape[d] != 1 and stride[d] != expect:
            return None
        expect *= shape[d]
    syms: list[Any] = []
    for d, n in enumerate(shape):
        lo, hi = dims.get(d, (2, INF))
        s = env.dim_symbol(n, lo, hi, f"{name}.size()[{d}]") if d in dims else None
        syms.append(s if s is not None else n)
    if all(isinstance(x, int) for x in syms):
        return None
    sym_stride: list[Any] = [0] * len(shape)
    acc: Any = sympy.Integer(1)
    for d in order:
        sym_stride[d] = acc if shape[d] != 1 else stride[d]
        acc = acc * syms[d]
    sym_stride = [sympy.sympify(x) for x in sym_stride]
    probes = env.probes()
    pshape = tuple(evaluate(x, probes) if not isinstance(x, int) else x for x in syms)
    pstride = tuple(int(evaluate(x, probes)) for x in sym_stride)
    for x, v in zip(sym_stride, pstride, strict=True):
        env.remember(v, x)
    return tuple(syms), tuple(sym_stride), pshape, pstride


# -- the dynamic-shape policy a capture asks ----------------------------------------------------
class Policy:
    """Which dims of an input are dynamic (runtime.dynamic implements it); None: none."""

    static_reason: str | None = None  # why the last capture asked to be dynamic stayed static
    unbacked_reason: str | None = None  # why a value .item() read could not be a symbol

    def dims(self, where: str, real: Any) -> dict[int, tuple[int, int | float]]:
        raise NotImplementedError

    def int_range(self, where: str, value: int) -> tuple[int, int | float] | None:
        """The range of Python int argument `where` made a size symbol, or None (static)."""
        return None


_POLICY: contextvars.ContextVar[Policy | None] = contextvars.ContextVar("ember_dyn_policy",
                                                                       default=None)


def current_policy() -> Policy | None:
    return _POLICY.get()


def using_policy(p: Policy | None) -> contextvars.Token[Policy | None]:
    return _POLICY.set(p)


def reset_policy(token: contextvars.Token[Policy | None]) -> None:
    _POLICY.reset(token)
