"""The in-memory IR: values, nodes, graphs, kernels, symbols and modules.

A `Module` holds declared size symbols and, in one `@`-namespace, graphs and kernel blocks, in
order. A `Graph` is SSA: parameters, then nodes in order, then a return. Values are compared by
identity; names are only for printing and must be unique within a graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import sympy

from ember.ir.dtypes import DType
from ember.ir.expr import Dim
from ember.ir.types import Type

IR_VERSION: tuple[int, int] = (1, 0)  # what a new module prints, unless it needs more
# 1.1 added loop variables in expressions (`index=[i0, r0 * 4]`) and body domains
# (`domain(i0 < 4, r0 < 8)`); the printer writes 1.1 exactly when a module uses them.
LOOP_VARS_VERSION: tuple[int, int] = (1, 1)
# 1.2 added unbacked symbols `u0`: sizes read from a tensor's data (`.item()`), bound inside a
# graph by `graph.bind_symbol(%t, u0)` instead of by an input's shape.
UNBACKED_VERSION: tuple[int, int] = (1, 2)
IR_LATEST: tuple[int, int] = UNBACKED_VERSION  # the newest minor this reader knows


BIND_SYMBOL = "graph.bind_symbol"  # `%n = graph.bind_symbol(%t, u0) : i64` (1.2)


def is_unbacked(name: str) -> bool:
    """`u<digits>`: a symbol bound by a graph.bind_symbol node (ir-v1.2), not by an input."""
    return name[:1] == "u" and name[1:].isdigit()


@dataclass(frozen=True)
class Loc:
    """A source location: file, line, optional column."""

    file: str
    line: int
    col: int | None = None


@dataclass(frozen=True)
class Ref:
    """`@name`: a reference to a graph or kernel of the same module."""

    name: str


@dataclass(frozen=True)
class Pos:
    """Where an item was read from text (line and column, 1-based), for error messages."""

    line: int
    col: int


class Value:
    """An SSA value: a graph parameter or a node result."""

    __slots__ = ("name", "type", "node", "index")

    def __init__(self, name: str, type: Type, node: Node | None = None, index: int = 0):
        self.name = name
        self.type = type
        self.node = node
        self.index = index

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


# An argument: a value, a reference, a literal, or a (nested) list of those.
Arg: TypeAlias = Value | Ref | int | float | bool | None | str | DType | sympy.Expr | list["Arg"]


@dataclass(eq=False)
class Node:
    """One operation: `%r0, %r1 = op(args, kw=...) : types loc(...)`."""

    op: str
    args: list[Arg]
    kwargs: dict[str, Arg]
    results: list[Value]
    loc: Loc | None = None
    pos: Pos | None = None
    # Where argument expressions and strings were read from: keyed by the path to them, e.g.
    # ("index", 1) for the second entry of `index=[...]`, (0,) for the first positional one.
    arg_pos: dict[tuple[str | int, ...], Pos] | None = None

    @property
    def result_types(self) -> list[Type]:
        return [r.type for r in self.results]

    def operands(self) -> Iterator[Value]:
        """Every Value among the arguments, in order, nested lists included."""
        yield from iter_values(self.args)
        yield from iter_values(list(self.kwargs.values()))

    def refs(self) -> Iterator[Ref]:
        yield from (a for a in _flatten(self.args) if isinstance(a, Ref))
        yield from (a for a in _flatten(list(self.kwargs.values())) if isinstance(a, Ref))


def _flatten(args: Sequence[Arg]) -> Iterator[Arg]:
    for a in args:
        if isinstance(a, list):
            yield from _flatten(a)
        else:
            yield a


def iter_values(args: Sequence[Arg]) -> Iterator[Value]:
    return (a for a in _flatten(args) if isinstance(a, Value))


def map_args(args: Arg, fn: Callable[[Value], Value]) -> Arg:
    """Rebuild an argument with every Value replaced by `fn(value)`."""
    if isinstance(args, Value):
        return fn(args)
    if isinstance(args, list):
        return [map_args(a, fn) for a in args]
    return args


@dataclass(eq=False)
class Graph:
    name: str
    params: list[Value]
    result_types: list[Type]
    nodes: list[Node]
    outputs: list[Value]
    attrs: dict[str, Arg] = field(default_factory=dict)
    pos: Pos | None = None
    # ir-v1.1: a kernel body's loops, `{"i0": 4, "i1": s0, "r0": 8}` (each variable ranges over
    # [0, extent)); None where the graph declares none (every graph of a 1.0 text).
    domain: dict[str, Dim] | None = None

    @property
    def input_updates(self) -> list[tuple[int, int]]:
        """Pairs (parameter index, result index) from `attrs(input_updates=...)`."""
        raw = self.attrs.get("input_updates")
        if not isinstance(raw, list):
            return []
        return [(int(p[0]), int(p[1])) for p in raw if isinstance(p, list) and len(p) == 2
                and isinstance(p[0], int) and isinstance(p[1], int)]

    def clone(self) -> Graph:
        """A copy with fresh Values and Nodes (args that are not values are shared: immutable)."""
        vmap: dict[Value, Value] = {}

        def sub(v: Value) -> Value:
            return vmap[v] if v in vmap else v

        params = []
        for p in self.params:
            q = Value(p.name, p.type)
            vmap[p] = q
            params.append(q)
        nodes = []
        for n in self.nodes:
            m = Node(n.op, [map_args(a, sub) for a in n.args],
                     {k: map_args(a, sub) for k, a in n.kwargs.items()}, [], n.loc, n.pos,
                     n.arg_pos)
            for i, r in enumerate(n.results):
                q = Value(r.name, r.type, m, i)
                vmap[r] = q
                m.results.append(q)
            nodes.append(m)
        return Graph(self.name, params, list(self.result_types), nodes,
                     [sub(o) for o in self.outputs], _copy_arg_dict(self.attrs), self.pos,
                     None if self.domain is None else dict(self.domain))

    def values(self) -> Iterator[Value]:
        yield from self.params
        for n in self.nodes:
            yield from n.results

    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {v: [] for v in self.values()}
        for n in self.nodes:
            for v in n.operands():
                out.setdefault(v, []).append(n)
        return out


def value_names(g: Graph) -> set[str]:
    """The value names g uses (params and results): what a rewrite's new names must avoid."""
    return {v.name for v in g.values()}


def fresh_name(base: str, taken: set[str], sep: str = ".") -> str:
    """`base`, or `base<sep>k` for the first k >= 1 not in `taken`; recorded in `taken`.
    The one naming rule of the graph rewrites (layout, conv, pool, the CUDA passes)."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{sep}{k}"
    taken.add(name)
    return name


def _copy_arg_dict(d: dict[str, Arg]) -> dict[str, Arg]:
    return {k: map_args(v, lambda x: x) for k, v in d.items()}


@dataclass(eq=False)
class Kernel:
    """A kernel block: compiled code travelling with the module, e.g. `kernel @k0 cpp \"\"\"...\"\"\"`."""

    name: str
    lang: str
    source: str
    pos: Pos | None = None


@dataclass(eq=False)
class Symbol:
    """A declared size symbol: `symbol s0 hint=8 min=2 max=inf`."""

    name: str
    hint: int | None = None
    min: int | None = None
    max: int | float | None = None  # an int, math.inf, or None when not stated

    def __post_init__(self) -> None:
        if isinstance(self.max, float) and self.max != math.inf:
            raise ValueError("a symbol's max is an int or inf")


@dataclass(eq=False)
class Module:
    """An ir-v1 module: symbols, then graphs and kernels in one ordered namespace."""

    symbols: dict[str, Symbol] = field(default_factory=dict)
    items: dict[str, Graph | Kernel] = field(default_factory=dict)
    version: tuple[int, int] = IR_VERSION

    @property
    def graphs(self) -> dict[str, Graph]:
        return {k: v for k, v in self.items.items() if isinstance(v, Graph)}

    @property
    def kernels(self) -> dict[str, Kernel]:
        return {k: v for k, v in self.items.items() if isinstance(v, Kernel)}

    def graph(self, name: str | None = None) -> Graph:
        """The graph called `name`, or the module's first graph."""
        graphs = self.graphs
        if name is None:
            if not graphs:
                raise KeyError("the module has no graph")
            return next(iter(graphs.values()))
        if name not in graphs:
            raise KeyError(f"no graph @{name} (graphs: {', '.join('@' + g for g in graphs)})")
        return graphs[name]

    def add(self, item: Graph | Kernel) -> None:
        if item.name in self.items:
            raise ValueError(f"@{item.name} is already defined in this module")
        self.items[item.name] = item

    def add_symbol(self, sym: Symbol) -> None:
        if sym.name in self.symbols:
            raise ValueError(f"symbol {sym.name} is already declared")
        self.symbols[sym.name] = sym

    def hints(self) -> dict[str, int]:
        """Each symbol's hint (symbols without one are left out)."""
        return {s.name: s.hint for s in self.symbols.values() if s.hint is not None}

    def clone(self) -> Module:
        items: dict[str, Graph | Kernel] = {}
        for k, v in self.items.items():
            items[k] = v.clone() if isinstance(v, Graph) else Kernel(v.name, v.lang, v.source, v.pos)
        syms = {k: Symbol(s.name, s.hint, s.min, s.max) for k, s in self.symbols.items()}
        return Module(syms, items, self.version)

    def __str__(self) -> str:
        from ember.ir.printer import print_module

        return print_module(self)

