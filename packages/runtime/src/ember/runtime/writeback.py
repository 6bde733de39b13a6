"""After a compiled graph ran: write the mutated inputs back and give the caller eager's tensors.

A captured graph is pure; its `input_updates` (capture's `Update`s) say which results are the new
values of which inputs. The runtime copies them into the caller's tensors in place (`copy_`:
the tensor object, its data_ptr and its views stay), then builds the returned tensors from the
capture's output plan: a graph result, laid out with eager's strides where a backend chose
another layout, or a view replayed on the caller's (updated) tensor or on another result, so
`out._base is x` holds where it holds in eager.

Backends run the graph without `input_updates` (every result comes back as an output): the
write-back is the runtime's, the same for every backend; a dumped graph keeps the attribute, so
`ember run` replays the mutation too.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.capture import Captured
from ember.capture.result import OutAlias, OutResult
from ember.ir import Module

_DATA_PTR = torch.Tensor.data_ptr
# the backend graph's attribute: [[param, result], ...] of the capture's updates (backend_module)
REPLACED_INPUTS = "replaced_inputs"


def _getter(at: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The items at `at` as a tuple, at C speed (itemgetter of one index returns the item)."""
    if len(at) > 1:
        return operator.itemgetter(*at)
    return lambda xs: tuple(xs[i] for i in at)


def backend_module(cap: Captured) -> Module:
    """The module a backend runs: the captured one, with input updates as plain outputs."""
    if not cap.updates:
        return cap.module
    m = cap.module.clone()
    m.graph().attrs.pop("input_updates", None)
    # which results replace which inputs (no autograd record): a backend may then compute such
    # a result in the input's own memory (the CUDA target's `cache-inplace`: a static KV
    # cache's slot written in place), returning the input itself; write_back skips it then
    plain = [[u.param, u.result] for u in cap.updates if not u.grad]
    if plain:
        m.graph().attrs[REPLACED_INPUTS] = plain
    return m


def aliasing(inputs: Sequence[Any]) -> tuple[int, ...]:
    """Which inputs share memory: for each, the index of the first input with its storage."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(x.untyped_storage()._cdata, i)
                 if isinstance(x, torch.Tensor) else i for i, x in enumerate(inputs))


class Epilogue:
    """Write-back and output building for one capture."""

    def __init__(self, cap: Captured):
        self.updates = [(u.param, u.result, u.grad) for u in cap.updates]
        self.plan = list(cap.plan)
        # A graph that writes its inputs was captured for one pattern of inputs sharing memory
        # (usually none): another pattern would need other updates, so it is a cache miss.
        self.aliasing = aliasing(cap.input_examples) if cap.updates else None
        # the tensor inputs (the guards hold each input's type), read at C speed
        at = [i for i, x in enumerate(cap.input_examples) if isinstance(x, torch.Tensor)]
        self._tensors = _getter(at)
        # no two tensor inputs share a storage (the usual pattern): checked incrementally
        self._distinct = self.aliasing is not None and all(
            self.aliasing[i] == i for i in at)
        self._stable: Callable[[Sequence[int]], Any] | None = None  # the unmoved positions
        self._stable_ptrs: Any = None  # their addresses at the last full check
        self._stable_storages: frozenset[int] = frozenset()  # their storages' base addresses
        self._moving: list[int] = []  # positions (among the tensors) that moved last time
        self._seen: list[int] | None = None  # all tensor addresses at the last full check
        # the output plan read per call: where every output is a distinct graph result, their
        # (index, eager stride); per entry, its view steps as (op, args, kwargs, grad mode)
        plain = [(e.result, e.stride) for e in self.plan if isinstance(e, OutResult)]
        self._plain = plain if len(plain) == len(self.plan) and \
            len({i for i, _ in plain}) == len(plain) else None
        self._steps = [tuple((s.op, s.args, dict(s.kwargs), bool(s.grad)) for s in e.steps)
                       if isinstance(e, OutAlias) else () for e in self.plan]

    def matches(self, inputs: Sequence[Any]) -> bool:
        if self.aliasing is None:
            return True
        # Storages are read only for inputs whose address moved since the last full check: a
        # decode step passes the same ~400 tensors every call but a new token-ids tensor, and
        # reading ~400 storages costs ~1 ms per call where their addresses cost ~50 us.
        # The fast path compares the moved inputs' storages by their memory (base address),
        # not by the StorageImpl: an unmoved address may now be another tensor's (the old one
        # freed, a new one allocated there, as a recycled cache is), and the freed StorageImpl's
        # address taken by a moved input's new storage, which read as an alias (a spurious
        # recompilation, one time in ten). Where it cannot tell, the full check decides.
        ts = self._tensors(inputs)
        ptrs = list(map(_DATA_PTR, ts))
        if ptrs == self._seen:
            return True
        if self._distinct and self._stable is not None and \
                self._stable(ptrs) == self._stable_ptrs:
            bases = [b for j in self._moving if (b := ts[j].untyped_storage().data_ptr())]
            if len(set(bases)) == len(bases) and self._stable_storages.isdisjoint(bases):
                return True
        ok = aliasing(inputs) == self.aliasing
        if ok and self._distinct:
            old = self._seen
            self._moving = [] if old is None else \
                [j for j, (a, b) in enumerate(zip(ptrs, old, strict=True)) if a != b]
            moving = set(self._moving)
            still = [j for j in range(len(ptrs)) if j not in moving]
            if self._moving and len(self._moving) <= 8 and still:
                self._stable = _getter(still)
                self._stable_ptrs = self._stable(ptrs)
                self._stable_storages = frozenset(
                    b for j in still if (b := ts[j].untyped_storage().data_ptr()))
            else:
                self._stable = None
        self._seen = ptrs if ok else None
        return ok

    def __call__(self, results: Sequence[Any], inputs: Sequence[Any]) -> list[Any]:
        for p, r, grad in self.updates:
            write_back(inputs[p], results[r], grad)
        if self._plain is not None:  # every output a graph result, none returned twice
            return [restride(results[i], st) for i, st in self._plain]
        laid: dict[int, Any] = {}

        def result(i: int, stride: tuple[int, ...] | None) -> Any:
            if i not in laid:
                laid[i] = restride(results[i], stride)
            return laid[i]

        out: list[Any] = []
        for e, steps in zip(self.plan, self._steps, strict=True):
            if isinstance(e, OutResult):
                out.append(result(e.result, e.stride))
                continue
            assert isinstance(e, OutAlias)
            if e.input is not None:
                t = inputs[e.input]
            else:
                assert e.result is not None
                t = result(e.result, e.stride)
            for op, args, kwargs, grad in steps:
                # replayed under the grad mode the view was made in (eager's requires_grad);
                # the mode is switched only where it differs (a context costs ~0.5 us)
                if grad is torch.is_grad_enabled():
                    t = op(t, *args, **kwargs)
                else:
                    with torch.set_grad_enabled(grad):
                        t = op(t, *args, **kwargs)
            out.append(t)
        return out


def write_back(old: Any, new: Any, grad: bool) -> None:
    """`old.copy_(new)`, recorded by autograd only where eager's in-place op would be."""
    if new is old or not isinstance(old, torch.Tensor):
        return
    enabled = torch.is_grad_enabled()
    record = bool(grad) and enabled and not (old.is_leaf and old.requires_grad)
    if record is enabled:  # (the mode is switched only where it differs: ~0.5 us a switch)
        old.copy_(new)
        return
    with torch.set_grad_enabled(record):
        old.copy_(new)


def restride(x: Any, stride: tuple[int, ...] | None) -> Any:
    """`x` with eager's strides (a copy only where the backend's layout differs)."""
    if stride is None or (x.__class__ is torch.Tensor and x.stride() == stride):
        return x  # (the usual case, settled by one stride() read)
    if not isinstance(x, torch.Tensor) or _same_layout(x, stride) \
            or not _dense(x.shape, stride):
        return x
    y = torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device)
    return y.copy_(x)


def _same_layout(x: torch.Tensor, stride: tuple[int, ...]) -> bool:
    """Strides agree on every dim of size > 1 (other dims' strides are not observable)."""
    if x.numel() <= 1:
        return True
    have = x.stride()
    return len(have) == len(stride) and all(
        n <= 1 or a == b for n, a, b in zip(x.shape, have, stride, strict=True))


def _dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """The strides lay the elements out without gaps or overlap (a permuted row-major)."""
    dims = sorted((s, n) for n, s in zip(shape, stride, strict=True) if n != 1)
    expect = 1
    for s, n in dims:
        if s != expect:
            return False
        expect *= n
    return True
