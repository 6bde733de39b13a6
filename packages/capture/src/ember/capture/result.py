"""What a capture produces: the graph, how to build its inputs, how to rebuild the return value,
and the guards."""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.capture.functionalize import ViewStep
from ember.capture.guards import Guard
from ember.capture.sources import Source
from ember.ir import Graph, Module


class OutSpec:
    """How to rebuild (part of) the function's return value from the graph's outputs."""


@dataclass(frozen=True)
class OutTensor(OutSpec):
    index: int  # into the graph's outputs


@dataclass(frozen=True)
class OutConst(OutSpec):
    value: Any


@dataclass(frozen=True)
class OutSource(OutSpec):
    """An object of the caller's, returned as is (read again through its source)."""

    source: Source


@dataclass(frozen=True)
class OutSeq(OutSpec):
    cls: type  # tuple, list, a namedtuple class, a torch.return_types class
    items: tuple[OutSpec, ...]


@dataclass(frozen=True)
class OutDict(OutSpec):
    cls: type
    keys: tuple[Any, ...]
    items: tuple[OutSpec, ...]


@dataclass(frozen=True)
class OutObject(OutSpec):
    """An instance of a user class made during capture (a dataclass, say)."""

    cls: type
    attrs: tuple[tuple[str, OutSpec], ...]
    # the dict contents of a dict subclass's instance (a ModelOutput), else None
    items: tuple[tuple[Any, OutSpec], ...] | None = None


@dataclass(frozen=True)
class OutResult:
    """A returned tensor that is graph result `result`, laid out with eager's strides."""

    result: int
    stride: tuple[int, ...] | None  # None: as the backend laid it out (symbolic sizes)


@dataclass(frozen=True)
class OutAlias:
    """A returned tensor that is a view, as in eager: `steps` replayed on graph input `input`
    (the caller's own tensor, after write-back) or on graph result `result` (another returned
    tensor, or a base nothing else returns), so `_base` and data_ptr relations are eager's."""

    input: int | None
    result: int | None
    steps: tuple[ViewStep, ...]
    stride: tuple[int, ...] | None  # the base result's eager strides


@dataclass(frozen=True)
class Update:
    """Graph result `result` is copied into graph input `param` after the call (the graph's
    `input_updates`); `grad`: the copy is recorded by autograd (the input requires grad after
    the write in eager, as when a non-leaf was updated with grad enabled)."""

    param: int
    result: int
    grad: bool


@dataclass
class Captured:
    """A successful capture of one call."""

    module: Module  # one graph of aten ops
    input_sources: list[Source]  # how to fetch each graph input from the call, in order
    input_examples: list[torch.Tensor]  # the tensors of the call that was captured
    output: OutSpec
    guards: list[Guard]
    code: types.CodeType | None
    op_counts: Counter[str] = field(default_factory=Counter)
    # what the caller gets back: OutTensor(i) in `output` is plan[i]
    plan: list[OutResult | OutAlias] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    # Python side effects to replay after the graph (`side_effects.Effect`); when there are
    # any, `output` is a tuple: the return value, then per effect its target and new value
    effects: list[Any] = field(default_factory=list)

    @property
    def graph(self) -> Graph:
        return self.module.graph()
