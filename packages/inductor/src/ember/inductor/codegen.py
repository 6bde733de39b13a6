"""What the targets' code generation passes (`codegen-cpp`, targets/cpu/codegen.py;
`codegen-triton`, targets/cuda/codegen.py) share: the walk over a module's graphs (bodies
left out, parameters retyped as row-major buffers), the extern and view nodes as
`kernels.extern` / `kernels.view`, a loop node as its `kernels.call`, a kernel the target
cannot express kept on the reference interpreter with its fused reductions' bodies, and the
output module of kernel blocks, graphs and those bodies."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ember.inductor.body import body_names
from ember.inductor.kernels import VIEW_EXTERNS, _view_infer, buffer_type
from ember.ir import (
    Arg,
    Graph,
    InferContext,
    Kernel,
    Module,
    Node,
    Ref,
    TensorType,
    Value,
    default_registry,
)
from ember.ir.expr import symbol


def retyped(v: Value) -> Value:
    """`v` with its tensor type as a row-major buffer's (in place)."""
    if isinstance(v.type, TensorType):
        v.type = buffer_type(v.type)
    return v


def node_for(op: str, args: Sequence[Arg], kwargs: Mapping[str, Arg], n: Node,
             results: list[Value]) -> Node:
    """A node of `op` in `n`'s place (its location), producing `results`."""
    new = Node(op, list(args), dict(kwargs), results, n.loc, n.pos)
    for r in results:
        r.node = new
    return new


def extern_node(m: Module, n: Node) -> Node | None:
    """`loop.extern` as `kernels.view` (a strided view of a buffer, typed with its strides) or
    `kernels.extern` (the op's own implementation on buffers); None for any other node."""
    if n.op != "loop.extern":
        return None
    if n.kwargs.get("op") in VIEW_EXTERNS:
        ctx = InferContext(module=m, registry=default_registry())
        for r, t in zip(n.results, _view_infer(ctx, n.args, n.kwargs), strict=True):
            r.type = t
        return node_for("kernels.view", n.args, n.kwargs, n, list(n.results))
    return node_for("kernels.extern", n.args, n.kwargs, n, [retyped(r) for r in n.results])


def kernel_body(m: Module, n: Node) -> Graph | None:
    """The body of a loop kernel node (`loop.pointwise`, `loop.reduction`); None for any other
    node (it stays as it is)."""
    if n.op not in ("loop.pointwise", "loop.reduction"):
        return None
    ref = n.args[0]
    assert isinstance(ref, Ref)
    body = m.items[ref.name]
    assert isinstance(body, Graph)
    return body


def kernel_name(body: Graph, kernels: Sequence[Kernel]) -> str:
    """A name for the kernel of `body`: the body's, unless a kernel made so far has it (two loop
    nodes may share one body)."""
    name = body.name
    while any(k.name == name for k in kernels):
        name += "_"
    return name


def call_node(n: Node, name: str, args: Sequence[Arg], sizes: Sequence[str] = (),
              extra: Mapping[str, Arg] | None = None) -> Node:
    """`n` as `kernels.call(@name, args...)`: its results' dtypes and shapes, the size symbols
    `sizes` the kernel takes after its buffers (kernels.call's ABI), then `extra` attributes."""
    types = [r.type for r in n.results]
    assert all(isinstance(t, TensorType) for t in types)
    kw: dict[str, Arg] = {"out_dtypes": [t.dtype for t in types],  # type: ignore[union-attr]
                          "out_shapes": [list(t.shape) for t in types]}  # type: ignore[union-attr]
    if sizes:
        kw["sizes"] = [symbol(s) for s in sizes]
    kw.update(extra or {})
    return node_for("kernels.call", [Ref(name), *args], kw, n, [retyped(r) for r in n.results])


def keep_on_reference(m: Module, body: Graph, fallback: list[Graph]) -> None:
    """Add `body` and the bodies of its fused reductions (nested too) to `fallback`: the
    bodies of a loop node left to the reference interpreter."""
    fallback.append(body)
    stack = [body]
    while stack:
        for bn in stack.pop().nodes:
            sub = m.items.get(bn.args[0].name) if bn.op == "loop.reduce" \
                and isinstance(bn.args[0], Ref) else None
            if isinstance(sub, Graph) and sub not in fallback:
                fallback.append(sub)
                stack.append(sub)


def lower_graphs(src: Module, lower: Callable[[Graph], list[Node]]) -> list[Graph]:
    """Each graph of `src` but the kernel bodies, its parameters retyped as buffers and its
    nodes replaced by `lower(graph)`."""
    bodies = body_names(src)
    graphs: list[Graph] = []
    for g in src.graphs.values():
        if g.name in bodies:
            continue
        for p in g.params:
            retyped(p)
        g.nodes = lower(g)
        g.result_types = [o.type for o in g.outputs]
        graphs.append(g)
    return graphs


def assemble(src: Module, kernels: Sequence[Kernel], graphs: Sequence[Graph],
             fallback: Sequence[Graph]) -> Module:
    """The generated module: `kernels`, then `src`'s own kernel blocks, the lowered `graphs`
    and the `fallback` bodies (each name once)."""
    out = Module(src.symbols, {}, src.version)
    for k in kernels:
        out.add(k)
    items: list[Graph | Kernel] = [*src.kernels.values(), *graphs, *fallback]
    for item in items:
        if item.name not in out.items:
            out.add(item)
    return out


__all__ = ["assemble", "call_node", "extern_node", "keep_on_reference", "kernel_body",
           "kernel_name", "lower_graphs", "node_for", "retyped"]
