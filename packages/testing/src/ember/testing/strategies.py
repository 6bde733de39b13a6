"""Hypothesis strategies for op samples: shapes (0- and 1-sized dims, 0-dim), broadcasting,
dtypes, and tensors with special values in contiguous, transposed and strided layouts.

Tensor contents come from a torch generator seeded by hypothesis: examples stay small and fast,
and a failure still reproduces from hypothesis's printed blob.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import strategies as st

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
SIGNED = (torch.int64, torch.int32, torch.int16, torch.int8)
INTS = SIGNED + (torch.uint8,)
ALL = FLOATS + INTS + (torch.bool,)

Shape = tuple[int, ...]


def dims(max_side: int = 5) -> st.SearchStrategy[int]:
    """A size, with 0 and 1 likely."""
    return st.one_of(st.sampled_from([0, 1]), st.integers(1, max_side))


def shapes(min_rank: int = 0, max_rank: int = 4, max_side: int = 5,
           allow_empty: bool = True) -> st.SearchStrategy[Shape]:
    side = dims(max_side) if allow_empty else st.integers(1, max_side)
    return st.lists(side, min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def broadcastable(draw: st.DrawFn, n: int = 2, min_rank: int = 0, max_rank: int = 4,
                  max_side: int = 5) -> list[Shape]:
    """n shapes that broadcast together: each drops leading dims and sets some dims to 1."""
    base = draw(shapes(min_rank, max_rank, max_side))
    out = []
    for _ in range(n):
        drop = draw(st.integers(0, len(base)))
        s = list(base[drop:])
        for i in range(len(s)):
            if draw(st.booleans()) and draw(st.booleans()):
                s[i] = 1
        out.append(tuple(s))
    return out


@st.composite
def tensors(draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype, *,
            low: float | None = None, high: float | None = None, special: bool = True,
            layout: str | None = None) -> torch.Tensor:
    """A tensor of `shape` and `dtype`. Floats lie in [low, high] (default [-3, 3]) and, with
    `special`, sometimes hold NaN, +-inf and -0.0; integers lie in [low, high] (default [-5, 5],
    unsigned [0, 10]). The layout is contiguous, transposed or strided (drawn unless given)."""
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    kind = layout or draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    t = _values(g, shape, dtype, low, high, special and draw(st.booleans()))
    return _with_layout(t, kind)


def _values(g: torch.Generator, shape: Shape, dtype: torch.dtype, low: float | None,
            high: float | None, special: bool) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        lo, hi = (-3.0 if low is None else low), (3.0 if high is None else high)
        t = torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
        if special and t.numel():
            picks = torch.randint(0, 6, shape, generator=g)
            specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1.0],
                                    dtype=torch.float64)
            mask = torch.rand(shape, generator=g) < 0.2
            t = torch.where(mask, specials[picks], t)
        return t.to(dtype)
    unsigned = dtype == torch.uint8
    lo_i = int(low) if low is not None else (0 if unsigned else -5)
    hi_i = int(high) if high is not None else (10 if unsigned else 5)
    return torch.randint(lo_i, hi_i + 1, shape, generator=g, dtype=torch.int64).to(dtype)


def _with_layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values, laid out non-contiguously (values unchanged)."""
    if kind == "transposed" and t.dim() >= 2:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    if kind == "strided" and t.dim() >= 1:
        big = torch.zeros((t.shape[0] * 2, *t.shape[1:]), dtype=t.dtype)
        big[::2] = t
        return big[::2]
    return t


def dtypes(choices: Sequence[torch.dtype] = ALL) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from(list(choices))


def dim_of(draw: st.DrawFn, rank: int) -> int:
    """A valid dim for a rank (negative half the time); rank 0 takes -1 and 0."""
    r = max(rank, 1)
    return draw(st.integers(-r, r - 1))


def scalars(dtype: torch.dtype) -> st.SearchStrategy[Any]:
    """A Python number of the kind that combines with `dtype` tensors."""
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point:
        return st.one_of(st.floats(-4, 4, allow_nan=False, width=32), st.integers(-3, 3))
    return st.integers(-4, 4)
