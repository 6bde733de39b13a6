"""Decompositions of random ops through `prims.philox_uniform`, and the per-graph RNG state.

Random numbers in a decomposed graph (docs/decisions.md, "Random numbers in graphs"):

- a graph with random ops gets two scalar parameters, `%philox_seed: i64` and
  `%philox_offset: i64`, appended once, and `attrs(philox=[SEED, OFFSET, CONSUMED])`: the two
  parameters' indices and how far one call advances the offset (an int or size expression);
- the random ops of the graph draw from consecutive counter ranges in graph order: an op that
  consumes N counters gets `skip=` the counters consumed before it, so no two overlap;
- the caller (the runtime) passes the generator's seed and offset and then advances its offset
  by CONSUMED; the same seed and offset give bitwise the same numbers on every backend.

Per op (N = the result's element count):
- rand, rand_like, uniform: one uniform per element in the result dtype (N counters);
- randn, randn_like, normal: Box-Muller, `sqrt(-2 log(1 - u1)) * cos(2 pi u2)` with `u1` from
  counters [skip, skip + N) and `u2` from [skip + N, skip + 2N), in f32 (f64 for f64 results):
  2N counters; the tail is cut at |z| ~ 5.8 (f32: 1 - u1 >= 2**-24);
- randint: `low + floor(u * (high - low))` with an f64 uniform (exact for ranges < 2**53);
- bernoulli: `u < p` with u in f32 (f64 for f64 tensors); native_dropout: keep where
  `u < 1 - p`, output `input * mask * (1 / (1 - p))` (scale 0 when p == 1), as eager computes it.

Eager's generators cannot be matched: these ops are checked against eager by distribution
(packages/prims/tests/test_random.py).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ember.ir import I64, Builder, DType, Graph, Interpreter, RunResult, Value
from ember.ir.expr import Dim, ExprEvalError, as_sympy, evaluate, simplify_dim
from ember.ir.interpreter import InterpretError, bind_symbols
from ember.prims.decomp.context import DecompContext, DecompositionError
from ember.prims.decomp.pointwise import opmath
from ember.prims.decomp.table import register_decomposition

ATTR = "philox"


class PhiloxState:
    """The decompose pass's random-number state for one graph: the seed and offset parameters
    (created on first use) and the counters consumed so far."""

    def __init__(self, graph: Graph, builder: Builder):
        self.graph = graph
        self.b = builder
        self.seed: Value | None = None
        self.offset: Value | None = None
        self.consumed: Dim = 0
        self._added = False
        prior = graph.attrs.get(ATTR)
        if prior is not None:  # decomposed before (decompose{keep_unsupported=true} twice)
            s, o, c = _parse_attr(prior, graph)
            self.seed, self.offset, self.consumed = graph.params[s], graph.params[o], c
            self._added = True

    def take(self, n: Dim) -> tuple[Value, Value, Dim]:
        """(seed, offset, skip) for an op that consumes `n` counters."""
        if self.seed is None or self.offset is None:
            self.seed = Value(self.b.fresh("philox_seed"), I64)
            self.offset = Value(self.b.fresh("philox_offset"), I64)
        skip = self.consumed
        self.consumed = _add(self.consumed, n)
        return self.seed, self.offset, skip

    def finish(self) -> None:
        """Append the parameters and record the attribute (if any random op ran)."""
        if self.seed is None or self.offset is None:
            return
        if not self._added:
            self.graph.params += [self.seed, self.offset]
            self._added = True
        params = self.graph.params
        self.graph.attrs[ATTR] = [params.index(self.seed), params.index(self.offset),
                                  self.consumed]


def _parse_attr(raw: Any, graph: Graph) -> tuple[int, int, Dim]:
    ok = isinstance(raw, list) and len(raw) == 3 and all(
        isinstance(i, int) and 0 <= i < len(graph.params) for i in raw[:2])
    if not ok:
        raise DecompositionError(f"@{graph.name}: attrs(philox=...) must be [seed parameter "
                                 f"index, offset parameter index, consumed], got {raw!r}")
    return raw[0], raw[1], raw[2]


def philox_params(graph: Graph) -> tuple[int, int, Dim] | None:
    """(seed index, offset index, consumed) of a decomposed graph, None without random ops."""
    raw = graph.attrs.get(ATTR)
    return None if raw is None else _parse_attr(raw, graph)


def draws(graph: Graph) -> bool:
    """Whether a node of the graph reads its seed or offset: a random op left after `dce` (a
    graph whose draws were all dead keeps the parameters, and draws nothing)."""
    info = philox_params(graph)
    if info is None:
        return False
    rng = {graph.params[info[0]], graph.params[info[1]]}
    return any(v in rng for n in graph.nodes for v in n.operands())


def with_philox_inputs(graph: Graph, inputs: Sequence[Any], seed: int = 0,
                       offset: int = 0) -> list[Any]:
    """`inputs` for the graph's original parameters, with seed and offset put in their places
    (unchanged when the graph has no random ops)."""
    info = philox_params(graph)
    out = list(inputs)
    if info is None:
        return out
    for i, v in sorted(((info[0], seed), (info[1], offset))):
        out.insert(i, v)
    return out


def run_with_philox(interp: Interpreter, graph: str | None, inputs: Sequence[Any], seed: int,
                    offset: int) -> tuple[RunResult, int]:
    """Run a decomposed graph as a caller should: seed and offset fed to its parameters, then
    the offset advanced by what the call consumed. Returns the result and the new offset."""
    g = interp.module.graph(graph)
    info = philox_params(g)
    if info is None or len(inputs) == len(g.params):
        # no random ops, or a graph decomposed before the backend saw it: its caller passes
        # the seed and offset itself (`ember run decomposed.ir --backend inductor`)
        return interp.run(inputs, graph), offset
    res = interp.run(with_philox_inputs(g, inputs, seed, offset), graph)
    return res, offset + evaluate(info[2], res.env)


class PhiloxOffsets:
    """A runner's philox offset, shared by the graphs it runs (each draws from torch's seed at
    the offsets it takes, so no two graphs or calls of the runner overlap). `take(n)` returns
    the offset and advances it by `n` under a lock: two concurrent calls never get the same
    counters. A new runner starts at 0, so `torch.manual_seed(s)` then a new runner replays
    its first call's numbers."""

    def __init__(self, start: int = 0):
        self.lock = threading.Lock()
        self.value = start

    def take(self, n: int) -> int:
        with self.lock:
            start = self.value
            self.value = start + n
        return start


def run_drawing(interp: Interpreter, graph: str | None, inputs: Sequence[Any],
                offsets: PhiloxOffsets) -> RunResult:
    """`run_with_philox` with the runner's shared offsets: the call's counters are taken before
    it runs (a size expression evaluated from the inputs' shapes); a count that needs the
    call's data (unbacked sizes) is taken after the run, the lock held throughout."""
    g = interp.module.graph(graph)
    info = philox_params(g)
    if info is None or len(inputs) == len(g.params):  # (see run_with_philox)
        return interp.run(inputs, graph)
    n = info[2]
    if not isinstance(n, int):
        try:
            env = bind_symbols(g, with_philox_inputs(g, inputs), interp.module.symbols)
            n = evaluate(n, env)
        except (ExprEvalError, InterpretError):
            with offsets.lock:
                res, offsets.value = run_with_philox(interp, graph, inputs,
                                                     torch.initial_seed(), offsets.value)
            return res
    return interp.run(with_philox_inputs(g, inputs, torch.initial_seed(), offsets.take(n)),
                      graph)


def _add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return simplify_dim(as_sympy(a) + as_sympy(b))


# ---- building blocks --------------------------------------------------------------------


def _state(ctx: DecompContext) -> PhiloxState:
    if not isinstance(ctx.rng, PhiloxState):
        raise DecompositionError(f"{ctx.node.op}: random ops are decomposed only by the "
                                 f"decompose pass (it owns the graph's seed and offset)")
    return ctx.rng


def _out_shape(ctx: DecompContext) -> list[Dim]:
    return list(ctx.ttype(ctx.node.results[0]).shape)


def _out_device(ctx: DecompContext, i: int = 0) -> str:
    return ctx.ttype(ctx.node.results[i]).device


def uniform(ctx: DecompContext, shape: Sequence[Dim], dtype: DType, device: str) -> Value:
    """Uniform [0, 1) numbers of `shape` (float dtype) from the graph's next counters."""
    n: Any = 1
    for d in shape:
        n = as_sympy(n) * as_sympy(d)
    seed, offset, skip = _state(ctx).take(simplify_dim(n))
    extra = {} if isinstance(skip, int) and skip == 0 else {"skip": skip}
    return ctx.prim("philox_uniform", seed, offset, shape=list(shape), dtype=dtype,
                    device=device, **extra)


def _compute(dt: DType) -> DType:
    """The float dtype random numbers are made in for results of dtype dt."""
    return DType.f64 if dt == DType.f64 else DType.f32


def normal(ctx: DecompContext, shape: Sequence[Dim], dtype: DType, device: str) -> Value:
    """Standard normal numbers (Box-Muller) in dtype (f32 or f64)."""
    p = ctx.prim
    u1 = uniform(ctx, shape, dtype, device)
    u2 = uniform(ctx, shape, dtype, device)
    r = p("sqrt", p("mul", p("log", p("sub", 1.0, u1)), -2.0))
    return p("mul", r, p("cos", p("mul", u2, 2.0 * math.pi)))


def _affine(ctx: DecompContext, x: Value, scale: Any, shift: Any) -> Value:
    """x * scale + shift, skipping the identities."""
    if not (isinstance(scale, (int, float)) and scale == 1):
        x = ctx.prim("mul", x, scale)
    if not (isinstance(shift, (int, float)) and shift == 0):
        x = ctx.prim("add", x, shift)
    return x


# ---- rand, randn, uniform, normal -------------------------------------------------------


@register_decomposition("aten.rand.default", "aten.rand_like.default")
def rand(ctx: DecompContext, **_: Any) -> Value:
    return uniform(ctx, _out_shape(ctx), ctx.out_dtype(), _out_device(ctx))


@register_decomposition("aten.randn.default", "aten.randn_like.default")
def randn(ctx: DecompContext, **_: Any) -> Value:
    out = ctx.out_dtype()
    return ctx.convert(normal(ctx, _out_shape(ctx), _compute(out), _out_device(ctx)), out)


@register_decomposition("aten.uniform.default")
def uniform_(ctx: DecompContext, self: Value, generator: Any = None, **kw: Any) -> Value:
    """from + (to - from) * u, in f32 (f64 for f64 tensors)."""
    lo, hi = kw.get("from", 0.0), kw.get("to", 1.0)
    out = ctx.out_dtype()
    u = uniform(ctx, ctx.shape(self), _compute(out), ctx.device(self))
    return ctx.convert(_affine(ctx, u, float(hi) - float(lo), float(lo)), out)


@register_decomposition("aten.normal_functional.default")
def normal_functional(ctx: DecompContext, self: Value, mean: float = 0.0, std: float = 1.0,
                      generator: Any = None) -> Value:
    out = ctx.out_dtype()
    z = normal(ctx, ctx.shape(self), _compute(out), ctx.device(self))
    return ctx.convert(_affine(ctx, z, float(std), float(mean)), out)


@register_decomposition("aten.normal.float_float")
def normal_float_float(ctx: DecompContext, mean: float, std: float, size: Any,
                       generator: Any = None, **_: Any) -> Value:
    out = ctx.out_dtype()
    z = normal(ctx, _out_shape(ctx), _compute(out), _out_device(ctx))
    return ctx.convert(_affine(ctx, z, float(std), float(mean)), out)


# ---- randint ----------------------------------------------------------------------------


def _randint(ctx: DecompContext, low: Any, high: Any) -> Value:
    out = ctx.out_dtype()
    if not isinstance(low, int) or not isinstance(high, int):
        raise DecompositionError(f"{ctx.node.op}: low and high must be int literals")
    if high <= low:
        raise DecompositionError(f"{ctx.node.op}: empty range [{low}, {high})")
    u = uniform(ctx, _out_shape(ctx), DType.f64, _out_device(ctx))
    v = ctx.prim("floor", ctx.prim("mul", u, float(high - low)))
    if low:
        v = ctx.prim("add", v, float(low))
    return ctx.convert(v, out)


@register_decomposition("aten.randint.default")
def randint(ctx: DecompContext, high: Any, size: Any, **_: Any) -> Value:
    return _randint(ctx, 0, high)


@register_decomposition("aten.randint.low")
def randint_low(ctx: DecompContext, low: Any, high: Any, size: Any, **_: Any) -> Value:
    return _randint(ctx, low, high)


@register_decomposition("aten.randint_like.default")
def randint_like(ctx: DecompContext, self: Value, high: Any, **_: Any) -> Value:
    return _randint(ctx, 0, high)


@register_decomposition("aten.randint_like.low_dtype")
def randint_like_low(ctx: DecompContext, self: Value, low: Any, high: Any, **_: Any) -> Value:
    return _randint(ctx, low, high)


# ---- bernoulli, dropout -----------------------------------------------------------------


def _bernoulli(ctx: DecompContext, self: Value, p: Any) -> Value:
    """(u < p) in the result dtype; p a number or a tensor broadcast to self's shape."""
    out = ctx.out_dtype()
    comp = _compute(out)
    u = uniform(ctx, ctx.shape(self), comp, ctx.device(self))
    if ctx.is_tensor(p):
        p = ctx.convert(ctx.broadcast_to(p, ctx.shape(self)), comp)
    else:
        p = float(p)
    return ctx.convert(ctx.prim("lt", u, p), out)


@register_decomposition("aten.bernoulli.p")
def bernoulli_p(ctx: DecompContext, self: Value, p: float = 0.5, generator: Any = None
                ) -> Value:
    return _bernoulli(ctx, self, p)


@register_decomposition("aten.bernoulli.default")
def bernoulli(ctx: DecompContext, self: Value, generator: Any = None) -> Value:
    return _bernoulli(ctx, self, self)


@register_decomposition("aten.bernoulli.Tensor")
def bernoulli_tensor(ctx: DecompContext, self: Value, p: Value, generator: Any = None
                     ) -> Value:
    return _bernoulli(ctx, self, p)


@register_decomposition("aten.native_dropout.default")
def native_dropout(ctx: DecompContext, input: Value, p: float, train: bool | None
                   ) -> tuple[Value, Value]:
    """eager: mask = bernoulli(1 - p); output = input * mask * scale, rounded in that order
    (a dropped inf or NaN gives NaN); not training: (input, all-true mask)."""
    shape = ctx.shape(input)
    if train is False:
        return input, ctx.full(shape, True, DType.b8, ctx.device(input))
    dt = ctx.dtype(input)
    keep = 1.0 - float(p)
    scale = 0.0 if keep == 0 else 1.0 / keep
    u = uniform(ctx, shape, _compute(dt), ctx.device(input))
    mask = ctx.prim("lt", u, keep)
    comp = opmath(dt)
    x = ctx.convert(input, comp)
    y = ctx.prim("mul", ctx.prim("mul", x, ctx.convert(mask, comp)), scale)
    return ctx.convert(y, ctx.out_dtype(0)), ctx.convert(mask, ctx.out_dtype(1))
