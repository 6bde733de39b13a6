"""Hypothesis strategies for ember.ir's property tests: random well-formed modules.

Two families:

* `text_modules()`: modules that only need to parse and print. Any op names (registered or
  not: `foo.bar`), every literal kind (64-bit ints, every float class, strings with escapes,
  DType literals, expressions over symbols, nested lists, `@` refs), types with strides and
  devices, symbols, locs, graph attributes and kernel blocks.
* `runnable_cases()` (in `runnable_modules.py`): modules of real aten ops over tensors with
  symbolic shapes, each with a reference that calls the same torch ops directly.

Also `exprs()` (symbolic integer expressions built from the grammar's operations), `module_key()`
(a structural key: two modules are equal when their keys are).
"""

from __future__ import annotations

import math
import operator
import string
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sympy
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ember.ir import (
    BOOL,
    F64,
    I64,
    DType,
    FloorDiv,
    Graph,
    Kernel,
    Loc,
    Module,
    Node,
    PyMod,
    Ref,
    ScalarType,
    Symbol,
    TensorType,
    Type,
    Value,
    symbol,
)
from ember.ir.expr import INT64_MAX, INT64_MIN, Dim, simplify_dim
from ember.ir.parser import RESERVED
from ember.ir.printer import required_version

_T = TypeVar("_T")

# For tests over these (slow-to-draw) strategies: the loaded profile, minus the health checks
# that only measure drawing time or size (a busy machine trips them at random).
slow_draws = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_BOOLS = st.booleans()

# The example of docs/ir-spec.md, as the spec states it.
SPEC_EXAMPLE = """\
ember.ir 1.0

symbol s0 hint=8 min=2

graph @forward(%x: f32[s0, 64], %w: f32[128, 64], %b: f32[128]) -> (f32[s0, 128], f32[s0]) {
  %t = aten.t.default(%w) : f32[64, 128]
  %y = aten.addmm.default(%b, %x, %t) : f32[s0, 128] loc("model.py":12:9)
  %z = aten.relu.default(%y) : f32[s0, 128]
  %m, %i = aten.max.dim(%z, 1, keepdim=false) : (f32[s0], i64[s0])
  %c = aten.cat.default([%z, %z], dim=1) : f32[s0, 256]
  %s = aten.mul.Scalar(%c, -0.5) : f32[s0, 256]
  %v = aten.view.default(%s, [s0 * 2, 128]) : f32[s0 * 2, 128]
  return (%y, %m)
}

graph @step(%p: f32[4], %g: f32[4]) -> (f32[], f32[4]) attrs(input_updates=[[0, 1]]) {
  %p1 = aten.add.Tensor(%p, %g, alpha=-0.1) : f32[4]
  %l = aten.sum.default(%p1) : f32[]
  return (%l, %p1)
}
"""


# ---- names ---------------------------------------------------------------------------------
# Strategies are built once, at import: building them inside composites is what costs time.

_NAME_START = string.ascii_letters + "_"
_NAME_CHARS = _NAME_START + string.digits
_VALUE_CHARS = _NAME_CHARS + "."
RESERVED_WORDS: list[str] = sorted(RESERVED)

_NAMES: st.SearchStrategy[str] = st.one_of(
    st.builds(operator.add, st.sampled_from(_NAME_START), st.text(_NAME_CHARS, max_size=6)),
    st.sampled_from(RESERVED_WORDS + ["s0", "u1", "cpu", "loc_", "_"]),
)
_VALUE_NAMES: st.SearchStrategy[str] = st.one_of(
    st.text(_VALUE_CHARS, min_size=1, max_size=6),
    st.sampled_from(["0", "x", "x.1", "...", "_", "1e5", "inf", "s0", "graph"]),
)
_OP_NAMES: st.SearchStrategy[str] = st.one_of(
    st.lists(_NAMES, min_size=2, max_size=4).map(".".join),
    st.sampled_from(["aten.add.Tensor", "aten.max.dim", "graph.call", "prims.add", "kernels.k0",
                     "foo.bar", "mylib.op.default", "loop.for_"]),
)
_SYMBOL_NAMES: st.SearchStrategy[str] = st.one_of(
    st.integers(0, 30).map(lambda i: f"s{i}"),
    st.integers(0, 3).map(lambda i: f"u{i}"),  # unbacked (ir-v1.2): the header says 1.2
    st.sampled_from(["s007", "s00", "s123456789012345678901234567890"]),
)


def names() -> st.SearchStrategy[str]:
    """A NAME: graph, kernel, attribute and keyword names; reserved words included."""
    return _NAMES


def value_names() -> st.SearchStrategy[str]:
    """What follows `%`: `[A-Za-z0-9_.]+`."""
    return _VALUE_NAMES


def op_names() -> st.SearchStrategy[str]:
    """Dialect-qualified op names, real or not."""
    return _OP_NAMES


def symbol_names() -> st.SearchStrategy[str]:
    return _SYMBOL_NAMES


# ---- expressions ---------------------------------------------------------------------------

BOUNDARY_INTS: list[int] = [INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, 2**31, -(2**31),
                            2**32, 2**62, -(2**62)]

_EXPR_OPS: dict[str, Callable[[sympy.Expr, sympy.Expr], sympy.Expr]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": FloorDiv, "mod": PyMod,
    "max": sympy.Max, "min": sympy.Min,
}


def fits_int64(e: Dim) -> bool:
    """Every integer in `e` is a signed 64-bit one (what ir-v1 text can hold)."""
    if isinstance(e, int):
        return INT64_MIN <= e <= INT64_MAX
    return all(INT64_MIN <= int(n) <= INT64_MAX for n in e.atoms(sympy.Integer))


def _apply(op: str, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    try:
        return _EXPR_OPS[op](a, b)
    except ValueError:  # max/min of a constant division by zero: sympy cannot compare it
        return (sympy.Max if op == "max" else sympy.Min)(a, b, evaluate=False)


def _product(c: int, factors: list[sympy.Expr], square: bool) -> sympy.Expr:
    return sympy.Integer(c) * sympy.Mul(*factors) * (factors[0] if square else 1)


def raw_exprs(symbols: Sequence[str], *, big_ints: bool = False,
              max_leaves: int = 8) -> st.SearchStrategy[sympy.Expr]:
    """Sympy expressions built from the ir-v1 operations (+ - * // mod max min, unary -) over
    integer leaves and the given symbols. With `big_ints`, leaves include 64-bit boundary values,
    so results may overflow 64 bits (filter with `fits_int64`)."""
    ints = st.integers(-9, 9)
    if big_ints:
        ints = st.one_of(ints, st.sampled_from(BOUNDARY_INTS), st.integers(INT64_MIN, INT64_MAX))
    leaves: list[st.SearchStrategy[sympy.Expr]] = [ints.map(sympy.Integer)]
    if symbols:
        syms = st.sampled_from([symbol(s) for s in symbols])
        leaves += [syms, syms]
    leaf = st.one_of(*leaves)
    ops = st.sampled_from(sorted(_EXPR_OPS) + ["+", "-", "*"])

    def extend(children: st.SearchStrategy[sympy.Expr]) -> st.SearchStrategy[sympy.Expr]:
        binary = st.builds(_apply, ops, children, children)
        # products with a coefficient, squares: the shapes where printing has to be careful
        # (`-(a + b) * c`, `-(a + b) ** 2`), which plain binary trees seldom reach
        product = st.builds(_product, st.integers(-3, 3), st.lists(children, min_size=1,
                                                                    max_size=3), st.booleans())
        sums = st.builds(operator.add, children, children)
        negated = st.builds(_product, st.integers(-3, -1), st.lists(
            st.one_of(sums, children), min_size=1, max_size=3), st.booleans())
        return st.one_of(binary, binary, binary, children.map(operator.neg), product, negated)

    return st.recursive(leaf, extend, max_leaves=max_leaves)


def exprs(symbols: Sequence[str], *, max_leaves: int = 6) -> st.SearchStrategy[Dim]:
    """Dims/integer arguments as the IR holds them: a plain int, or an expression with symbols."""
    return raw_exprs(symbols, max_leaves=max_leaves).map(simplify_dim).filter(fits_int64)


# Text modules draw expressions over these placeholder symbols, then rename them to the
# module's declared symbols (`_Ctx.expr`).
_POOL = ["s0", "s1", "s2"]
_POOL_EXPRS = raw_exprs(_POOL, max_leaves=6)


# ---- literals and types ------------------------------------------------------------------

SPECIAL_FLOATS: list[float] = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1e-05,
                               2.5e16, 5e-324, -5e-324, 2.2250738585072014e-308,
                               1.7976931348623157e308, 0.1, -0.5, 1.0, 1e16, 123456789.125]
SPECIAL_STRINGS: list[str] = ["", '"', "\\", "\n", "\t\r\b\f", "\x00", "\x7f", "\u2028", "é",
                              "😀", "\udcff", "a\"b'c", "#not a comment", '"""',
                              "\\u0041", "line1\nline2", "tab\there", "/", "%x", "@g",
                              "ember.ir 1.0"]

_INT64S: st.SearchStrategy[int] = st.one_of(
    st.integers(-1000, 1000), st.sampled_from(BOUNDARY_INTS + [0, -1, 1]),
    st.integers(INT64_MIN, INT64_MAX))
_FLOATS: st.SearchStrategy[float] = st.one_of(
    st.floats(), st.sampled_from(SPECIAL_FLOATS),
    st.floats(allow_subnormal=True, max_value=1e-300, min_value=-1e-300))
# Lone surrogates, as `surrogateescape` makes them; not a high one right before a low one,
# which JSON reads back as one character (the printer refuses that).
_STRINGS: st.SearchStrategy[str] = st.one_of(
    st.text(max_size=10),
    st.sampled_from(SPECIAL_STRINGS),
    st.lists(st.sampled_from(SPECIAL_STRINGS), max_size=4).map("".join),
)
_DEVICES: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["cpu", "cpu", "cuda", "cuda:0", "cuda:1", "meta", "cpu:0"]),
    st.builds(lambda n, i: n if i is None else f"{n}:{i}", _NAMES,
              st.one_of(st.none(), st.integers(0, 8), st.just(INT64_MAX))),
)
_LINES = st.one_of(st.integers(0, 10_000), st.just(INT64_MAX))
_LOCS: st.SearchStrategy[Loc] = st.builds(
    Loc, st.one_of(_STRINGS, st.sampled_from(["model.py", "C:\\x\\y.py", "a b/c\"d.py", ""])),
    _LINES, st.one_of(st.none(), _LINES))
_DTYPES: st.SearchStrategy[DType] = st.sampled_from(list(DType))


def int64s() -> st.SearchStrategy[int]:
    return _INT64S


def floats() -> st.SearchStrategy[float]:
    return _FLOATS


def strings() -> st.SearchStrategy[str]:
    return _STRINGS


def devices() -> st.SearchStrategy[str]:
    return _DEVICES


def locs() -> st.SearchStrategy[Loc]:
    return _LOCS


@dataclass(frozen=True)
class _Slot:
    """A placeholder in a drawn argument: the i-th value in scope, or a ref to the i-th item."""

    kind: str  # "value" | "ref"
    i: int


_DIMS: st.SearchStrategy[Dim | sympy.Expr] = st.one_of(
    st.integers(0, 16), st.integers(0, INT64_MAX), _POOL_EXPRS)


@st.composite
def _raw_tensor_types(draw: st.DrawFn) -> tuple[DType, list[Any], list[Any] | None, str]:
    shape = draw(st.lists(_DIMS, max_size=4))
    strides = None
    if len(shape) > 0 and draw(_BOOLS):  # `{}` is not in the grammar: ranks >= 1 only
        strides = [draw(_DIMS) for _ in shape]
    return draw(_DTYPES), shape, strides, draw(_DEVICES)


_RAW_TYPES: st.SearchStrategy[Any] = st.one_of(st.sampled_from([I64, F64, BOOL]),
                                               _raw_tensor_types())
_LITERALS: st.SearchStrategy[Any] = st.one_of(
    _INT64S, _FLOATS, _STRINGS, st.booleans(), st.none(), _DTYPES, _POOL_EXPRS,
    st.builds(_Slot, st.just("ref"), st.integers(0, 7)), _NAMES.map(Ref),
)
_ATTR_VALUES: st.SearchStrategy[Any] = st.recursive(
    _LITERALS, lambda c: st.lists(c, max_size=3), max_leaves=6)
_ARGS: st.SearchStrategy[Any] = st.recursive(
    st.one_of(_LITERALS, st.builds(_Slot, st.just("value"), st.integers(0, 15))),
    lambda c: st.lists(c, max_size=4), max_leaves=8)


class _Ctx:
    """Resolves drawn placeholders against one module: symbols, items and values in scope."""

    def __init__(self, symbols: Sequence[str], item_names: Sequence[str]):
        self.symbols = [symbol(s) for s in symbols]
        self.item_names = list(item_names)
        self.scope: list[Value] = []

    def expr(self, e: Any) -> Any:
        if not isinstance(e, sympy.Expr):
            return e
        sub = {symbol(p): (self.symbols[i % len(self.symbols)] if self.symbols else
                           sympy.Integer(i + 2)) for i, p in enumerate(_POOL)}
        try:
            d = simplify_dim(e.xreplace(sub))
        except ValueError:  # max/min over a constant division by zero, once symbols are ints
            return 0
        return d if fits_int64(d) else 0

    def arg(self, a: Any) -> Any:
        if isinstance(a, list):
            return [self.arg(x) for x in a]
        if isinstance(a, _Slot):
            if a.kind == "value" and self.scope:
                return self.scope[a.i % len(self.scope)]
            if a.kind == "ref" and self.item_names:
                return Ref(self.item_names[a.i % len(self.item_names)])
            return None
        return self.expr(a)

    def type(self, t: Any) -> Type:
        if isinstance(t, ScalarType):
            return t
        dtype, shape, strides, device = t
        return TensorType(dtype, tuple(self.expr(d) for d in shape),
                          None if strides is None else tuple(self.expr(d) for d in strides),
                          device)


def tensor_types(symbols: Sequence[str]) -> st.SearchStrategy[TensorType]:
    ctx = _Ctx(symbols, [])
    return _raw_tensor_types().map(ctx.type)  # type: ignore[arg-type]


def literals(symbols: Sequence[str], item_names: Sequence[str]) -> st.SearchStrategy[Any]:
    """Every literal kind of ir-v1, and `@` refs (to the module's items or dangling)."""
    return _LITERALS.map(_Ctx(symbols, item_names).arg)


# ---- text modules ------------------------------------------------------------------------


def _graph(draw: st.DrawFn, name: str, ctx: _Ctx) -> Graph:
    taken: set[str] = set()

    def fresh() -> str:
        n = draw(_VALUE_NAMES)
        while n in taken:
            n += "_"
        taken.add(n)
        return n

    ctx.scope = []
    params = [Value(fresh(), ctx.type(draw(_RAW_TYPES))) for _ in range(draw(st.integers(0, 4)))]
    ctx.scope += params
    nodes: list[Node] = []
    for _ in range(draw(st.integers(0, 5))):
        node = Node(draw(_OP_NAMES), ctx.arg(draw(st.lists(_ARGS, max_size=4))),
                    {k: ctx.arg(v) for k, v in draw(st.dictionaries(_NAMES, _ARGS,
                                                                    max_size=3)).items()},
                    [], draw(st.one_of(st.none(), _LOCS)))
        for i in range(draw(st.integers(1, 3))):
            node.results.append(Value(fresh(), ctx.type(draw(_RAW_TYPES)), node, i))
        nodes.append(node)
        ctx.scope += node.results
    outputs = [ctx.scope[i % len(ctx.scope)] for i in draw(st.lists(st.integers(0, 15),
                                                                    max_size=3))] \
        if ctx.scope else []
    attrs: dict[str, Any] = {k: ctx.arg(v) for k, v in
                             draw(st.dictionaries(_NAMES, _ATTR_VALUES, max_size=3)).items()}
    if len(params) > 0 and len(outputs) > 0 and draw(_BOOLS):
        attrs["input_updates"] = [[draw(st.integers(0, len(params) - 1)),
                                   draw(st.integers(0, len(outputs) - 1))]]
    return Graph(name, params, [o.type for o in outputs], nodes, outputs, attrs)


def _clean_kernel(s: str) -> str:
    while '"""' in s:
        s = s.replace('"""', '""')
    return s


_KERNEL_PIECES = st.sampled_from(['"', '""', "'", "#", "#include <cstdint>\n", "\n", "\\", "{",
                                  "}", "// c\n", "x = \"s\";", "é😀", "\x00", " ", "\t", "\r\n"])
_KERNEL_SOURCES: st.SearchStrategy[str] = st.one_of(
    st.text(max_size=30),
    st.lists(st.one_of(_KERNEL_PIECES, st.text(max_size=5)), max_size=8).map("".join),
).map(_clean_kernel)


def kernel_sources() -> st.SearchStrategy[str]:
    """Kernel text: anything without `\"\"\"` (quotes, `#`, newlines, unicode included)."""
    return _KERNEL_SOURCES


_MAYBE_INT = st.one_of(st.none(), st.integers(0, 64), st.just(INT64_MAX))
_SYMBOL_MAX = st.one_of(st.none(), st.just(math.inf), st.integers(0, 64), st.just(INT64_MAX))


@st.composite
def text_modules(draw: st.DrawFn) -> Module:
    """A module for parse/print: random op names, any literals, types, symbols, kernels."""
    m = Module(version=(1, draw(st.integers(0, 99))))
    for s in draw(st.lists(_SYMBOL_NAMES, unique=True, max_size=4)):
        m.add_symbol(Symbol(s, draw(_MAYBE_INT), draw(_MAYBE_INT), draw(_SYMBOL_MAX)))
    item_names = draw(st.lists(_NAMES, unique=True, max_size=4))
    ctx = _Ctx(list(m.symbols), item_names)
    for n in item_names:
        if draw(st.integers(0, 3)) == 0:
            m.add(Kernel(n, draw(_NAMES), draw(_KERNEL_SOURCES)))
        else:
            m.add(_graph(draw, n, ctx))
    # the printer raises the header to the version the content needs (an unbacked u-symbol is
    # ember.ir 1.2): the module a text stands for carries that version
    m.version = max(m.version, required_version(m))
    return m


# ---- structural equality -------------------------------------------------------------------


def _float_key(x: float) -> tuple[str, Any]:
    if math.isnan(x):  # the text keeps a NaN's sign, not its payload
        return ("nan", math.copysign(1.0, x) < 0)
    return ("float", struct.pack(">d", x))


def dim_key(d: Dim) -> tuple[str, Any]:
    return ("int", d) if isinstance(d, int) else ("expr", d)


def type_key(t: Type) -> Any:
    if isinstance(t, ScalarType):
        return ("scalar", t.kind.value)
    strides = None if t.strides is None else tuple(dim_key(d) for d in t.strides)
    return ("tensor", t.dtype, tuple(dim_key(d) for d in t.shape), strides, t.device)


def arg_key(a: Any) -> Any:
    if isinstance(a, Value):
        return ("value", a.name)
    if isinstance(a, Ref):
        return ("ref", a.name)
    if a is None or isinstance(a, bool):
        return ("lit", a)
    if isinstance(a, int):
        return ("int", a)
    if isinstance(a, float):
        return _float_key(a)
    if isinstance(a, str):
        return ("str", a)
    if isinstance(a, DType):
        return ("dtype", a.name)
    if isinstance(a, list):
        return ("list", tuple(arg_key(x) for x in a))
    if isinstance(a, sympy.Expr):
        return ("expr", a)
    raise TypeError(f"not an argument: {a!r}")


def module_key(m: Module) -> Any:
    """Everything the text format carries, as nested tuples: equal keys, equal modules."""
    syms = tuple((s.name, s.hint, s.min, s.max) for s in m.symbols.values())
    items: list[Any] = []
    for name, item in m.items.items():
        if isinstance(item, Kernel):
            items.append(("kernel", name, item.name, item.lang, item.source))
            continue
        nodes = tuple(
            (n.op, tuple(arg_key(a) for a in n.args),
             tuple((k, arg_key(v)) for k, v in n.kwargs.items()),
             tuple((r.name, type_key(r.type)) for r in n.results), n.loc)
            for n in item.nodes)
        items.append(("graph", name, item.name,
                      tuple((p.name, type_key(p.type)) for p in item.params),
                      tuple(type_key(t) for t in item.result_types), nodes,
                      tuple(o.name for o in item.outputs),
                      tuple((k, arg_key(v)) for k, v in item.attrs.items())))
    return (m.version, syms, tuple(items))
