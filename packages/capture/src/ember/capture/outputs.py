"""How a capture ends: the output spec of each symbolic value handed back to Python, and the one
way to finish a capture (graph outputs, unused inputs pruned, a `Captured`).

Both endings use it: a whole capture (capture.py: the return value and the side effects) and a
graph break (resume.py: the values the break and resume functions take).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

from ember.capture.errors import unhandled
from ember.capture.guards import GuardKind
from ember.capture.result import (
    Captured,
    OutConst,
    OutDict,
    OutObject,
    OutSeq,
    OutSource,
    OutSpec,
)
from ember.capture.variables import (
    ConstVar,
    DictVar,
    FunctionVar,
    ListVar,
    NewObjectVar,
    ObjectVar,
    SetVar,
    TensorVar,
    TupleVar,
    Var,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer


class OutputSpecs:
    """Output specs of symbolic values, one per value (an object reachable twice shares its
    spec). `unsupported` words the error for a value that cannot leave the graph."""

    def __init__(self, tx: Tracer, unsupported: str = "returning a {what}"):
        self.tx = tx
        self.unsupported = unsupported
        self.memo: dict[int, OutSpec] = {}

    def value(self, v: Var) -> OutSpec:
        got = self.memo.get(id(v))
        if got is None:
            got = self.memo[id(v)] = self._make(v)
        return got

    def fresh_list(self, items: list[Var]) -> OutSpec:
        return OutSeq(list, tuple(self.value(i) for i in items))

    def _make(self, v: Var) -> OutSpec:
        if isinstance(v, TensorVar):  # an index into the output plan (views replay as views)
            return self.tx.recorder.output_tensor(v.fake)
        if isinstance(v, ConstVar):
            return OutConst(v.value)
        if isinstance(v, TupleVar):
            return OutSeq(v.cls, tuple(self.value(i) for i in v.items))
        if isinstance(v, ListVar):
            if v.source is not None:  # the caller's list (changed in place by side effects)
                return OutSource(v.source)
            return self.fresh_list(v.items)
        if isinstance(v, DictVar):
            if v.source is not None:
                return OutSource(v.source)
            return OutDict(v.cls, tuple(v.items), tuple(self.value(i) for i in v.items.values()))
        if isinstance(v, SetVar) and all(isinstance(x, ConstVar) for x in v.items.values()):
            if v.frozen:
                return OutConst(frozenset(v.items))
            # a new set per call: a constant one would be shared, and its mutations kept
            return OutSeq(set, tuple(self.value(x) for x in v.items.values()))
        if isinstance(v, ObjectVar):  # (modules too)
            return OutSource(v.source) if v.source is not None else OutConst(v.value)
        if isinstance(v, FunctionVar):
            return OutConst(v.fn)
        if isinstance(v, NewObjectVar):
            items = None if v.dict is None else tuple(
                (k, self.value(a)) for k, a in v.dict.items.items())
            return OutObject(v.cls, tuple((k, self.value(a)) for k, a in v.attrs.items()), items)
        raise unhandled(self.unsupported.format(what=v.describe()))

    def finish(self, spec: OutSpec, code: types.CodeType | None,
               effects: list[Any] | None = None) -> Captured:
        """End the capture: `spec` is what the caller gets back (built with `value`)."""
        tx = self.tx
        rec = tx.recorder
        rec.output()
        prune_inputs(tx)
        rec.finish()
        return Captured(rec.module, list(rec.input_sources), list(rec.input_examples), spec,
                        list(tx.guards.guards), code, rec.op_counts, rec.plan, rec.updates,
                        list(effects or []))


def prune_inputs(tx: Tracer) -> None:
    """Drop graph inputs nothing uses (read but unused tensors), with their metadata guards."""
    rec = tx.recorder
    g = rec.module.graph()
    used: set[int] = {id(o) for o in g.outputs} | {id(p) for p in rec.pinned}
    for n in g.nodes:
        used.update(id(v) for v in n.operands())
    keep = [i for i, p in enumerate(g.params) if id(p) in used]
    if len(keep) == len(g.params):
        return
    read = {id(rec._param_of[f]) for f in rec.observed if f in rec._param_of}
    for i, p in enumerate(g.params):
        # an input whose metadata was read (`x[:y.shape[0]]`) keeps its guard: the graph is
        # wrong for another shape of it
        if id(p) not in used and id(p) not in read:
            tx.guards.remove_for(rec.input_sources[i], GuardKind.TENSOR_MATCH)
    g.params = [g.params[i] for i in keep]
    rec.input_sources = [rec.input_sources[i] for i in keep]
    rec.input_examples = [rec.input_examples[i] for i in keep]
