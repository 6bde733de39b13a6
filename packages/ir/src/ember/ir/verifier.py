"""The verifier: structural and type checks of a module, apart from any pass.

Checks: SSA (each value defined once, before use; an unbacked symbol bound before its use),
declared symbols and division by zero in
expressions, `@` references, return types, `input_updates`, and every node's result count and
types against its op's type rule. Unregistered ops are errors unless `allow_unregistered`; ops
with effects outside the graph (effects.py) are errors unless effects are allowed, and their
kernels are never run to type them.
Errors carry the node's position in the text it was read from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ember.ir.effects import effects_allowed, refusal
from ember.ir.expr import (
    Dim,
    as_sympy,
    evaluate,
    free_symbol_names,
    has_zero_division,
    is_loop_var,
    loop_var_names,
    to_text,
)
from ember.ir.graph import BIND_SYMBOL, Arg, Graph, Module, Node, Pos, Ref, Value, is_unbacked
from ember.ir.registry import InferContext, OpRegistry, OpTypeError, default_registry
from ember.ir.types import ScalarType, TensorType, Type

_INDEX_DIALECTS = ("loop.", "kernels.")


@dataclass
class VerifyError:
    message: str
    pos: Pos | None = None

    def __str__(self) -> str:
        return f"{self.pos.line}:{self.pos.col}: {self.message}" if self.pos else self.message


class VerificationError(ValueError):
    """The module broke the IR's rules. `.errors` lists each violation with its position."""

    def __init__(self, errors: list[VerifyError]):
        self.errors = errors
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(str(first) + more)
        self.line = first.pos.line if first.pos else 0
        self.col = first.pos.col if first.pos else 0


def verify(module: Module, *, registry: OpRegistry | None = None,
           allow_unregistered: bool = False) -> None:
    """Raise `VerificationError` listing every violation, or return None."""
    errors = check(module, registry=registry, allow_unregistered=allow_unregistered)
    if errors:
        raise VerificationError(errors)


def check(module: Module, *, registry: OpRegistry | None = None,
          allow_unregistered: bool = False) -> list[VerifyError]:
    """Every violation in the module, in text order."""
    return _Checker(module, registry or default_registry(), allow_unregistered).run()


def dims_equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(sympy.expand(as_sympy(a) - as_sympy(b)) == 0)


def types_equal(a: Type, b: Type) -> bool:
    if isinstance(a, ScalarType) or isinstance(b, ScalarType):
        return a == b
    return (a.dtype == b.dtype and a.device == b.device and a.rank == b.rank
            and all(dims_equal(x, y) for x, y in zip(a.shape, b.shape, strict=True))
            and (a.strides is None) == (b.strides is None)
            and (a.strides is None or b.strides is None
                 or all(dims_equal(x, y) for x, y in zip(a.strides, b.strides, strict=True))))


class _Checker:
    def __init__(self, module: Module, registry: OpRegistry, allow_unregistered: bool):
        self.m = module
        self.reg = registry
        self.allow = allow_unregistered
        self.errors: list[VerifyError] = []
        self.hints = module.hints()

    def err(self, msg: str, pos: Pos | None) -> None:
        self.errors.append(VerifyError(msg, pos))

    def run(self) -> list[VerifyError]:
        for s in self.m.symbols.values():
            lo = s.min if s.min is not None else 0
            if s.hint is not None and (s.hint < lo or (s.max is not None and s.hint > s.max)):
                hi = "inf" if s.max is None or s.max == math.inf else s.max
                self.err(f"symbol {s.name}: hint {s.hint} lies outside [{lo}, {hi}]", None)
        for g in self.m.graphs.values():
            self.graph(g)
        return self.errors

    def dims(self, dims: Iterable[Dim], pos: Pos | None, what: str, loop_ok: bool = False
             ) -> None:
        for d in dims:
            missing = free_symbol_names(d) - self.m.symbols.keys()
            if loop_ok:  # loop variables: bound by a domain, which the op's type rule checks
                missing = {s for s in missing if not is_loop_var(s)}
            elif loop_var_names(d):
                self.err(f"{what}: loop variable(s) {', '.join(sorted(loop_var_names(d)))} "
                         f"outside a loop op's index", pos)
                missing -= loop_var_names(d)
            if missing:
                self.err(f"{what}: undeclared symbol(s) {', '.join(sorted(missing))}", pos)
            if has_zero_division(d):
                self.err(f"{what}: division by zero in {to_text(d)}", pos)

    def type_(self, t: Type, pos: Pos | None, what: str) -> None:
        if isinstance(t, TensorType):
            self.dims(t.shape + (t.strides or ()), pos, what)

    def args(self, args: Iterable[Arg], pos: Pos | None, what: str, loop_ok: bool = False
             ) -> None:
        for a in args:
            if isinstance(a, list):
                self.args(a, pos, what, loop_ok)
            elif isinstance(a, Ref) and a.name not in self.m.items:
                self.err(f"{what}: @{a.name} is not defined in this module", pos)
            elif isinstance(a, sympy.Expr):
                self.dims([a], pos, what, loop_ok)

    def graph(self, g: Graph) -> None:
        where = f"@{g.name}"
        defined: set[Value] = set()
        names: set[str] = set()

        def define(v: Value, pos: Pos | None) -> None:
            if v.name in names:
                self.err(f"{where}: value %{v.name} is defined twice", pos)
            if v in defined:
                self.err(f"{where}: value %{v.name} is defined by two nodes", pos)
            names.add(v.name)
            defined.add(v)

        for p in g.params:
            define(p, g.pos)
            self.type_(p.type, g.pos, f"{where} parameter %{p.name}")
            if isinstance(p.type, TensorType) and _unbacked_in([p.type]):
                self.err(f"{where} parameter %{p.name}: unbacked symbol(s) "
                         f"{', '.join(sorted(_unbacked_in([p.type])))} in an input's type "
                         f"(they are bound by graph.bind_symbol, inputs bind s-symbols)", g.pos)
        bound: set[str] = set()  # ir-v1.2: unbacked symbols bound so far, in node order
        for t in g.result_types:
            self.type_(t, g.pos, f"{where} result type")
        if g.domain is not None:  # ir-v1.1: a body's loops (whether callers agree: their rules)
            self.dims(g.domain.values(), g.pos, f"{where} domain")
        self.args(list(g.attrs.values()), g.pos, f"{where} attrs")
        for n in g.nodes:
            before = len(self.errors)
            for v in n.operands():
                if v not in defined:
                    self.err(f"{n.op}: operand %{v.name} is not defined before its use", n.pos)
            if not n.results:
                self.err(f"{n.op}: a node needs at least one result", n.pos)
            for r in n.results:
                define(r, n.pos)
                self.type_(r.type, n.pos, f"{n.op} result %{r.name}")
            # only the loop-level dialects take indices over loop variables (ir-v1.1)
            self.args(n.args + list(n.kwargs.values()), n.pos, n.op,
                      loop_ok=n.op.startswith(_INDEX_DIALECTS))
            self.unbacked_uses(n, bound)
            if len(self.errors) == before:  # the type rule would only repeat what is reported
                self.node(n, g)
        for o in g.outputs:
            if o not in defined:
                self.err(f"{where}: returned value %{o.name} is not defined", g.pos)
        if len(g.outputs) != len(g.result_types):
            self.err(f"{where}: returns {len(g.outputs)} values but declares "
                     f"{len(g.result_types)} result types", g.pos)
        else:
            for i, (o, t) in enumerate(zip(g.outputs, g.result_types, strict=True)):
                if not types_equal(o.type, t):
                    self.err(f"{where}: result {i} (%{o.name}) has type {o.type}, "
                             f"the signature says {t}", g.pos)
        self.input_updates(g)

    def unbacked_uses(self, n: Node, bound: set[str]) -> None:
        """An unbacked symbol is used only after the graph.bind_symbol that binds it, which
        binds it once."""
        uses: list[Any] = [*n.args, *n.kwargs.values(), *(r.type for r in n.results)]
        if n.op == BIND_SYMBOL and len(n.args) == 2 and isinstance(n.args[1], sympy.Symbol):
            name = n.args[1].name
            if name in bound:
                self.err(f"{n.op}: unbacked symbol {name} is bound twice", n.pos)
            uses = [n.args[0], *n.kwargs.values()]
            bound.add(name)
        early = _unbacked_in(uses) - bound
        if early:
            self.err(f"{n.op}: unbacked symbol(s) {', '.join(sorted(early))} used before the "
                     f"graph.bind_symbol that binds them", n.pos)

    def input_updates(self, g: Graph) -> None:
        raw = g.attrs.get("input_updates")
        if raw is None:
            return
        where = f"@{g.name} input_updates"
        ok = isinstance(raw, list) and all(
            isinstance(p, list) and len(p) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in p) for p in raw)
        if not ok:
            self.err(f"{where}: expected a list of [parameter, result] index pairs", g.pos)
            return
        params_seen: set[int] = set()
        results_seen: set[int] = set()
        for p, r in g.input_updates:
            if not 0 <= p < len(g.params):
                self.err(f"{where}: parameter index {p} out of range", g.pos)
                continue
            if not 0 <= r < len(g.result_types):
                self.err(f"{where}: result index {r} out of range", g.pos)
                continue
            if p in params_seen or r in results_seen:
                self.err(f"{where}: parameter {p} or result {r} is named twice", g.pos)
            params_seen.add(p)
            results_seen.add(r)
            if not types_equal(g.params[p].type, g.result_types[r]):
                self.err(f"{where}: result {r} has type {g.result_types[r]} but parameter "
                         f"%{g.params[p].name} has type {g.params[p].type}", g.pos)

    def node(self, n: Node, g: Graph | None = None) -> None:
        op = self.reg.lookup(n.op)
        if op is None:
            if not self.allow:
                self.err(f"unregistered op {n.op} (the verifier allows it only when told to)",
                         n.pos)
            return
        if op.effect is not None:
            # Checked before any type rule: typing it would call into torch (effects.py).
            if not effects_allowed():
                self.err(refusal(n.op, op.effect), n.pos)
            return  # allowed: its declared types stand (the reference checks them when run)
        if op.torch_op is not None and _unbacked_in([r.type for r in n.results]) and \
                torch.Tag.dynamic_output_shape in op.torch_op.tags:
            return  # (1.2) `nonzero`: no meta kernel sizes it; its result's symbol is checked
            # when the graph runs (the interpreter checks every result against its type)
        ctx = InferContext(self.m, self.hints, self.reg, g, n)
        try:
            want = op.infer(ctx, n.args, n.kwargs)
        except OpTypeError as e:
            self.err(str(e), e.pos or n.pos)
            return
        if len(want) != len(n.results):
            self.err(f"{n.op}: declares {len(n.results)} result(s), the op gives {len(want)}",
                     n.pos)
            return
        concrete = op.torch_op is not None
        scalar_in = any(isinstance(v.type, ScalarType) for v in n.operands())
        for r, w in zip(n.results, want, strict=True):
            if concrete:
                msg = self.concrete_mismatch(r.type, w, shape=not scalar_in)
            else:
                msg = None if types_equal(r.type, w) else f"the type rule gives {w}"
            if msg:
                self.err(f"{n.op}: result %{r.name} is declared {r.type}, but {msg}", n.pos)

    def concrete_mismatch(self, have: Type, want: Type, shape: bool) -> str | None:
        """Compare a declared type with a meta-kernel type computed at the symbols' hints."""
        if isinstance(have, ScalarType) or isinstance(want, ScalarType):
            return None if have == want else f"the op gives {want}"
        if have.dtype != want.dtype or have.rank != want.rank or have.device != want.device:
            return f"the op gives {want}"
        if shape:
            try:
                at_hints = have.concrete_shape(self.hints)
            except Exception:
                return "its shape cannot be evaluated at the symbols' hints"
            if at_hints != tuple(evaluate(d, {}) for d in want.shape):
                return f"at the symbols' hints it is {list(at_hints)} and the op gives {want}"
        return None


def _unbacked_in(items: Iterable[Any]) -> set[str]:
    """The unbacked symbols (`u0`) in arguments or types."""
    out: set[str] = set()
    for a in items:
        if isinstance(a, TensorType):
            out |= _unbacked_in(list(a.shape) + list(a.strides or ()))
        elif isinstance(a, list):
            out |= _unbacked_in(a)
        elif isinstance(a, sympy.Expr):
            out |= {s.name for s in a.free_symbols if is_unbacked(s.name)}
    return out
