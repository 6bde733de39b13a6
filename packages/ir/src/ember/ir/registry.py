"""The op registry: one record per op (name, type rule, reference, summary, flags, traits).

ember's own dialects (`prims.*`, `graph.*`, `kernels.*`, loop-level ops) register records here; a
duplicate registration is an error. Every torch operator (`aten.*` and any other namespace,
custom `torch.library` ops included) resolves on demand to a record built from the operator
itself: types from its meta kernel, reference from calling it (see `torch_ops.py`), except that
an operator with effects outside the graph (`effects.py`) is never run to type it and runs only
where effects are allowed.

Traits are facts about an op that passes key on, declared in its record rather than in tables
of the passes: `aliasing` says whether its tensor results are new storage ("fresh") or may share
an operand's ("alias"); buffer planning frees an operand's buffer early only after a fresh
result. Every op of ember's own dialects declares it (tests/test_op_traits.py); a torch
operator's record says "alias" unless `torch_ops.FRESH_TORCH_OPS` lists it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ember.ir.graph import Arg, Graph, Module, Node, Pos
from ember.ir.types import Type

if TYPE_CHECKING:
    from ember.ir.interpreter import Interpreter

# Dialects that belong to ember and never resolve to torch operators.
EMBER_DIALECTS = frozenset({"prims", "graph", "kernels", "loop"})


class OpTypeError(ValueError):
    """An op's arguments do not fit its type rule. `pos`: where in the text, when the rule knows
    better than the node's own position (an argument's, from `Node.arg_pos`)."""

    def __init__(self, message: str = "", pos: Pos | None = None):
        super().__init__(message)
        self.pos = pos


@dataclass
class InferContext:
    """What a type rule may consult: the module (for `@` references), symbol hints, and the
    graph and node being checked (the verifier sets them: a loop index is checked against its
    body's declared domain)."""

    module: Module | None = None
    hints: Mapping[str, int] = field(default_factory=dict)
    registry: OpRegistry | None = None
    graph: Graph | None = None
    node: Node | None = None


# Whether an op's tensor results may share storage with its tensor operands: "fresh" results are
# new storage on every call; "alias" results may be views of an operand, or an operand itself.
Aliasing = Literal["fresh", "alias"]
ALIASING: tuple[Aliasing, ...] = ("fresh", "alias")

# type rule: (ctx, args, kwargs) -> result types, raising OpTypeError on misuse
TypeRule = Callable[[InferContext, Sequence[Arg], Mapping[str, Arg]], list[Type]]
# reference: (interpreter, args, kwargs) with values already bound -> one result or a tuple/list
Reference = Callable[["Interpreter", list[Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class OpDef:
    """Everything about one op, found from one place."""

    name: str
    summary: str
    infer: TypeRule
    reference: Reference
    has_side_effects: bool = False  # never removed or merged by dce/cse
    nondeterministic: bool = False  # random: never merged by cse
    torch_op: Any = None  # the torch OpOverload, for torch-namespace ops
    # Why the op acts outside the graph (files, printing, global state, other processes; see
    # effects.py), None for ops that only compute. Such ops are refused unless allowed.
    effect: str | None = None
    # trait: "fresh" or "alias" (see Aliasing); None where undeclared (a plugin's op), which
    # every reader takes as "alias", the answer that is always safe
    aliasing: Aliasing | None = None

    @property
    def dialect(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def fresh(self) -> bool:
        """The op's tensor results are always new storage (declared `aliasing="fresh"`)."""
        return self.aliasing == "fresh"


class OpRegistry:
    """Registered ops plus on-demand torch operators. Lookup is by dialect-qualified name."""

    def __init__(self) -> None:
        self._ops: dict[str, OpDef] = {}
        self._torch_cache: dict[str, OpDef | None] = {}

    def register(self, op: OpDef) -> OpDef:
        if "." not in op.name:
            raise ValueError(f"op name {op.name!r} must be dialect-qualified (dialect.op)")
        if op.name in self._ops:
            raise ValueError(f"op {op.name} is already registered")
        if op.aliasing is not None and op.aliasing not in ALIASING:
            raise ValueError(f"op {op.name}: aliasing= must be one of {ALIASING}, not "
                             f"{op.aliasing!r}")
        self._ops[op.name] = op
        return op

    def register_missing(self, ops: Iterable[OpDef]) -> None:
        """Register each of `ops` that is not registered yet (a dialect's ops, registered on a
        registry that may already hold them, where `register` would refuse a second time)."""
        for op in ops:
            if self.lookup(op.name) is None:
                self.register(op)

    def unregister(self, name: str) -> None:
        self._ops.pop(name, None)

    def lookup(self, name: str) -> OpDef | None:
        op = self._ops.get(name)
        if op is not None:
            return op
        if name.split(".", 1)[0] in EMBER_DIALECTS:
            return None
        if name not in self._torch_cache:
            from ember.ir.torch_ops import torch_opdef

            found = torch_opdef(name)
            if found is None:  # not cached: a library loaded later may register it
                return None
            self._torch_cache[name] = found
        return self._torch_cache[name]

    def registered(self) -> dict[str, OpDef]:
        """The explicitly registered ops (torch operators resolve on demand and are not listed)."""
        return dict(self._ops)

    def __contains__(self, name: str) -> bool:
        return self.lookup(name) is not None


_DEFAULT = OpRegistry()


def default_registry() -> OpRegistry:
    """The process-wide registry that packages register their dialects into at import."""
    return _DEFAULT


def register_op(name: str, summary: str, infer: TypeRule, reference: Reference, *,
                has_side_effects: bool = False, nondeterministic: bool = False,
                effect: str | None = None, aliasing: Aliasing | None = None,
                registry: OpRegistry | None = None) -> OpDef:
    if effect is not None:
        from ember.ir.effects import guard_reference  # effects.py imports the interpreter

        reference = guard_reference(name, effect, reference)
    return (registry or _DEFAULT).register(
        OpDef(name, summary, infer, reference, has_side_effects or effect is not None,
              nondeterministic, effect=effect, aliasing=aliasing))
