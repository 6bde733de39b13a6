"""A dynamic-shape capture's graph and guards: probe sizes read back as size expressions.

The recording ran on fake tensors at probe sizes (symbolic.py). `finish` rewrites every int of
the graph (parameter and result types, operator arguments such as `view` sizes) that is a probe
value into its size expression, declares the symbols (hint = the call's real size, min/max = the
range), turns the dynamic inputs' tensor guards into symbolic ones that bind the symbols, and adds
the size relations Python branched on as SHAPE guards. `NotSymbolic` says the capture cannot be
made symbolic (the caller captures with static shapes instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import sympy
import torch

from ember.capture.guards import (
    Guard,
    GuardKind,
    ShapeRelation,
    SymIntMeta,
    SymTensorMeta,
    TensorMeta,
)
from ember.capture.result import Captured, OutAlias, OutResult
from ember.capture.sources import RefFn, Source
from ember.capture.symbolic import BoundUnbacked, ShapeEnv, SymInt, Unbacked
from ember.ir import Module, TensorType, Value
from ember.ir.dtypes import DType
from ember.ir.expr import evaluate
from ember.ir.graph import BIND_SYMBOL, Symbol


class NotSymbolic(Exception):
    """This capture stays static (the reason is the message)."""


def _dim(env: ShapeEnv, v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int):
        return v
    e = env.expr_of(v)
    return v if e is None else e


def _arg(env: ShapeEnv, a: Any) -> Any:
    if isinstance(a, Value):
        return a
    if isinstance(a, list):
        return [_arg(env, x) for x in a]
    if isinstance(a, tuple):
        return tuple(_arg(env, x) for x in a)
    return _dim(env, a)


def _type(env: ShapeEnv, t: Any) -> Any:
    if not isinstance(t, TensorType):
        return t
    strides = None if t.strides is None else tuple(_dim(env, d) for d in t.strides)
    return TensorType(t.dtype, tuple(_dim(env, d) for d in t.shape), strides, t.device)


def symbolize(module: Module, env: ShapeEnv) -> None:
    """Probe-valued ints of `module` as size expressions; the symbols used, declared."""
    used: set[str] = set()
    raw = _ints(module) if env.unbacked else set()
    for g in module.graphs.values():
        for p in g.params:
            p.type = _type(env, p.type)
        for n in g.nodes:
            n.args = [_arg(env, a) for a in n.args]
            n.kwargs = {k: _arg(env, a) for k, a in n.kwargs.items()}
            for r in n.results:
                r.type = _type(env, r.type)
            try:
                _check_unbacked(n, env)
            except BoundUnbacked as e:
                e.avoid = raw
                raise
            _check_clamp(n)
        g.result_types = [_type(env, t) for t in g.result_types]
        bound: set[str] = {n.args[1].name for n in g.nodes if n.op == BIND_SYMBOL
                            and isinstance(n.args[1], sympy.Symbol)}  # unbacked (`.item()`)
        for p in g.params:
            if isinstance(p.type, TensorType):
                bound |= {s.name for d in p.type.shape if not isinstance(d, int)
                          for s in d.free_symbols}
        for v in g.values():
            if isinstance(v.type, TensorType):
                used |= v.type.free_symbols()
        for n in g.nodes:
            used |= _arg_symbols(n.args) | _arg_symbols(list(n.kwargs.values()))
        if not used <= bound:
            # a size read from an input the graph does not take (pruned): nothing binds it
            raise NotSymbolic(f"symbols {sorted(used - bound)} are bound by no graph input")
    for name, info in env.symbols.items():
        if name in used:
            module.add_symbol(Symbol(name, info.hint, info.lo, info.hi))
    sizes: set[str] = set()  # unbacked symbols some tensor's shape uses: asserted >= 0
    for g in module.graphs.values():
        for v in g.values():
            if isinstance(v.type, TensorType):
                sizes |= v.type.free_symbols()
    for name, info in env.unbacked.items():
        if name in used:
            module.add_symbol(Symbol(name, info.hint if name in sizes else None,
                                     0 if name in sizes else None))


_VIEWS = ("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")


def _check_unbacked(n: Any, env: ShapeEnv) -> None:
    """What a value read by `.item()` must satisfy where it bounds a slice or sizes a view,
    asserted at run time or checked here. A slice bounded by it is taken unclamped (its length
    is `end - start`) only if it does not exceed the sliced dim: the bind node asserts
    `u0 <= size` (BoundUnbacked restarts the capture to add it). A view or reshape with its
    sizes must keep the element count whatever its value (`new_zeros(u0 * 3).view(u0, 3)`);
    otherwise the capture stays static."""
    if not env.unbacked or not isinstance(n.results[0].type, TensorType):
        return
    syms = _arg_symbols(n.args[1:]) & env.unbacked.keys()
    if not syms:
        return
    base = n.args[0].type if n.args and isinstance(n.args[0], Value) else None
    if n.op == "aten.slice.Tensor" and isinstance(base, TensorType) and len(n.args) > 1:
        dim = n.args[1] if isinstance(n.args[1], int) else 0
        size = sympy.sympify(base.shape[dim]) if -base.rank <= dim < base.rank else None
        if size is None or env.is_unbacked(size):
            raise NotSymbolic("a slice of a dim sized by .item() bounded by another")
        for name in sorted(_arg_symbols(list(n.args[2:4])) & env.unbacked.keys()):
            if size not in env.learnt.unbacked_le.get(name, []):
                raise BoundUnbacked(name, int(size) if size.is_Integer else size)
    elif n.op in _VIEWS and isinstance(base, TensorType):
        count = sympy.expand(sympy.Mul(*map(sympy.sympify, base.shape)) - sympy.Mul(
            *map(sympy.sympify, n.results[0].type.shape)))
        if count != 0:
            raise NotSymbolic(f"{n.op} with sizes read by .item() that may not keep the "
                              f"element count")


def _check_clamp(n: Any) -> None:
    """A slice bounded by a size symbol whose result is not `end - start` was clamped at the
    probe sizes (`x[:y.shape[0]]` with x static, or `x[:n]` with n's probe above x's): no
    comparison went through a SymInt, so no guard says when that holds, and other sizes would
    get the wrong shape. Such a capture stays static."""
    if n.op != "aten.slice.Tensor" or len(n.args) < 3 or not isinstance(n.results[0].type,
                                                                         TensorType):
        return
    base = n.args[0].type if isinstance(n.args[0], Value) else None
    dim = n.args[1] if isinstance(n.args[1], int) else 0
    bounds = [a for a in n.args[2:4] if isinstance(a, sympy.Expr) and a.free_symbols]
    out = n.results[0].type.shape
    if not bounds or not isinstance(base, TensorType) or not -len(out) <= dim < len(out):
        return
    size = sympy.sympify(base.shape[dim])
    start, end = (list(n.args[2:4]) + [0, 2 ** 63 - 1])[:2]
    step = n.args[4] if len(n.args) > 4 else 1
    start, end = sympy.sympify(0 if start is None else start), sympy.sympify(
        2 ** 63 - 1 if end is None else end)
    if end.is_Integer and int(end) >= 2 ** 62:
        end = size
    start, end = (size + v if v.could_extract_minus_sign() else v for v in (start, end))
    if step == 1 and sympy.expand(end - start - sympy.sympify(out[dim])) == 0:
        return  # the unclamped length: `x[s0 - 1:s0]`, `x[:, -s0:]`, `x[:s0]` of an s0 dim
    raise NotSymbolic("a slice bounded by a size symbol is clamped at the probe sizes")


def _ints(module: Module) -> set[int]:
    """Every int of the recorded graph (shapes, arguments), before any is read back."""
    out: set[int] = set()

    def walk(a: Any) -> None:
        if isinstance(a, TensorType):
            walk(list(a.shape))
        elif isinstance(a, list | tuple):
            for x in a:
                walk(x)
        elif isinstance(a, int) and not isinstance(a, bool):
            out.add(a)
    for g in module.graphs.values():
        for v in g.values():
            walk(v.type)
        for n in g.nodes:
            walk(n.args)
            walk(list(n.kwargs.values()))
    return out


def _arg_symbols(args: list[Any]) -> set[str]:
    out: set[str] = set()
    for a in args:
        if isinstance(a, list | tuple):
            out |= _arg_symbols(list(a))
        elif isinstance(a, sympy.Expr):
            out |= {s.name for s in a.free_symbols}
    return out


def size_carrier(n: int) -> torch.Tensor:
    """The graph input that binds a Python int argument's size symbol: a tensor of n bytes
    (uninitialized; only its shape is read), since graphs bind symbols from input shapes."""
    return torch.empty(n, dtype=torch.uint8)


@dataclass(frozen=True)
class SizeCarrierSource(Source):
    """The size carrier of the int argument at `of`."""

    of: Source

    def expr(self, ref: RefFn) -> str:
        return f"{ref(size_carrier, 'F')}({self.of.expr(ref)})"

    def name(self) -> str:
        return f"{self.of.name()}_size"


def _add_carriers(cap: Captured, env: ShapeEnv) -> Captured:
    """A size-carrier input for each int argument's symbol that no tensor input binds."""
    g = cap.graph
    bound = {s.name for p in g.params if isinstance(p.type, TensorType)
             for d in p.type.shape if not isinstance(d, int) for s in d.free_symbols}
    sources, examples = list(cap.input_sources), list(cap.input_examples)
    for guard in cap.guards:
        e = guard.expected
        if guard.kind is not GuardKind.CONSTANT_MATCH or not isinstance(e, SymInt) or \
                not e.expr.is_Symbol or e.expr.name in bound or guard.source is None:
            continue
        name = e.expr.name
        bound.add(name)
        src = SizeCarrierSource(guard.source)
        g.params.append(Value(src.name(), TensorType(DType.u8, (e.expr,), None, "cpu")))
        sources.append(src)
        examples.append(size_carrier(env.symbols[name].hint))
    return replace(cap, input_sources=sources, input_examples=examples)


def _row_major_symbolic(module: Module, e: OutResult, env: ShapeEnv) -> bool:
    """Whether returned result `e` has a symbolic shape and was recorded dense row-major: its
    strides are then no sizes of their own (`s1 * 100` at a probe of s1 too small to be read
    back as an expression is the static 1500 at one probe, 1300 at the other)."""
    t = module.graph().result_types[e.result]
    if e.stride is None or not isinstance(t, TensorType) or all(isinstance(d, int)
                                                                for d in t.shape):
        return False
    probes = env.probes()
    shape = [d if isinstance(d, int) else int(evaluate(d, probes)) for d in t.shape]
    dense, n = [], 1
    for d in reversed(shape):
        dense.append(n)
        n *= max(d, 1)
    return tuple(reversed(dense)) == tuple(e.stride)


def finish(cap: Captured, env: ShapeEnv, layouts: dict[Any, Any]) -> Captured:
    """The symbolic form of `cap` (recorded at probe sizes)."""
    if env.unbacked and torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in cap.input_examples):
        # the training path splits the graph into forward and backward, and only the forward
        # would bind the symbol: such a call keeps the graph break at the .item()
        raise Unbacked("a graph that records gradients reads a size with .item() (training "
                       "graphs do not bind unbacked symbols)")
    if env.int_args:
        cap = _add_carriers(cap, env)
    symbolize(cap.module, env)
    plan: list[OutResult | OutAlias] = []
    for e in cap.plan:
        stride = None if e.stride is None else tuple(_dim(env, d) for d in e.stride)
        if stride is not None and not all(isinstance(d, int) for d in stride):
            stride = None  # backends return dense row-major results, eager's layout here
        elif isinstance(e, OutResult) and _row_major_symbolic(cap.module, e, env):
            stride = None  # (the same, where a stride is a small probe times a static size)
        if isinstance(e, OutAlias):
            if any(_arg(env, list(s.args)) != list(s.args) for s in e.steps):
                raise NotSymbolic("a returned view whose sizes are symbolic")
            plan.append(replace(e, stride=stride))
        else:
            plan.append(replace(e, stride=stride))
    guards: list[Guard] = []
    declared = cap.module.symbols
    seen: set[str] = set()
    for g in cap.guards:
        if g.kind is GuardKind.TENSOR_MATCH and g.source in layouts:
            m: TensorMeta = g.expected
            shape, stride = layouts[g.source]
            binds = []
            for d in shape:
                if not isinstance(d, int) and d.is_Symbol and d.name not in seen:
                    seen.add(d.name)
                    info = env.symbols[d.name]
                    binds.append((d.name, info.lo, info.hi))
            g = Guard(g.kind, g.source, SymTensorMeta(m.cls, m.dtype, m.device, tuple(shape),
                                                      tuple(stride), m.requires_grad,
                                                      tuple(binds)), g.other)
        elif g.kind is GuardKind.CONSTANT_MATCH and isinstance(g.expected, SymInt):
            x = g.expected.expr
            binds = []
            if x.is_Symbol and x.name not in seen:
                seen.add(x.name)
                info = env.symbols[x.name]
                binds.append((x.name, info.lo, info.hi))
            g = Guard(g.kind, g.source, SymIntMeta(x, tuple(binds)), g.other)
        guards.append(g)
    for rel in env.relations:
        names = {s.name for s in rel.free_symbols}
        if not names <= seen:
            raise NotSymbolic(f"a branch on sizes {sorted(names - seen)} that no input binds")
        guards.append(Guard(GuardKind.SHAPE, None, ShapeRelation(rel)))
    missing = {n for n in declared if n not in env.unbacked} - seen
    if missing:
        raise NotSymbolic(f"symbols {sorted(missing)} are bound by no guarded input")
    return replace(cap, guards=guards, plan=plan)


def same(a: Captured, b: Captured) -> bool:
    """Two probe runs agree: the same graph text, guards and output plan."""
    return (str(a.module) == str(b.module) and [g.text() for g in a.guards] ==
            [g.text() for g in b.guards] and a.plan == b.plan)


def describe_symbols(module: Module) -> list[str]:
    return [f"{s.name} (hint {s.hint}, in [{s.min}, "
            f"{'inf' if s.max in (None, math.inf) else s.max}])"
            for s in module.symbols.values()]
