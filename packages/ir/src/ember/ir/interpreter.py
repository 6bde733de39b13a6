"""The reference interpreter: runs any graph of a module on torch tensors, op by op.

Symbols are bound from the input shapes, `graph.call` runs the callee, and results named in
`input_updates` are written back into the corresponding inputs (when asked) instead of being
returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from ember.ir.expr import (
    Dim,
    ExprEvalError,
    evaluate,
    free_symbol_names,
    loop_var_names,
    to_text,
)
from ember.ir.graph import BIND_SYMBOL, Arg, Graph, Module, Node, Ref, Symbol, Value
from ember.ir.registry import OpRegistry, default_registry
from ember.ir.types import ScalarKind, ScalarType, TensorType, Type


class InterpretError(RuntimeError):
    """A graph could not be run: bad inputs, an unknown op, or a result that breaks its type.

    Errors of the IR itself only: an exception an op raises on its data (an out-of-range
    index, an integer division by zero) propagates as the op raised it, as in eager PyTorch,
    with a note naming the node (see `failed_node`).
    """

    def __init__(self, message: str, node: Node | None = None):
        where = ""
        if node is not None and node.pos is not None:
            where = f"{node.pos.line}:{node.pos.col}: "
        super().__init__(where + message)
        self.node = node


@dataclass
class RunResult:
    """What a graph call produced: the caller's outputs, and the written-back parameters."""

    outputs: list[Any]
    updates: dict[int, Any] = field(default_factory=dict)  # parameter index -> new value
    env: dict[str, int] = field(default_factory=dict)  # symbol bindings


def failed_node(e: BaseException) -> Node | None:
    """The innermost node whose op raised `e` (None if no op did: the error is not data's)."""
    node = e.node if isinstance(e, InterpretError) else getattr(e, _NODE_ATTR, None)
    return node if isinstance(node, Node) else None


_NODE_ATTR = "_ember_ir_node"


def _where(node: Node) -> str:
    at = f" at line {node.pos.line}:{node.pos.col}" if node.pos is not None else ""
    if node.loc is not None:
        col = f":{node.loc.col}" if node.loc.col is not None else ""
        at += f" (loc {node.loc.file!r}:{node.loc.line}{col})"
    return f"ember.ir: raised by {node.op}{at}"


def bind_symbols(graph: Graph, inputs: Sequence[Any],
                 symbols: Mapping[str, Symbol] | None = None) -> dict[str, int]:
    """Bind the graph's size symbols from the actual input shapes, and check every dim (and,
    given the module's `symbols`, that each binding lies in its declared [min, max])."""
    if len(inputs) != len(graph.params):
        raise InterpretError(f"@{graph.name} takes {len(graph.params)} inputs, got {len(inputs)}")
    env: dict[str, int] = {}
    pending: list[tuple[Value, int, Dim, int]] = []
    for p, x in zip(graph.params, inputs, strict=True):
        _check_input_kind(p, x)
        if not isinstance(p.type, TensorType):
            continue
        for i, (d, n) in enumerate(zip(p.type.shape, x.shape, strict=True)):
            if isinstance(d, sympy.Symbol):
                if env.setdefault(d.name, int(n)) != int(n):
                    raise InterpretError(
                        f"input %{p.name}: dim {i} is {n} but {d.name} is already {env[d.name]}")
            elif isinstance(d, int):
                if d != int(n):
                    raise InterpretError(f"input %{p.name}: dim {i} is {n}, expected {d}")
            else:
                pending.append((p, i, d, int(n)))
    # Dims like `s0 * 2` bind s0 when it appears nowhere bare: solve the linear case.
    for _p, _i, d, n in pending:
        unbound = free_symbol_names(d) - env.keys()
        if len(unbound) == 1:
            _solve_linear(d, unbound.pop(), n, env)
    for p, i, d, n in pending:
        try:
            v = evaluate(d, env)
        except ExprEvalError as e:
            raise InterpretError(f"input %{p.name}: dim {i} is {n}, and no binding of "
                                 f"{', '.join(sorted(free_symbol_names(d) - env.keys()))} "
                                 f"makes {to_text(d)} equal to it ({e})") from None
        if v != n:
            raise InterpretError(f"input %{p.name}: dim {i} is {n}, expected {d} = {v}")
    for name, v in env.items():
        sym = (symbols or {}).get(name)
        if sym is not None and not _in_range(sym, v):
            hi = "inf" if sym.max is None else sym.max
            raise InterpretError(f"symbol {name} is bound to {v} by the inputs, outside its "
                                 f"declared range [{sym.min or 0}, {hi}]")
    return env


def _in_range(sym: Symbol, v: int) -> bool:
    return (sym.min is None or v >= sym.min) and (sym.max is None or v <= sym.max)


def _solve_linear(d: Dim, name: str, n: int, env: dict[str, int]) -> None:
    s = next(x for x in d.free_symbols if x.name == name)  # type: ignore[union-attr]
    e = d.subs({sym: env[sym.name] for sym in d.free_symbols if sym.name in env})  # type: ignore
    a, b = e.coeff(s, 1), e.coeff(s, 0)
    if e.is_Add or e.is_Mul:
        if (a * s + b - e).expand() == 0 and a.is_Integer and b.is_Integer and int(a) != 0:
            q, r = divmod(n - int(b), int(a))
            if r == 0:
                env[name] = q


def _check_input_kind(p: Value, x: Any) -> None:
    t = p.type
    if isinstance(t, TensorType):
        if not isinstance(x, torch.Tensor):
            raise InterpretError(f"input %{p.name} must be a tensor of type {t}, "
                                 f"got {type(x).__name__}")
        if x.dtype != t.dtype.torch:
            raise InterpretError(f"input %{p.name}: dtype {x.dtype} but the graph says {t}")
        if x.dim() != t.rank:
            raise InterpretError(f"input %{p.name}: rank {x.dim()} but the graph says {t}")
    elif isinstance(t, ScalarType):
        if not _scalar_fits(t.kind, x):
            raise InterpretError(f"input %{p.name} must be a Python {t}, got {type(x).__name__}")


def _scalar_fits(kind: ScalarKind, x: Any) -> bool:
    """i64 takes an int, f64 an int or float, bool a bool (a bool is not a number here)."""
    if kind is ScalarKind.bool:
        return isinstance(x, bool)
    ok: tuple[type, ...] = (int,) if kind is ScalarKind.i64 else (int, float)
    return isinstance(x, ok) and not isinstance(x, bool)


class Interpreter:
    """Runs graphs of one module on torch tensors with each op's reference implementation."""

    def __init__(self, module: Module, registry: OpRegistry | None = None,
                 check_types: bool = True):
        self.module = module
        self.registry = registry or default_registry()
        self.check_types = check_types
        # The size symbols' bindings of the graph running now: an op whose operands do not
        # carry every symbol it uses (a loop body's `prims.div(%x, s1)`) reads them here.
        self.env: Mapping[str, int] = {}

    def run(self, inputs: Sequence[Any], graph: str | None = None, *,
            apply_updates: bool = False) -> RunResult:
        """Run a graph. With `apply_updates`, updated inputs are also written in place."""
        g = self.module.graph(graph)
        results, env = self._execute(g, inputs)
        updates = {p: results[r] for p, r in g.input_updates}
        skip = {r for _, r in g.input_updates}
        outputs = [x for i, x in enumerate(results) if i not in skip]
        if apply_updates:
            # Outputs keep value semantics: one that aliases an input about to be written (the
            # input itself, a view of it) is copied first.
            written = [inputs[p] for p in updates]
            outputs = [_unalias(x, written) for x in outputs]
            for p, new in updates.items():
                old = inputs[p]
                if not isinstance(old, torch.Tensor):
                    raise InterpretError(f"input_updates: parameter {p} is not a tensor")
                with torch.no_grad():
                    old.copy_(new)
        return RunResult(outputs, updates, env)

    def call(self, graph: str, inputs: Sequence[Any]) -> list[Any]:
        """What `graph.call` sees: every result of the callee in order, updates not applied."""
        return self._execute(self.module.graph(graph), inputs)[0]

    def _execute(self, g: Graph, inputs: Sequence[Any]) -> tuple[list[Any], dict[str, int]]:
        env = bind_symbols(g, inputs, self.module.symbols)
        values: dict[Value, Any] = dict(zip(g.params, inputs, strict=True))
        outer, self.env = self.env, env
        try:
            for node in g.nodes:
                self._run_node(node, values, env)
        finally:
            self.env = outer  # a graph.call returns to its caller's bindings
        return [values[o] for o in g.outputs], env

    def _run_node(self, node: Node, values: dict[Value, Any], env: Mapping[str, int]) -> None:
        if node.op == BIND_SYMBOL and isinstance(env, dict):
            values[node.results[0]] = bind_unbacked(node, values, env, self.module.symbols)
            return
        op = self.registry.lookup(node.op)
        if op is None:
            raise InterpretError(f"unknown op {node.op} (ember.ir interpreter)", node)

        def bind(a: Arg) -> Any:
            if isinstance(a, Value):
                return values[a]
            if isinstance(a, list):
                return [bind(x) for x in a]
            if isinstance(a, sympy.Expr):  # a size; an index over loop variables (ir-v1.1) is
                return a if loop_var_names(a) else evaluate(a, env)  # its op's to read
            return a

        try:
            args = [bind(a) for a in node.args]
            kwargs = {k: bind(v) for k, v in node.kwargs.items()}
        except ExprEvalError as e:  # a size the IR cannot evaluate: the IR's fault
            raise InterpretError(f"{node.op}: {e}", node) from None
        except KeyError as e:  # a value used before it is defined (an unverified graph)
            raise InterpretError(f"{node.op}: %{e.args[0].name} has no value yet", node) \
                from None
        try:
            out = op.reference(self, args, kwargs)
        except InterpretError:
            raise
        except Exception as e:
            # What the op raised on its data, unchanged in type and message (eager raises the
            # same), with where in the IR it happened; nested graph.calls add a note each.
            if getattr(e, _NODE_ATTR, None) is None:
                try:
                    setattr(e, _NODE_ATTR, node)
                except (AttributeError, TypeError):
                    pass  # an exception type without a __dict__: the note still says where
            e.add_note(_where(node))
            raise
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(node.results) == 1 and isinstance(out, (list, tuple)) and len(outs) != 1:
            outs = [out]  # a single result that is itself a list (not an ir-v1 type; checked below)
        if len(outs) != len(node.results):
            raise InterpretError(f"{node.op} returned {len(outs)} results, the node declares "
                                 f"{len(node.results)}", node)
        for r, x in zip(node.results, outs, strict=True):
            if self.check_types:
                _check_result(node, r.type, x, env)
            values[r] = x


class SymbolAssertionError(RuntimeError):
    """A value read from a tensor (an unbacked symbol, ir-v1.2) breaks what the graph assumed of
    it: its declared range, or a bound `le=[...]` of its graph.bind_symbol (torch.compile's
    deferred runtime asserts)."""


def check_unbacked(name: str, v: int, sym: Symbol | None, le: Sequence[int]) -> None:
    """Raise SymbolAssertionError where `v`, bound to unbacked symbol `name`, is outside its
    declared range or above one of the bounds `le`."""
    if sym is not None and not _in_range(sym, v):
        hi = "inf" if sym.max is None else sym.max
        raise SymbolAssertionError(
            f"ember: {name} = {v}, read from a tensor, is outside the range [{sym.min or 0}, "
            f"{hi}] the compiled graph assumes (a runtime assertion)")
    for b in le:
        if v > b:
            raise SymbolAssertionError(
                f"ember: {name} = {v}, read from a tensor, is above {b}, the size the compiled "
                f"graph assumes it does not exceed (a runtime assertion; eager would clamp)")


def bind_unbacked(node: Node, values: Mapping[Value, Any], env: dict[str, int],
                  symbols: Mapping[str, Symbol]) -> int:
    """Run `%n = graph.bind_symbol(%t, u0, le=[...])`: u0 := %t's value, checked."""
    t, sym = node.args[0], node.args[1]
    if not isinstance(t, Value) or not isinstance(sym, sympy.Symbol):
        raise InterpretError("graph.bind_symbol(%t, u0) takes a tensor and a symbol", node)
    x = values[t]
    if not isinstance(x, torch.Tensor) or x.numel() != 1 or x.dtype.is_floating_point or \
            x.dtype.is_complex or x.dtype == torch.bool:
        raise InterpretError("graph.bind_symbol: the value is not a one-element integer tensor",
                             node)
    v = int(x.item())
    env[sym.name] = v
    le = node.kwargs.get("le", [])
    try:
        bounds = [evaluate(e, env) for e in le] if isinstance(le, list) else []
    except ExprEvalError as e:
        raise InterpretError(f"graph.bind_symbol: {e}", node) from None
    check_unbacked(sym.name, v, symbols.get(sym.name), bounds)
    return v


def _unalias(x: Any, written: Sequence[Any]) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    ptr = x.untyped_storage().data_ptr()
    if any(isinstance(w, torch.Tensor) and w.untyped_storage().data_ptr() == ptr
           for w in written):
        return x.clone()
    return x


def _check_result(node: Node, t: Type, x: Any, env: Mapping[str, int]) -> None:
    if isinstance(t, TensorType):
        if not isinstance(x, torch.Tensor):
            raise InterpretError(f"{node.op}: result is {type(x).__name__}, declared {t}", node)
        if x.layout != torch.strided:  # a sparse tensor's unchecked indices crash its readers
            raise InterpretError(f"{node.op}: result has layout {x.layout}, declared dense {t}",
                                 node)
        try:
            want = t.concrete_shape(env)
        except ExprEvalError as e:
            raise InterpretError(f"{node.op}: cannot check the result against {t}: {e}",
                                 node) from None
        if x.dtype != t.dtype.torch or tuple(x.shape) != want:
            raise InterpretError(f"{node.op}: result is {x.dtype} {tuple(x.shape)}, declared {t} "
                                 f"= {want}", node)
    elif isinstance(x, torch.Tensor):
        raise InterpretError(f"{node.op}: result is a tensor, declared scalar {t}", node)
    elif not _scalar_fits(t.kind, x):
        raise InterpretError(f"{node.op}: result is {type(x).__name__} {x!r}, declared scalar "
                             f"{t}", node)


def eager_error(module: Module, graph: str | None, inputs: Sequence[Any],
                error: Exception) -> Exception:
    """The exception eager PyTorch raises where a lowered form of `module` (decomposed to prims,
    say) raised `error`: the original graph is run again, op by op on the real operators, and
    its exception returned (the decomposition's own is returned when the original runs).

    Only on the error path: a prims gather must fail as index_select (IndexError) or gather
    (RuntimeError) would, and only the original op knows which. The global RNG is left as it
    was."""
    if isinstance(error, InterpretError):
        return error  # the IR's fault, not the data's: nothing eager would raise
    try:
        with torch.random.fork_rng(devices=[]):
            Interpreter(module, check_types=False).run(inputs, graph)
    except InterpretError:
        return error
    except Exception as e:
        return e
    return error


def run_graph(module: Module, inputs: Sequence[Any], graph: str | None = None, *,
              registry: OpRegistry | None = None) -> list[Any]:
    """Convenience: the outputs of one graph call (updates not applied)."""
    return Interpreter(module, registry).run(inputs, graph).outputs


__all__ = ["InterpretError", "Interpreter", "RunResult", "SymbolAssertionError", "bind_symbols",
           "bind_unbacked", "check_unbacked", "eager_error", "failed_node", "run_graph", "Ref"]
