"""Functionalization: in-place operators, views and mutated inputs become a pure graph.

Every tensor capture sees is a fake tensor bound to the IR value that currently holds its
contents. A tensor made by a view operator (one whose result shares its argument's storage:
select, slice, view, transpose, permute, diagonal, unsqueeze, expand, unbind, split, as_strided,
detach, ...) remembers its parent and the `ViewStep` that made it, so every tensor has a chain of
steps from a *root* (a graph input, or the result of a non-view operator).

A write (`x.add_(1)`, `x[0] = y`, `torch.add(a, b, out=x)`, batch norm's running statistics)
runs the operator's functional form, then walks the written tensor's chain up to its root,
applying each step's inverse (`select_scatter`, `slice_scatter`, `diagonal_scatter`,
`as_strided_scatter`, a reshape back, the inverse permutation) to the parent's current value.
The root gets the new value and its storage a new version; every other view of that root is
regenerated from it, lazily, the next time its value is read (a view's value is tagged with the
version it was computed at). Roots that are graph inputs are written back after the call:
capture states them as `input_updates` (ir-v1) and the runtime copies the final values into the
caller's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.errors import unhandled
from ember.ir import TensorType, Value
from ember.ir.torch_ops import ir_name

if TYPE_CHECKING:
    from ember.capture.recorder import Recorder


@dataclass(frozen=True)
class ViewStep:
    """One view operator applied to a parent tensor: `op(parent, *args, **kwargs)`, under the
    grad mode it was made in (replaying it under the same mode gives eager's requires_grad)."""

    op: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    grad: bool = True

    @property
    def name(self) -> str:
        return ir_name(self.op)

    def replay(self, t: torch.Tensor) -> torch.Tensor:
        """The view of a real tensor, made as eager made it (so `_base` and strides match)."""
        with torch.set_grad_enabled(self.grad):
            return self.op(t, *self.args, **dict(self.kwargs))  # type: ignore[no-any-return]

    def text(self) -> str:
        args = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(['_', *args])})"


# Views that only regroup elements in row-major order: their inverse is a reshape back.
_RESHAPES = {"aten.view.default", "aten._unsafe_view.default", "aten._reshape_alias.default",
             "aten.reshape.default", "aten.squeeze.default", "aten.squeeze.dim",
             "aten.squeeze.dims", "aten.unsqueeze.default", "aten.view_as.default",
             "aten.expand.default", "aten.flatten.using_ints"}
# Views that read the same elements: their inverse is the new value itself.
# Views whose replay on a value of another layout must be a reshape (view() would refuse it).
_VIEWS_AS_RESHAPE = {"aten.view.default", "aten._unsafe_view.default",
                     "aten._reshape_alias.default"}
_IDENTITY = {"aten.alias.default", "aten.detach.default", "aten.lift_fresh.default"}
_SCATTERS = {"aten.select.int": torch.ops.aten.select_scatter.default,
             "aten.slice.Tensor": torch.ops.aten.slice_scatter.default,
             "aten.diagonal.default": torch.ops.aten.diagonal_scatter.default}
_MULTI_SPLITS = ("aten::split", "aten::split_with_sizes", "aten::unsafe_split",
                 "aten::unsafe_split_with_sizes", "aten::chunk", "aten::tensor_split")


def view_steps(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any],
               results: list[torch.Tensor]) -> list[ViewStep]:
    """The step that makes each result from `args[0]`; multi-result views (unbind, split,
    chunk) become one select or slice each, so every step has one result."""
    grad = torch.is_grad_enabled()
    name = func._schema.name
    # By name, not by result count: unbind/split of a size-1 dim return a one-element list,
    # and replaying the operator itself would give that list, not the tensor.
    if len(results) == 1 and name != "aten::unbind" and name not in _MULTI_SPLITS:
        return [ViewStep(func, tuple(args[1:]), tuple(kwargs.items()), grad)]
    dim = _arg(func, args, kwargs, "dim", 0)
    base: torch.Tensor = args[0]
    d = dim % max(base.dim(), 1)
    if name == "aten::unbind":
        return [ViewStep(torch.ops.aten.select.int, (d, i), (), grad)
                for i in range(len(results))]
    if name in _MULTI_SPLITS:
        steps, start = [], 0
        for r in results:
            n = int(r.shape[d])
            steps.append(ViewStep(torch.ops.aten.slice.Tensor, (d, start, start + n, 1), (),
                                  grad))
            start += n
        return steps
    raise unhandled(f"the multi-result view operator {ir_name(func)}")


def _arg(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], name: str,
         default: Any) -> Any:
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if i < len(args):
                return args[i]
            return kwargs.get(name, default)
    return default


class Aliases:
    """The alias state of one capture: view chains, storage versions, and the roots written."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self.parent: dict[int, tuple[torch.Tensor, ViewStep]] = {}  # view id -> (parent, step)
        self.version: dict[int, int] = {}  # root id -> writes so far
        self.seen: dict[int, int] = {}  # view id -> its root's version when its value was made
        self.inputs: dict[int, torch.Tensor] = {}  # root ids of graph inputs -> their fakes
        self.input_storages: dict[int, list[torch.Tensor]] = {}  # storage -> input fakes
        self.written: dict[int, torch.Tensor] = {}  # roots written, in order of first write
        self.nograd_written: set[int] = set()  # inputs that require grad, written in no_grad

    # -- structure --------------------------------------------------------------------------
    def add_input(self, fake: torch.Tensor) -> None:
        self.inputs[id(fake)] = fake
        self.input_storages.setdefault(storage_key(fake), []).append(fake)

    def add_views(self, parent: torch.Tensor, results: list[torch.Tensor],
                  steps: list[ViewStep]) -> None:
        root = self.root(parent)
        for r, s in zip(results, steps, strict=True):
            self.parent[id(r)] = (parent, s)
            self.seen[id(r)] = self.version.get(id(root), 0)

    def take_place(self, t: torch.Tensor, snap: torch.Tensor) -> None:
        """`snap` (an alias of `t` with t's current metadata) takes t's place in the chains:
        t's parent, its views' parent and, for a root, its version; t is about to become a
        view of `snap` (an in-place metadata change, `t.t_()`)."""
        if id(t) in self.parent:
            self.parent[id(snap)] = self.parent.pop(id(t))
            self.seen[id(snap)] = self.seen.pop(id(t), 0)
        else:
            self.version[id(snap)] = self.version.pop(id(t), 0)
            if self.written.pop(id(t), None) is not None:
                self.written[id(snap)] = snap
        for k, (p, s) in list(self.parent.items()):
            if p is t:
                self.parent[k] = (snap, s)

    def chain(self, t: torch.Tensor) -> tuple[torch.Tensor, list[ViewStep]]:
        """(root, steps from the root to `t`)."""
        steps: list[ViewStep] = []
        while id(t) in self.parent:
            t, s = self.parent[id(t)]
            steps.append(s)
        return t, steps[::-1]

    def root(self, t: torch.Tensor) -> torch.Tensor:
        while id(t) in self.parent:
            t = self.parent[id(t)][0]
        return t

    def is_view(self, t: torch.Tensor) -> bool:
        return id(t) in self.parent

    def written_since_made(self, t: torch.Tensor) -> bool:
        return self.version.get(id(self.root(t)), 0) > 0

    def as_strided_base(self, base: torch.Tensor) -> tuple[torch.Tensor, Value]:
        """as_strided addresses the storage, not its argument: it is recorded on the storage's
        root (a row-major copy of its value once written, whose layout may differ)."""
        root = self.root(base)
        v = self.rec.value_of(root)
        assert v is not None
        if root is base and self.version.get(id(root), 0) == 0:
            return root, v
        return root, self._contiguous(root, v)

    # -- reading ----------------------------------------------------------------------------
    def current(self, t: torch.Tensor, v: Value) -> Value:
        """The value of view `t` now: `v` if its root was not written since, else the view
        regenerated from its parent's current value."""
        info = self.parent.get(id(t))
        if info is None:
            return v
        root = self.root(t)
        now = self.version.get(id(root), 0)
        if self.seen.get(id(t)) == now:
            return v
        parent, step = info
        pv = self.rec.value_of(parent)
        assert pv is not None
        nv = self.regenerate(step, parent, t, pv)
        self.rec.rebind(t, nv)
        self.seen[id(t)] = now
        return nv

    def regenerate(self, step: ViewStep, parent: torch.Tensor, child: torch.Tensor,
                   pv: Value) -> Value:
        rec = self.rec
        if step.name in _VIEWS_AS_RESHAPE:
            # a reshape, not a view: the parent's new value may have any layout
            return rec.emit("aten.reshape.default", [pv, list(child.shape)], {},
                            TensorType.of(child), "view")
        if step.name == "aten.as_strided.default":
            pv = self._contiguous(parent, pv)
        return rec.emit(step.name, [pv, *step.args], dict(step.kwargs), TensorType.of(child),
                        step.op._schema.name.split("::")[-1])

    def _contiguous(self, parent: torch.Tensor, pv: Value) -> Value:
        """as_strided addresses the storage: the parent must be the storage's row-major root,
        and its value is made row-major (a value computed after a write may not be)."""
        if self.is_view(parent) or not parent.is_contiguous() or parent.storage_offset() != 0:
            raise unhandled("as_strided of a tensor that is not a contiguous root (a view or a "
                            "strided input): its storage layout is not tracked")
        return self.rec.emit("aten.clone.default", [pv], {"memory_format": "contiguous_format"},
                             TensorType.of(parent), "contig")

    # -- writing ----------------------------------------------------------------------------
    def write(self, target: torch.Tensor, new: Value) -> None:
        """`target` now holds `new`: update its root through the view inverses."""
        root, _ = self.chain(target)
        if id(root) in self.inputs and len(self.input_storages[storage_key(root)]) > 1:
            raise unhandled("an in-place write to a graph input that shares memory with another "
                            "input (views of one tensor passed separately)")
        grad = torch.is_grad_enabled()
        if not grad and target.requires_grad:
            if id(root) not in self.inputs:
                raise unhandled("an in-place update under no_grad of an intermediate that "
                                "requires grad (autograd would not see it)")
            self.nograd_written.add(id(root))
        made: list[tuple[torch.Tensor, Value]] = [(target, new)]
        t = target
        while id(t) in self.parent:
            parent, step = self.parent[id(t)]
            pv = self.rec.value_of(parent)
            assert pv is not None
            new = self.inverse(step, parent, t, pv, new)
            made.append((parent, new))
            t = parent
        now = self.version.get(id(root), 0) + 1
        self.version[id(root)] = now
        self.written.setdefault(id(root), root)
        for x, v in made:
            self.rec.rebind(x, v)
            if id(x) in self.parent:
                self.seen[id(x)] = now

    def inverse(self, step: ViewStep, parent: torch.Tensor, child: torch.Tensor, pv: Value,
                cv: Value) -> Value:
        """The parent's value after its view `child` took value `cv`."""
        rec = self.rec
        name = step.name
        pt = TensorType.of(parent)
        if name in _IDENTITY:
            return cv
        if name in _RESHAPES:
            if child.numel() != parent.numel():
                raise unhandled(f"a write through an expanded view ({name}): several elements "
                                f"share one memory location")
            return rec.emit("aten.reshape.default", [cv, list(parent.shape)], {}, pt, "unview")
        if name in _SCATTERS:
            op = _SCATTERS[name]
            return rec.emit(ir_name(op), [pv, cv, *step.args], dict(step.kwargs), pt,
                            op._schema.name.split("::")[-1])
        if name in ("aten.transpose.int", "aten.t.default"):
            return rec.emit(name, [cv, *step.args], {}, pt, "unview")
        if name == "aten.permute.default":
            dims = [d % max(parent.dim(), 1) for d in step.args[0]]
            inv = sorted(range(len(dims)), key=lambda i: dims[i])
            return rec.emit(name, [cv, inv], {}, pt, "unview")
        if name == "aten.as_strided.default":
            base = self._contiguous(parent, pv)
            return rec.emit("aten.as_strided_scatter.default", [base, cv, *step.args],
                            dict(step.kwargs), pt, "as_strided_scatter")
        raise unhandled(f"an in-place write through a view made by {name} (ember knows no "
                        f"inverse for it)")

    def check_read(self, t: torch.Tensor) -> None:
        """A tensor that requires grad, updated under no_grad, read again with grad enabled:
        eager differentiates through the old leaf, which the pure graph cannot say."""
        if self.nograd_written and torch.is_grad_enabled() and \
                id(self.root(t)) in self.nograd_written:
            raise unhandled("a tensor that requires grad was updated in place under no_grad "
                            "and is read again with grad enabled")


def storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)
