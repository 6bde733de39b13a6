"""Random runnable ir-v1 modules for ember.ir's property tests (split from strategies.py).

`runnable_cases()`: modules of real aten ops (and `graph.call`) over tensors with symbolic shapes.
Each `RunnableCase` carries a reference that calls the same torch ops directly in Python;
`case_inputs(case)` makes inputs for it, with the symbols' actual sizes varying between examples
(not just their hints). `same_value()` compares results bitwise, NaN positions included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sympy
import torch
from hypothesis import strategies as st

from ember.ir import (
    F64,
    I64,
    DType,
    Graph,
    GraphBuilder,
    Module,
    Ref,
    ScalarType,
    Symbol,
    TensorType,
    Type,
    Value,
    symbol,
)
from ember.ir.expr import Dim, simplify_dim
from packages.ir.tests.strategies import (  # the shared leaf strategies
    _BOOLS,
    _DTYPES,
    _FLOATS,
    _INT64S,
    _LOCS,
    _NAMES,
    _STRINGS,
    _VALUE_NAMES,
    _float_key,
)

_T = TypeVar("_T")

# ---- runnable modules ----------------------------------------------------------------------

# A reference step: (values computed so far, symbol sizes) -> the node's results.
Step = Callable[[dict[Value, Any], Mapping[str, int]], list[Any]]

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "aten.neg.default": torch.neg, "aten.abs.default": torch.abs, "aten.exp.default": torch.exp,
    "aten.sin.default": torch.sin, "aten.relu.default": torch.relu,
    "aten.sigmoid.default": torch.sigmoid, "aten.tanh.default": torch.tanh,
    "aten.sqrt.default": torch.sqrt, "aten.reciprocal.default": torch.reciprocal,
    "aten.floor.default": torch.floor,
}
BINARY: dict[str, Callable[..., torch.Tensor]] = {
    "aten.add.Tensor": torch.add, "aten.sub.Tensor": torch.sub, "aten.mul.Tensor": torch.mul,
    "aten.div.Tensor": torch.div, "aten.maximum.default": torch.maximum,
    "aten.minimum.default": torch.minimum, "aten.atan2.default": torch.atan2,
    "aten.gt.Tensor": torch.gt, "aten.lt.Tensor": torch.lt, "aten.eq.Tensor": torch.eq,
}
FLOAT_DTYPES = (DType.f32, DType.f64, DType.f16, DType.bf16)
# Scalars that every float dtype holds without an overflow error on conversion.
SCALARS: list[float] = [0.0, -0.0, 1.0, -0.5, 2.5, -3.0, 1e-05, 100.0, math.inf, -math.inf,
                        math.nan]


_SCALAR_FLOATS: st.SearchStrategy[float] = st.one_of(st.sampled_from(SCALARS), st.floats(-1e4, 1e4))
_MAYBE_NAME = st.one_of(st.none(), _VALUE_NAMES)
_MAYBE_LOC = st.one_of(st.none(), _LOCS)
_EXTRA_ATTR = st.one_of(_INT64S, _FLOATS, _STRINGS, st.booleans(), st.none(), _DTYPES)


def scalar_floats() -> st.SearchStrategy[float]:
    return _SCALAR_FLOATS


def eval_dim(d: Dim, env: Mapping[str, int]) -> int:
    """A dim's size, by sympy substitution (independent of ember's own evaluator)."""
    if isinstance(d, int):
        return d
    return int(d.subs({symbol(k): v for k, v in env.items()}))


def dims_equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)


def broadcast(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """The broadcast shape, if it holds for every size of the symbols; else None."""
    out: list[Dim] = []
    for i in range(1, max((len(s) for s in shapes), default=0) + 1):
        ds = [s[-i] for s in shapes if i <= len(s)]
        big = [d for d in ds if not (isinstance(d, int) and d == 1)]
        if any(not dims_equal(big[0], d) for d in big[1:]):
            return None
        out.append(big[0] if big else 1)
    return tuple(reversed(out))


@dataclass
class Reference:
    """The reference program of one graph: the same torch ops, called directly."""

    params: list[Value]
    steps: list[tuple[list[Value], Step]]
    outputs: list[Value]

    def __call__(self, inputs: Sequence[Any], env: Mapping[str, int]) -> list[Any]:
        vals: dict[Value, Any] = dict(zip(self.params, inputs, strict=True))
        for results, fn in self.steps:
            outs = fn(vals, env)
            for r, o in zip(results, outs, strict=True):
                vals[r] = o
        return [vals[o] for o in self.outputs]


@dataclass
class RunnableCase:
    """A runnable module, its entry graph and how to compute its results without ember."""

    module: Module
    entry: str
    ranges: dict[str, tuple[int, int]]  # sizes each symbol may take in generated inputs
    reference: Reference
    updates: list[tuple[int, int]] = field(default_factory=list)

    @property
    def graph(self) -> Graph:
        return self.module.graph(self.entry)

    def expected(self, inputs: Sequence[Any],
                 env: Mapping[str, int]) -> tuple[list[Any], dict[int, Any]]:
        """(outputs returned to the caller, {parameter index: value written into it})."""
        results = self.reference(inputs, env)
        skip = {r for _, r in self.updates}
        return ([x for i, x in enumerate(results) if i not in skip],
                {p: results[r] for p, r in self.updates})


@dataclass
class _TV:
    """A tensor value of the graph being generated, with its symbolic shape."""

    value: Value
    dtype: DType
    shape: tuple[Dim, ...]
    contiguous: bool  # certainly contiguous (so `view` applies) at every size

    @property
    def rank(self) -> int:
        return len(self.shape)


def _same_type(t: TensorType) -> Callable[[_TV], bool]:
    def ok(u: _TV) -> bool:
        return (u.dtype == t.dtype and u.rank == t.rank
                and all(dims_equal(a, b) for a, b in zip(u.shape, t.shape)))

    return ok


class _GraphGen:
    """Draws a graph of real aten ops, tracking shapes symbolically."""

    def __init__(self, draw: st.DrawFn, module: Module, name: str,
                 param_types: Sequence[Type], helper: tuple[Graph, Reference] | None = None):
        self.draw = draw
        self.m = module
        self.gb = GraphBuilder(module, name)
        self.hints = module.hints()
        self.lower = {s.name: s.min or 0 for s in module.symbols.values()}
        self.helper = helper
        self.pool: list[_TV] = []
        self.scalars: list[Value] = []
        self.steps: list[tuple[list[Value], Step]] = []
        for t in param_types:
            v = self.gb.param(draw(_MAYBE_NAME), t)
            if isinstance(t, TensorType):
                self.pool.append(_TV(v, t.dtype, t.shape, True))
            else:
                self.scalars.append(v)

    # -- helpers --
    def choice(self, seq: Sequence[_T]) -> _T:
        """One element of a non-empty sequence (cheaper than a fresh `st.sampled_from`)."""
        seq = list(seq)
        return seq[self.draw(st.integers(0, len(seq) - 1))]

    def pick(self, ok: Callable[[_TV], bool]) -> _TV | None:
        cands = [t for t in self.pool if ok(t)]
        return self.choice(cands) if cands else None

    def floats_(self, t: _TV) -> bool:
        return t.dtype in FLOAT_DTYPES

    def emit(self, op: str, args: list[Any], kwargs: dict[str, Any],
             shapes: Sequence[tuple[Dim, ...]], fn: Step, contiguous: bool) -> list[_TV]:
        inferred = self.gb.infer(op, args, kwargs)
        assert len(inferred) == len(shapes), (op, inferred, shapes)
        out_types: list[Type] = []
        for t, shape in zip(inferred, shapes, strict=True):
            assert isinstance(t, TensorType)
            mine = TensorType(t.dtype, shape)
            assert mine.concrete_shape(self.hints) == t.concrete_shape(self.hints), (op, mine, t)
            out_types.append(mine)
        names = [self.draw(_MAYBE_NAME) for _ in shapes]
        loc = self.draw(_MAYBE_LOC)
        vals = self.gb.emit(op, args, kwargs, types=out_types,
                            names=[n or "t" for n in names], loc=loc)
        self.steps.append((vals, fn))
        tvs = [_TV(v, t.dtype, t.shape, contiguous)
               for v, t in zip(vals, out_types, strict=True) if isinstance(t, TensorType)]
        self.pool += tvs
        return tvs

    # -- ops; each returns False when the pool has nothing it can use --
    def unary(self) -> bool:
        x = self.pick(self.floats_)
        if x is None:
            return False
        op = self.choice(sorted(UNARY))
        f, a = UNARY[op], x.value
        self.emit(op, [a], {}, [x.shape], lambda v, e: [f(v[a])], x.contiguous)
        return True

    def binary(self) -> bool:
        x = self.pick(self.floats_)
        if x is None:
            return False
        xs = x.shape
        y = self.pick(lambda t: t.dtype in FLOAT_DTYPES + (DType.i64,)
                      and broadcast(xs, t.shape) is not None)
        assert y is not None  # x itself qualifies
        if self.draw(st.booleans()):
            x, y = y, x
        shape = broadcast(x.shape, y.shape)
        assert shape is not None
        op = self.choice(sorted(BINARY))
        f, a, b = BINARY[op], x.value, y.value
        kwargs: dict[str, Any] = {}
        if op in ("aten.add.Tensor", "aten.sub.Tensor") and self.draw(st.booleans()):
            kwargs["alpha"] = self.draw(_SCALAR_FLOATS)
        alpha = dict(kwargs)
        self.emit(op, [a, b], kwargs, [shape], lambda v, e: [f(v[a], v[b], **alpha)],
                  x.contiguous and y.contiguous)
        return True

    def mul_scalar(self) -> bool:
        x = self.pick(self.floats_)
        if x is None:
            return False
        a = x.value
        if len(self.scalars) > 0 and self.draw(_BOOLS):
            s: Any = self.choice(self.scalars)
            sv = s

            def fn(v: dict[Value, Any], e: Mapping[str, int]) -> list[Any]:
                return [torch.mul(v[a], v[sv])]
        else:
            s = self.draw(_SCALAR_FLOATS)
            c = s

            def fn(v: dict[Value, Any], e: Mapping[str, int]) -> list[Any]:
                return [torch.mul(v[a], c)]
        self.emit("aten.mul.Scalar", [a, s], {}, [x.shape], fn, x.contiguous)
        return True

    def clamp(self) -> bool:
        x = self.pick(self.floats_)
        if x is None:
            return False
        lo, hi = self.choice([(True, False), (False, True), (True, True)])
        kw: dict[str, Any] = {}
        if lo:
            kw["min"] = self.draw(_SCALAR_FLOATS)
        if hi:
            kw["max"] = self.draw(_SCALAR_FLOATS)
        a, kws = x.value, dict(kw)
        self.emit("aten.clamp.default", [a], kw, [x.shape],
                  lambda v, e: [torch.clamp(v[a], **kws)], x.contiguous)
        return True

    def sum_dims(self) -> bool:
        x = self.pick(lambda t: self.floats_(t) and t.rank >= 1)
        if x is None:
            return False
        dims_ = self.draw(st.lists(st.integers(0, x.rank - 1), min_size=1, unique=True))
        keep = self.draw(st.booleans())
        shape = tuple(1 if i in dims_ else d for i, d in enumerate(x.shape)
                      if keep or i not in dims_)
        written = [d - x.rank if self.draw(st.booleans()) else d for d in dims_]
        args: list[Any] = [x.value, written]
        kw: dict[str, Any] = {}
        if self.draw(st.booleans()):
            kw["keepdim"] = keep
        else:
            args.append(keep)
        dtype = self.draw(st.one_of(st.none(), st.sampled_from([DType.f64, DType.f32])))
        if dtype is not None:
            kw["dtype"] = dtype
        a, tdt = x.value, None if dtype is None else dtype.torch
        self.emit("aten.sum.dim_IntList", args, kw, [shape],
                  lambda v, e: [torch.sum(v[a], dim=written, keepdim=keep, dtype=tdt)], True)
        return True

    def max_dim(self) -> bool:
        def ok(t: _TV) -> bool:  # the reduced dim must be non-empty at every size
            return self.floats_(t) and any(self._low(d) >= 1 for d in t.shape)

        x = self.pick(ok)
        if x is None:
            return False
        dim = self.choice([i for i, d in enumerate(x.shape) if self._low(d) >= 1])
        keep = self.draw(st.booleans())
        shape = tuple(1 if i == dim else d for i, d in enumerate(x.shape) if keep or i != dim)
        a = x.value
        self.emit("aten.max.dim", [a, dim], {"keepdim": keep}, [shape, shape],
                  lambda v, e: list(torch.max(v[a], dim, keepdim=keep)), True)
        return True

    def _low(self, d: Dim) -> int:
        """A lower bound of a dim (every symbolic dim here is monotone in the symbols)."""
        return eval_dim(d, self.lower)

    def cat(self) -> bool:
        x = self.pick(lambda t: self.floats_(t) and t.rank >= 1)
        if x is None:
            return False
        dim = self.draw(st.integers(0, x.rank - 1))

        def fits(t: _TV) -> bool:
            return (self.floats_(t) and t.rank == x.rank
                    and all(dims_equal(a, b) for i, (a, b) in enumerate(zip(t.shape, x.shape))
                            if i != dim))

        cands = [t for t in self.pool if fits(t)]
        parts = [x] + self.draw(st.lists(st.sampled_from(cands), max_size=2))
        total = simplify_dim(sum((sympy.sympify(p.shape[dim]) for p in parts), sympy.Integer(0)))
        shape = x.shape[:dim] + (total,) + x.shape[dim + 1:]
        vals = [p.value for p in parts]
        neg = dim - x.rank if self.draw(st.booleans()) else dim
        self.emit("aten.cat.default", [vals], {"dim": neg}, [shape],
                  lambda v, e: [torch.cat([v[p] for p in vals], dim=neg)],
                  all(p.contiguous for p in parts))
        return True

    def view(self) -> bool:
        x = self.pick(lambda t: t.contiguous)
        if x is None:
            return False
        shape = list(x.shape)
        how = self.choice(["merge", "unsqueeze", "squeeze", "split", "same"])
        if how == "merge" and len(shape) >= 2:
            i = self.draw(st.integers(0, len(shape) - 2))
            shape[i:i + 2] = [simplify_dim(sympy.sympify(shape[i]) * shape[i + 1])]
        elif how == "unsqueeze":
            shape.insert(self.draw(st.integers(0, len(shape))), 1)
        elif how == "squeeze" and 1 in shape:
            shape.remove(1)
        elif how == "split":
            cands = [i for i, d in enumerate(shape) if isinstance(d, int) and d >= 2]
            if cands:
                i = self.choice(cands)
                n = shape[i]
                assert isinstance(n, int)
                k = self.choice([k for k in range(1, n + 1) if n % k == 0])
                shape[i:i + 1] = [k, n // k]
        sizes: list[Dim] = list(shape)
        a = x.value
        self.emit("aten.view.default", [a, sizes], {}, [tuple(sizes)],
                  lambda v, e: [v[a].view([eval_dim(d, e) for d in sizes])], True)
        return True

    def permute(self) -> bool:
        x = self.pick(lambda t: True)
        assert x is not None
        perm = self.draw(st.permutations(list(range(x.rank))))
        shape = tuple(x.shape[i] for i in perm)
        a = x.value
        self.emit("aten.permute.default", [a, perm], {}, [shape],
                  lambda v, e: [torch.permute(v[a], perm)],
                  x.contiguous and perm == sorted(perm))
        return True

    def where(self) -> bool:
        c = self.pick(lambda t: t.dtype is DType.b8)
        x = self.pick(self.floats_)
        if c is None or x is None or broadcast(c.shape, x.shape) is None:
            return False
        y = self.pick(lambda t: self.floats_(t) and broadcast(c.shape, x.shape, t.shape)
                      is not None)
        assert y is not None
        shape = broadcast(c.shape, x.shape, y.shape)
        assert shape is not None
        cv, a, b = c.value, x.value, y.value
        self.emit("aten.where.self", [cv, a, b], {}, [shape],
                  lambda v, e: [torch.where(v[cv], v[a], v[b])],
                  c.contiguous and x.contiguous and y.contiguous)
        return True

    def split(self) -> bool:
        def ok(t: _TV) -> bool:
            return any(isinstance(d, int) for d in t.shape)

        x = self.pick(ok)
        if x is None:
            return False
        dim = self.choice([i for i, d in enumerate(x.shape) if isinstance(d, int)])
        n = x.shape[dim]
        assert isinstance(n, int)
        k = self.draw(st.integers(max(1, -(-n // 4)), max(1, n + 1)))
        count = -(-n // k) if n > 0 else 1
        sizes = [min(k, n - i * k) for i in range(count)] if n > 0 else [0]
        shapes = [x.shape[:dim] + (s,) + x.shape[dim + 1:] for s in sizes]
        a = x.value
        args: list[Any] = [a, k]
        kw: dict[str, Any] = {}
        if self.draw(st.booleans()):
            kw["dim"] = dim
        else:
            args.append(dim)
        self.emit("aten.split.Tensor", args, kw, shapes,
                  lambda v, e: list(torch.split(v[a], k, dim)), x.contiguous and dim == 0)
        return True

    def to_copy(self) -> bool:
        x = self.pick(lambda t: True)
        assert x is not None
        dt = self.choice(FLOAT_DTYPES)
        op = "aten._to_copy.default"
        a, tdt = x.value, dt.torch
        self.emit(op, [a], {"dtype": dt}, [x.shape], lambda v, e: [v[a].to(dtype=tdt)],
                  x.contiguous)
        return True

    def full(self) -> bool:
        src = self.choice(self.pool)
        shape: list[Dim] = list(self.draw(st.lists(st.sampled_from(list(src.shape) + [1, 2, 0]),
                                                   max_size=3)))
        fill = self.draw(_SCALAR_FLOATS)
        dt = self.choice(FLOAT_DTYPES)
        tdt = dt.torch
        self.emit("aten.full.default", [shape, fill], {"dtype": dt}, [tuple(shape)],
                  lambda v, e: [torch.full([eval_dim(d, e) for d in shape], fill, dtype=tdt)],
                  True)
        return True

    def call(self) -> bool:
        if self.helper is None:
            return False
        g, ref = self.helper
        vals: list[Value] = []
        for p in g.params:
            t = p.type
            if isinstance(t, ScalarType):
                cands = [s for s in self.scalars if s.type == t]
                if not cands:
                    return False
                vals.append(self.choice(cands))
                continue
            # the helper was generated for contiguous parameters (it may `view` them)
            same = _same_type(t)
            tv = self.pick(lambda u, same=same: same(u) and u.contiguous)  # type: ignore[misc]
            if tv is None:
                return False
            vals.append(tv.value)
        shapes = []
        for t in g.result_types:
            assert isinstance(t, TensorType)
            shapes.append(t.shape)
        self.emit("graph.call", [Ref(g.name), *vals], {}, shapes,
                  lambda v, e: ref([v[x] for x in vals], e), False)
        return True

    def step(self) -> None:
        ops = [self.unary, self.binary, self.mul_scalar, self.clamp, self.sum_dims,
               self.max_dim, self.cat, self.view, self.permute, self.where, self.split,
               self.to_copy, self.full, self.call]
        for _ in range(4):
            if self.choice(ops)():
                return
        self.permute()  # always possible

    def update(self) -> tuple[int, Value] | None:
        """`%r = aten.add.Tensor(%p, %y, alpha=..)` with the type of parameter %p."""
        params = [i for i, p in enumerate(self.gb.params)
                  if isinstance(p.type, TensorType) and p.type.dtype in (DType.f32, DType.f64)]
        if not params:
            return None
        i = self.choice(params)
        p = self.gb.params[i]
        assert isinstance(p.type, TensorType)
        pshape, pdt = p.type.shape, p.type.dtype

        def ok(t: _TV) -> bool:
            s = broadcast(pshape, t.shape)
            return (s is not None and len(s) == len(pshape)
                    and all(dims_equal(a, b) for a, b in zip(s, pshape))
                    and torch.promote_types(pdt.torch, t.dtype.torch) == pdt.torch
                    and t.dtype in FLOAT_DTYPES)

        y = self.pick(ok)
        assert y is not None  # the parameter itself qualifies
        alpha = self.draw(_SCALAR_FLOATS)
        a, b = p, y.value
        out = self.emit("aten.add.Tensor", [a, b], {"alpha": alpha}, [pshape],
                        lambda v, e: [torch.add(v[a], v[b], alpha=alpha)], True)
        if out[0].dtype != pdt:
            return None
        return i, out[0].value

    def finish(self, updates: bool) -> tuple[Graph, Reference, list[tuple[int, int]]]:
        outs = self.draw(st.lists(st.sampled_from(self.pool), min_size=1, max_size=3,
                                  unique_by=lambda t: id(t.value)))
        outputs = [t.value for t in outs]
        pairs: list[tuple[int, int]] = []
        if updates:
            for _ in range(self.draw(st.integers(0, 2))):
                u = self.update()
                if u is not None and u[0] not in {p for p, _ in pairs}:
                    pairs.append((u[0], len(outputs)))
                    outputs.append(u[1])
        attrs: dict[str, Any] = {}
        if pairs:
            attrs["input_updates"] = [list(p) for p in pairs]
        if self.draw(st.booleans()):  # attributes other than input_updates change nothing
            attrs[self.draw(_NAMES)] = self.draw(_EXTRA_ATTR)
        g = self.gb.ret(outputs, attrs)
        return g, Reference(list(self.gb.params), self.steps, outputs), pairs


@st.composite
def _symbols(draw: st.DrawFn) -> list[Symbol]:
    syms = []
    for name in draw(st.lists(st.sampled_from(["s0", "s1", "s2", "s10"]), min_size=1,
                              max_size=2, unique=True)):
        lo = draw(st.integers(0, 2))
        mx = draw(st.one_of(st.none(), st.just(math.inf), st.integers(lo + 1, lo + 6)))
        hi = lo + 5 if mx is None or mx == math.inf else int(mx)
        low = lo if lo > 0 or draw(st.booleans()) else None
        syms.append(Symbol(name, draw(st.integers(lo, hi)), low, mx))
    return syms


def _sym_range(s: Symbol) -> tuple[int, int]:
    lo = s.min or 0
    hi = lo + 5 if s.max is None or s.max == math.inf else int(s.max)
    return lo, hi


@st.composite
def _param_types(draw: st.DrawFn, syms: Sequence[Symbol]) -> list[Type]:
    """Tensor parameters that broadcast against each other (suffixes of one base shape with
    some dims set to 1), every symbol bare in at least one of them, and maybe a dim like
    `s0 * 2` (bound by solving) and a scalar."""
    names_ = [symbol(s.name) for s in syms]
    solved = None  # a symbol that only appears as in `s0 * 2`: the interpreter solves for it
    if draw(st.booleans()):
        solved = draw(st.sampled_from(names_))
    bare = [s for s in names_ if s != solved]
    base: list[Dim] = list(draw(st.lists(st.one_of(st.integers(0, 4), st.sampled_from(bare))
                                         if bare else st.integers(0, 4),
                                         min_size=1, max_size=3)))
    for s in bare:
        if s not in base:
            base.insert(draw(st.integers(0, len(base))), s)
    out: list[Type] = [TensorType(draw(st.sampled_from([DType.f32, DType.f64])), tuple(base))]
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(0, len(base)))
        shape = tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in base[len(base) - k:])
        dt = draw(st.sampled_from([DType.f32, DType.f32, DType.f64, DType.b8, DType.f16]))
        out.append(TensorType(dt, shape))
    if solved is not None:
        d = draw(st.sampled_from([solved * 2, solved + 1, 3 * solved + 2]))
        out.append(TensorType(DType.f32, (d, 2)))
    if draw(st.booleans()):
        out.append(draw(st.sampled_from([F64, I64])))
    return draw(st.permutations(out))


@st.composite
def runnable_cases(draw: st.DrawFn, *, max_nodes: int = 8,
                   updates: bool = True) -> RunnableCase:
    """A module of real aten ops (maybe calling a helper graph), symbolic shapes included."""
    m = Module()
    syms = draw(_symbols())
    for s in syms:
        m.add_symbol(s)
    ptypes = draw(_param_types(syms))
    helper: tuple[Graph, Reference] | None = None
    if draw(st.booleans()):
        tensors = [t for t in ptypes if isinstance(t, TensorType)]
        hp = draw(st.lists(st.sampled_from(ptypes), max_size=1)) + [draw(st.sampled_from(tensors))]
        hgen = _GraphGen(draw, m, "helper", hp)
        for _ in range(draw(st.integers(0, 3))):
            hgen.step()
        hg, href, _ = hgen.finish(updates=False)
        helper = (hg, href)
    entry = draw(st.sampled_from(["main", "forward", "f"]))
    gen = _GraphGen(draw, m, entry, ptypes, helper)
    for _ in range(draw(st.integers(1, max_nodes))):
        gen.step()
    if helper is not None and not any(n.op == "graph.call" for n in gen.gb.nodes):
        gen.call()
    _, ref, pairs = gen.finish(updates=updates)
    return RunnableCase(m, entry, {s.name: _sym_range(s) for s in syms}, ref, pairs)


def make_input(t: Type, env: Mapping[str, int], gen: torch.Generator, special: float) -> Any:
    """A random input of type `t` at the given symbol sizes (NaN, inf and -0.0 sprinkled in)."""
    if isinstance(t, ScalarType):
        if t == F64:
            return float(SCALARS[int(torch.randint(len(SCALARS), (), generator=gen))])
        if t == I64:
            return int(torch.randint(-3, 4, (), generator=gen))
        return bool(torch.randint(2, (), generator=gen))
    shape = [eval_dim(d, env) for d in t.shape]
    if t.dtype is DType.b8:
        return torch.rand(shape, generator=gen) < 0.5
    if t.dtype is DType.i64:
        return torch.randint(-5, 6, shape, generator=gen)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    specials = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e30], dtype=torch.float64)
    mask = torch.rand(shape, generator=gen, dtype=torch.float64) < special
    pick = specials[torch.randint(len(specials), shape, generator=gen)]
    return torch.where(mask, pick, x).to(t.dtype.torch)


@st.composite
def case_inputs(draw: st.DrawFn,
                case: RunnableCase) -> tuple[dict[str, int], list[Any]]:
    """(symbol sizes, inputs) for a case's entry graph; sizes range over each symbol's range."""
    env = {s: draw(st.integers(lo, hi)) for s, (lo, hi) in case.ranges.items()}
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    special = draw(st.sampled_from([0.0, 0.1, 0.5]))
    return env, [make_input(p.type, env, gen, special) for p in case.graph.params]


def cases_with_inputs(**kw: Any) -> st.SearchStrategy[tuple[RunnableCase,
                                                          tuple[dict[str, int], list[Any]]]]:
    return runnable_cases(**kw).flatmap(lambda c: st.tuples(st.just(c), case_inputs(c)))


# ---- comparing results ---------------------------------------------------------------------


def same_value(a: Any, b: Any) -> bool:
    """Bitwise-equal results: same dtype and shape, NaN at the same places, -0.0 kept."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point:
            na, nb = torch.isnan(a), torch.isnan(b)
            if not torch.equal(na, nb):
                return False
            a, b = a.masked_fill(na, 0), b.masked_fill(nb, 0)
            return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))
        return torch.equal(a, b)
    if isinstance(a, float) and isinstance(b, float):
        return _float_key(a) == _float_key(b)
    return type(a) is type(b) and bool(a == b)


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
