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
from dataclasses import replace
from typing import Any

import sympy

from ember.capture.guards import Guard, GuardKind, ShapeRelation, SymTensorMeta, TensorMeta
from ember.capture.result import Captured, OutAlias, OutResult
from ember.capture.symbolic import ShapeEnv
from ember.ir import Module, TensorType, Value
from ember.ir.graph import Symbol


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
    for g in module.graphs.values():
        for p in g.params:
            p.type = _type(env, p.type)
        for n in g.nodes:
            n.args = [_arg(env, a) for a in n.args]
            n.kwargs = {k: _arg(env, a) for k, a in n.kwargs.items()}
            for r in n.results:
                r.type = _type(env, r.type)
            _check_clamp(n)
        g.result_types = [_type(env, t) for t in g.result_types]
        bound: set[str] = set()
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


def _check_clamp(n: Any) -> None:
    """A slice bounded by a size symbol whose result dim is static was clamped to a static
    size at the probe sizes (`x[:y.shape[0]]`, x static): no comparison went through a SymInt,
    so no guard says when that holds, and smaller sizes would get the wrong shape."""
    if n.op != "aten.slice.Tensor" or len(n.args) < 3 or not isinstance(n.results[0].type,
                                                                         TensorType):
        return
    dim = n.args[1] if isinstance(n.args[1], int) else 0
    bounds = [a for a in n.args[2:4] if isinstance(a, sympy.Expr) and a.free_symbols]
    out = n.results[0].type.shape
    if not bounds or not -len(out) <= dim < len(out) or not isinstance(out[dim], int):
        return
    start, end = (list(n.args[2:4]) + [None, None])[:2]
    step = n.args[4] if len(n.args) > 4 else 1
    if step == 1 and isinstance(start, int | sympy.Expr) and isinstance(end, int | sympy.Expr):
        span = sympy.expand(sympy.sympify(end) - sympy.sympify(start))
        if span.is_Integer and int(span) == out[dim]:
            return  # `x[s0 - 1:s0]`: static by construction
    raise NotSymbolic("a slice bounded by a size symbol is clamped at the probe sizes")


def _arg_symbols(args: list[Any]) -> set[str]:
    out: set[str] = set()
    for a in args:
        if isinstance(a, list | tuple):
            out |= _arg_symbols(list(a))
        elif isinstance(a, sympy.Expr):
            out |= {s.name for s in a.free_symbols}
    return out


def finish(cap: Captured, env: ShapeEnv, layouts: dict[Any, Any]) -> Captured:
    """The symbolic form of `cap` (recorded at probe sizes)."""
    symbolize(cap.module, env)
    plan: list[OutResult | OutAlias] = []
    for e in cap.plan:
        stride = None if e.stride is None else tuple(_dim(env, d) for d in e.stride)
        if stride is not None and not all(isinstance(d, int) for d in stride):
            stride = None  # backends return dense row-major results, eager's layout here
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
        guards.append(g)
    for rel in env.relations:
        names = {s.name for s in rel.free_symbols}
        if not names <= seen:
            raise NotSymbolic(f"a branch on sizes {sorted(names - seen)} that no input binds")
        guards.append(Guard(GuardKind.SHAPE, None, ShapeRelation(rel)))
    missing = set(declared) - seen
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
