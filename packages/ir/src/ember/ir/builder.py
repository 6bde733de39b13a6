"""The builder: how passes, decompositions and capture emit nodes.

`Builder` appends nodes to a node list with fresh value names and result types from the op's
type rule (or given explicitly). `GraphBuilder` makes a whole graph and adds it to a module.

    m = Module()
    gb = GraphBuilder(m, "forward")
    x = gb.param("x", TensorType(DType.f32, (4, 8)))
    y = gb.op("aten.relu.default", [x])
    gb.ret([y])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ember.ir.graph import Arg, Graph, Loc, Module, Node, Value
from ember.ir.registry import InferContext, OpRegistry, OpTypeError, default_registry
from ember.ir.types import Type


class BuildError(ValueError):
    """An op could not be emitted: unknown, or its arguments break its type rule."""


class Builder:
    """Emits nodes into `nodes`, naming results uniquely among `taken`."""

    def __init__(self, module: Module, nodes: list[Node] | None = None, *,
                 taken: Iterable[str] = (), registry: OpRegistry | None = None,
                 loc: Loc | None = None):
        self.module = module
        self.nodes: list[Node] = nodes if nodes is not None else []
        self.taken: set[str] = set(taken)
        self.registry = registry or default_registry()
        self.loc = loc  # provenance stamped on emitted nodes (e.g. the node being decomposed)
        self._counter = 0

    def fresh(self, hint: str | None = None) -> str:
        if hint is not None and hint not in self.taken:
            self.taken.add(hint)
            return hint
        while True:
            name = f"{hint}.{self._counter}" if hint else str(self._counter)
            self._counter += 1
            if name not in self.taken:
                self.taken.add(name)
                return name

    def infer(self, op: str, args: Sequence[Arg], kwargs: Mapping[str, Arg]) -> list[Type]:
        opdef = self.registry.lookup(op)
        if opdef is None:
            raise BuildError(f"unknown op {op}: not registered and not a torch operator")
        ctx = InferContext(self.module, self.module.hints(), self.registry)
        try:
            return opdef.infer(ctx, args, kwargs)
        except OpTypeError as e:
            raise BuildError(str(e)) from None

    def emit(self, op: str, args: Sequence[Arg] = (), kwargs: Mapping[str, Arg] | None = None,
             *, types: Sequence[Type] | None = None, names: Sequence[str] | None = None,
             loc: Loc | None = None) -> list[Value]:
        """Append `op(args, kwargs)` and return its result values."""
        kwargs = dict(kwargs or {})
        rtypes = list(types) if types is not None else self.infer(op, args, kwargs)
        if not rtypes:
            raise BuildError(f"{op} has no results, which ir-v1 cannot express")
        node = Node(op, list(args), kwargs, [], loc or self.loc)
        for i, t in enumerate(rtypes):
            hint = names[i] if names is not None and i < len(names) else None
            node.results.append(Value(self.fresh(hint), t, node, i))
        self.nodes.append(node)
        return node.results

    def op(self, op: str, args: Sequence[Arg] = (), kwargs: Mapping[str, Arg] | None = None,
           *, type: Type | None = None, name: str | None = None, loc: Loc | None = None) -> Value:
        """Append a single-result op and return its value."""
        res = self.emit(op, args, kwargs, types=None if type is None else [type],
                        names=None if name is None else [name], loc=loc)
        if len(res) != 1:
            raise BuildError(f"{op} has {len(res)} results; use emit()")
        return res[0]


class GraphBuilder(Builder):
    """Builds one graph: parameters, nodes, then `ret()` adds it to the module."""

    def __init__(self, module: Module, name: str, *, registry: OpRegistry | None = None):
        super().__init__(module, registry=registry)
        self.name = name
        self.params: list[Value] = []

    def param(self, name: str | None, type: Type) -> Value:
        v = Value(self.fresh(name or "arg"), type)
        self.params.append(v)
        return v

    def ret(self, outputs: Sequence[Value], attrs: Mapping[str, Arg] | None = None) -> Graph:
        g = Graph(self.name, list(self.params), [o.type for o in outputs], self.nodes,
                  list(outputs), dict(attrs or {}))
        self.module.add(g)
        return g
