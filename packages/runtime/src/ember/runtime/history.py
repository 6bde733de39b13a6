"""What a compiled function records about itself: captures, recompilations, fallbacks, notes.
`explain()` reports it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class GraphRecord:
    name: str
    ir: str  # ir-v1 text
    op_counts: Counter[str]
    guards: list[str]
    inputs: list[str]  # where each graph input comes from
    dumped_to: str | None = None


@dataclass
class Fallback:
    """A call (or a cache entry) that runs eagerly, and why."""

    reason: str
    file: str
    line: int
    stack: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def __str__(self) -> str:
        return f"{self.reason} at {self.where}"


@dataclass
class History:
    graphs: list[GraphRecord] = field(default_factory=list)
    recompilations: list[str] = field(default_factory=list)  # why each capture after the first
    fallbacks: list[Fallback] = field(default_factory=list)
    breaks: list[Fallback] = field(default_factory=list)  # graph breaks, one per split capture
    notes: list[str] = field(default_factory=list)
    calls: int = 0
    cache_hits: int = 0

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
