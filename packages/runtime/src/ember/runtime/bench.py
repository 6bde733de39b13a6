"""Measure the per-call cost of compiled functions' guards (`python -m ember.runtime.bench`).

For an MLP of `layers` nn.Linear layers (2 * layers parameters + 1 input), it reports the time of
the generated guard function alone (it also builds the graph's inputs), its guard count, and the
whole call overhead of a compiled function over eager. Numbers are the minimum over repeats; they
are measured, never asserted (the benchmark harness records the machine next to them).
"""

from __future__ import annotations

import argparse
import timeit
from dataclasses import dataclass

import torch
from torch import nn

from ember.runtime.compile import compile


@dataclass
class GuardCost:
    layers: int
    inputs: int
    guards: int
    guard_us: float  # one call of the generated guard function
    per_guard_us: float


def guard_cost(layers: int = 5, width: int = 8, number: int = 2000, repeat: int = 9
               ) -> GuardCost:
    m = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    c = compile(m, backend="eager")
    x = torch.randn(2, width)
    c(x)
    entry = c.compiled.entries[0]
    guard = entry.code.guard
    args: tuple[torch.Tensor, ...] = (x,)
    kwargs: dict[str, object] = {}
    assert isinstance(guard(m, args, kwargs), list)
    best = min(timeit.repeat(lambda: guard(m, args, kwargs), number=number, repeat=repeat))
    us = best / number * 1e6
    n = len(entry.code.guards)
    return GuardCost(layers, 2 * layers + 1, n, us, us / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="*", default=[1, 5, 20])
    a = ap.parse_args()
    for n in a.layers:
        r = guard_cost(n)
        print(f"mlp x{r.layers}: {r.inputs} graph inputs, {r.guards} guards, "
              f"{r.guard_us:.2f} us per check ({r.per_guard_us:.3f} us per guard)")


if __name__ == "__main__":
    main()
