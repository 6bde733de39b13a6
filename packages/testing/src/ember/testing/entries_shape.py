"""Op database entries: shape and view ops.

Every strategy draws valid arguments the way eager accepts them: negative dims, -1 in sizes,
out-of-range slice bounds (eager clamps them), negative pads (crops). Ops whose size arguments
are literals that cannot follow symbolic input sizes (view, reshape, expand) are checked at
concrete sizes only (`symbolic=False`); the others are also traced with symbolic sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st

from ember.testing import strategies as S
from ember.testing.opdb import Sample, entry

Draw = st.DrawFn
Gen = Callable[[], st.SearchStrategy[Sample]]
FAMILY = "shape"


def _tensor(draw: Draw, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...] = S.ALL,
            **kw: object) -> torch.Tensor:
    return draw(S.tensors(shape, draw(S.dtypes(dtypes)), **kw))  # type: ignore[arg-type]


def _any_tensor(draw: Draw, min_rank: int = 0, max_rank: int = 4) -> torch.Tensor:
    return _tensor(draw, draw(S.shapes(min_rank, max_rank)))


def _neg(draw: Draw, d: int, rank: int) -> int:
    """d, or the same dim counted from the end."""
    return d - rank if draw(st.booleans()) else d


def _subset(draw: Draw, rank: int) -> list[int]:
    """Distinct dims in any order, some negative."""
    dims = draw(st.permutations(range(rank)))[:draw(st.integers(0, rank))]
    return [_neg(draw, d, rank) for d in dims]


# ---- view / reshape -----------------------------------------------------------------------


def _factor(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def _target_shape(draw: Draw, numel: int) -> list[int]:
    """A shape of numel elements, with 1s inserted and sometimes one -1."""
    if numel == 0:
        out = [draw(st.integers(0, 4)) for _ in range(draw(st.integers(0, 3)))]
        out.insert(draw(st.integers(0, len(out))), 0)
    else:
        factors = draw(st.permutations(_factor(numel)))
        out = []
        for f in factors:
            merge = draw(st.booleans())
            if out and merge:
                out[-1] *= f
            else:
                out.append(f)
    for _ in range(draw(st.integers(0, 2))):
        out.insert(draw(st.integers(0, len(out))), 1)
    # -1 may stand for any entry whose siblings do not multiply to 0
    rest = [i for i in range(len(out)) if 0 not in out[:i] + out[i + 1:]]
    hole = draw(st.booleans())
    if rest and hole:
        out[draw(st.sampled_from(rest))] = -1
    return out


def _reshaped(view: bool) -> Gen:
    @st.composite
    def gen(draw: Draw) -> Sample:
        x = _any_tensor(draw)
        size = draw(_target_shape(x.numel()))
        if view:
            try:
                x.view(size)
            except RuntimeError:  # the layout cannot be viewed so: eager needs contiguity
                x = x.contiguous()
        return Sample((x, size))
    return gen


for _op in ("aten.view.default", "aten.view_copy.default", "aten._unsafe_view.default"):
    entry(_op, _reshaped(view=_op != "aten.view_copy.default"), FAMILY, symbolic=False)
entry("aten.reshape.default", _reshaped(view=False), FAMILY, symbolic=False)


@st.composite
def _flatten(draw: Draw) -> Sample:
    x = _any_tensor(draw)
    r = max(x.dim(), 1)
    a, b = sorted((draw(st.integers(0, r - 1)), draw(st.integers(0, r - 1))))
    return Sample((x, _neg(draw, a, r), _neg(draw, b, r)))


entry("aten.flatten.using_ints", lambda: _flatten(), FAMILY)

# ---- permute, transpose, expand, squeeze ----------------------------------------------------


@st.composite
def _permute(draw: Draw) -> Sample:
    x = _any_tensor(draw)
    perm = draw(st.permutations(range(x.dim())))
    return Sample((x, [_neg(draw, d, x.dim()) for d in perm]))


@st.composite
def _transpose(draw: Draw) -> Sample:
    x = _any_tensor(draw)
    return Sample((x, S.dim_of(draw, x.dim()), S.dim_of(draw, x.dim())))


@st.composite
def _t(draw: Draw) -> Sample:
    return Sample((_any_tensor(draw, 0, 2),))


@st.composite
def _expand(draw: Draw) -> Sample:
    shape = [1 if draw(st.booleans()) else d for d in draw(S.shapes())]
    x = _tensor(draw, tuple(shape))
    size = [draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 2)))]
    for d in shape:
        choice = draw(st.integers(0, 2))
        size.append(-1 if choice == 0 else d if choice == 1 or d != 1
                    else draw(st.integers(0, 4)))
    return Sample((x, size))


def _with_ones(draw: Draw, min_rank: int = 0) -> torch.Tensor:
    shape = [1 if draw(st.booleans()) else d for d in draw(S.shapes(min_rank))]
    return _tensor(draw, tuple(shape))


@st.composite
def _squeeze(draw: Draw) -> Sample:
    return Sample((_with_ones(draw),))


@st.composite
def _squeeze_dim(draw: Draw) -> Sample:
    x = _with_ones(draw)
    return Sample((x, S.dim_of(draw, x.dim())))


@st.composite
def _squeeze_dims(draw: Draw) -> Sample:
    x = _with_ones(draw)
    dims = _subset(draw, x.dim()) if x.dim() else draw(st.sampled_from([[], [0], [-1]]))
    return Sample((x, dims))


@st.composite
def _unsqueeze(draw: Draw) -> Sample:
    x = _any_tensor(draw, 0, 3)
    return Sample((x, draw(st.integers(-x.dim() - 1, x.dim()))))


for _base, _gen, _sym in (
        ("permute.default", _permute, True), ("transpose.int", _transpose, True),
        ("t.default", _t, True), ("expand.default", _expand, False),
        ("squeeze.default", _squeeze, True), ("squeeze.dim", _squeeze_dim, True),
        ("squeeze.dims", _squeeze_dims, True), ("unsqueeze.default", _unsqueeze, True)):
    _name, _overload = _base.split(".")
    for _op in (f"aten.{_base}", f"aten.{_name}_copy.{_overload}"):
        entry(_op, _gen, FAMILY, symbolic=_sym)

# ---- slicing and splitting ----------------------------------------------------------------


def _dim_and_size(draw: Draw, x: torch.Tensor) -> tuple[int, int]:
    d = S.dim_of(draw, x.dim())
    return d, x.shape[d]


@st.composite
def _slice(draw: Draw) -> Sample:
    x = _any_tensor(draw, 1)
    d, n = _dim_and_size(draw, x)
    bound = st.one_of(st.none(), st.integers(-n - 3, n + 3), st.just(2**63 - 1))
    start, end = draw(bound), draw(bound)
    step = draw(st.integers(1, 3))
    kw = {"start": start, "end": end, "step": step}
    return Sample((x, d), {k: v for k, v in kw.items() if v is not None or draw(st.booleans())})


@st.composite
def _select(draw: Draw) -> Sample:
    shape = list(draw(S.shapes(1)))
    d = draw(st.integers(0, len(shape) - 1))
    shape[d] = shape[d] or draw(st.integers(1, 4))  # the selected dim is not empty
    x = _tensor(draw, tuple(shape))
    return Sample((x, _neg(draw, d, x.dim()), draw(st.integers(-shape[d], shape[d] - 1))))


@st.composite
def _narrow(draw: Draw) -> Sample:
    x = _any_tensor(draw, 1)
    d, n = _dim_and_size(draw, x)
    start = draw(st.integers(0, n))
    length = draw(st.integers(0, n - start))
    if start < n and draw(st.booleans()):
        start -= n
    return Sample((x, d, start, length))


@st.composite
def _split(draw: Draw) -> Sample:
    x = _any_tensor(draw, 1)
    d, n = _dim_and_size(draw, x)
    size = draw(st.integers(1, n + 1)) if n else draw(st.integers(0, 2))
    return Sample((x, size, d))


@st.composite
def _split_with_sizes(draw: Draw) -> Sample:
    x = _any_tensor(draw, 1)
    d, n = _dim_and_size(draw, x)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    bounds = [0, *cuts, n]
    return Sample((x, [b - a for a, b in zip(bounds, bounds[1:], strict=False)], d))


@st.composite
def _unbind(draw: Draw) -> Sample:
    x = _tensor(draw, tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))))
    return Sample((x, S.dim_of(draw, x.dim())))


for _base, _gen in (("slice.Tensor", _slice), ("select.int", _select),
                    ("narrow.default", _narrow), ("split.Tensor", _split),
                    ("split_with_sizes.default", _split_with_sizes),
                    ("unbind.int", _unbind)):
    _name, _overload = _base.split(".")
    for _op in (f"aten.{_base}", f"aten.{_name}_copy.{_overload}"):
        entry(_op, _gen, FAMILY)

# ---- joining, repeat, roll, flip, pad ------------------------------------------------------


def _dtypes_for_join(draw: Draw, k: int) -> list[torch.dtype]:
    """One dtype, or (promotion) a mix."""
    first = draw(S.dtypes())
    return [draw(S.dtypes()) if draw(st.booleans()) else first for _ in range(k)]


@st.composite
def _cat(draw: Draw) -> Sample:
    base = list(draw(S.shapes(1, 3, 4)))
    d = S.dim_of(draw, len(base))
    k = draw(st.integers(1, 3))
    parts = []
    for dt in _dtypes_for_join(draw, k):
        base[d] = draw(S.dims(3))
        parts.append(draw(S.tensors(tuple(base), dt)))
    if draw(st.integers(0, 3)) == 0:  # eager's legacy rule: 1-d empty tensors are skipped
        legacy = torch.empty(0, dtype=draw(S.dtypes()))
        parts.insert(draw(st.integers(0, len(parts))), legacy)
    return Sample((parts, d))


@st.composite
def _stack(draw: Draw) -> Sample:
    shape = draw(S.shapes(0, 3, 4))
    k = draw(st.integers(1, 3))
    parts = [draw(S.tensors(shape, dt)) for dt in _dtypes_for_join(draw, k)]
    return Sample((parts, draw(st.integers(-len(shape) - 1, len(shape)))))


@st.composite
def _repeat(draw: Draw) -> Sample:
    x = _any_tensor(draw, 0, 3)
    extra = draw(st.integers(0, 2))
    return Sample((x, [draw(st.integers(0, 3)) for _ in range(x.dim() + extra)]))


@st.composite
def _roll(draw: Draw) -> Sample:
    x = _any_tensor(draw)
    shift = st.integers(-7, 7)
    if x.dim() == 0 or draw(st.booleans()):
        return Sample((x, [draw(shift)]), {"dims": []} if draw(st.booleans()) else {})
    dims = [S.dim_of(draw, x.dim()) for _ in range(draw(st.integers(1, x.dim())))]
    return Sample((x, [draw(shift) for _ in dims], dims))


@st.composite
def _flip(draw: Draw) -> Sample:
    x = _any_tensor(draw)
    return Sample((x, _subset(draw, x.dim()) if x.dim() else draw(st.sampled_from([[], [0]]))))


@st.composite
def _constant_pad_nd(draw: Draw) -> Sample:
    x = _any_tensor(draw)
    pad: list[int] = []
    for d in range(x.dim() - 1, x.dim() - 1 - draw(st.integers(0, x.dim())), -1):
        n = x.shape[d]
        lo = draw(st.integers(-n, 3))  # eager crops first: n + min(lo, 0) + min(hi, 0) >= 0
        hi = draw(st.integers(-(n + min(lo, 0)), 3))
        pad += [lo, hi]
    if draw(st.booleans()):
        return Sample((x, pad))
    return Sample((x, pad, draw(S.scalars(x.dtype))))


entry("aten.cat.default", lambda: _cat(), FAMILY)
entry("aten.stack.default", lambda: _stack(), FAMILY)
entry("aten.repeat.default", lambda: _repeat(), FAMILY)
entry("aten.roll.default", lambda: _roll(), FAMILY)
entry("aten.flip.default", lambda: _flip(), FAMILY)
entry("aten.constant_pad_nd.default", lambda: _constant_pad_nd(), FAMILY)

# ---- copies, aliases, conversions ---------------------------------------------------------

_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


@st.composite
def _unary(draw: Draw) -> Sample:
    return Sample((_any_tensor(draw),))


@st.composite
def _clone(draw: Draw) -> Sample:
    x = _any_tensor(draw)
    fmt = draw(st.sampled_from(_FORMATS + ((torch.channels_last,) if x.dim() == 4 else ())))
    return Sample((x,), {"memory_format": fmt} if fmt is not None else {})


@st.composite
def _to_copy(draw: Draw) -> Sample:
    """A conversion between any two dtypes. Float to integer conversion is defined only for
    finite values the integer type holds (C++ leaves the rest undefined), so such samples
    draw in-range finite values."""
    src, dst = draw(S.dtypes()), draw(st.sampled_from((None,) + S.ALL))
    narrowing = src.is_floating_point and dst is not None and not dst.is_floating_point \
        and dst != torch.bool
    lo = 0.0 if narrowing and dst == torch.uint8 else None
    x = draw(S.tensors(draw(S.shapes()), src, low=lo, special=not narrowing))
    kw: dict[str, object] = {"dtype": dst} if dst is not None else {}
    # device= is left out: ember.ir's type inference runs the meta kernel, which cannot copy
    # a meta tensor to a device (tests/test_shape_decomp.py covers it with declared types)
    if draw(st.booleans()):
        kw["layout"] = torch.strided
    fmt = draw(st.sampled_from(_FORMATS))
    if fmt is not None:
        kw["memory_format"] = fmt
    return Sample((x,), kw)


entry("aten.clone.default", lambda: _clone(), FAMILY)
entry("aten._to_copy.default", lambda: _to_copy(), FAMILY)
for _op in ("alias.default", "alias_copy.default", "detach.default", "detach_copy.default",
            "lift_fresh.default", "lift_fresh_copy.default"):
    entry(f"aten.{_op}", lambda: _unary(), FAMILY)
