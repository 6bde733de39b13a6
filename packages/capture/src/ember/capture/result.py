"""What a capture produces: the graph, how to build its inputs, how to rebuild the return value,
and the guards."""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

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

    @property
    def graph(self) -> Graph:
        return self.module.graph()
