"""The op database's "vjp" check: an aten op decomposed to prims, differentiated with the VJP
rules (`build_joint`), run forward then backward on the reference interpreter, against
`torch.autograd.grad` of the eager op with the same random cotangents.

`check_vjp(entry, sample, seed)` raises AssertionError on a mismatch. `mask(sample)`, where
given, names the elements (a bool tensor broadcastable to the op's result) where eager follows
a convention the prims cannot see (relu at 0); gradients are not compared there (an input
broadcast into the result: wherever it reaches a masked element). Each use is listed with its
reason in the test's table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ember.autograd.joint import build_joint
from ember.ir import Interpreter, Module, TensorType, parse, verify
from ember.ir.torch_ops import call_torch, resolve
from ember.prims.decomp.random import with_philox_inputs
from ember.testing.harness import decomposed
from ember.testing.opdb import OpEntry, Sample

Mask = Callable[[Sample], "torch.Tensor | None"]

# Gradients of f16/bf16 ops: eager's backward kernels round per op (or compute in f32 and round
# once) where the decomposition's graph rounds at other places: a few ulps of the half type.
HALF_TOL = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex)


def leaves(sample: Sample, frozen: frozenset[int] = frozenset()
           ) -> tuple[Sample, list[torch.Tensor]]:
    """The sample with every tensor a fresh leaf (floating ones requiring grad, except at the
    argument positions in `frozen`), in the order `op_module` makes them parameters; and those
    leaves."""
    made: list[torch.Tensor] = []

    def leaf(v: Any, pos: int) -> Any:
        if isinstance(v, torch.Tensor):
            # detach() is a view: the layout (strides) is kept
            t = v.detach().requires_grad_(_is_float(v) and pos not in frozen)
            made.append(t)
            return t
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(leaf(x, pos) for x in v)
        return v

    args = tuple(leaf(a, i) for i, a in enumerate(sample.args))
    kwargs = {k: leaf(v, len(args) + i) for i, (k, v) in enumerate(sample.kwargs.items())}
    return Sample(args, kwargs), made


_NOT_DIFF = re.compile(r"not differentiable with respect to argument '(\w+)'")


@dataclass
class EagerGrads:
    cts: list[torch.Tensor | None]  # per selected result: its cotangent (None: not a float)
    differentiable: list[int]  # the results that require grad in eager
    wrt: list[int]  # the inputs (parameter order) eager differentiates
    grads: list[torch.Tensor | None]  # per input: eager's gradient (None: unused / not wrt)
    outputs: list[Any]  # the selected results


def eager_grads(op: str, sample: Sample, results: Sequence[int] | None, seed: int
                ) -> EagerGrads:
    """Call the eager op on leaves and take `torch.autograd.grad` with random cotangents.
    Arguments eager refuses to differentiate (batch norm's running stats) are left out."""
    overload = resolve(op)
    assert overload is not None, op
    names = [a.name for a in overload._schema.arguments]
    frozen: set[int] = set()
    while True:
        s, made = leaves(sample, frozenset(frozen))
        try:
            out = call_torch(overload, list(s.args), dict(s.kwargs))
            break
        except RuntimeError as e:
            m = _NOT_DIFF.search(str(e))
            if m is None or m.group(1) not in names:
                raise
            name = m.group(1)
            pos = names.index(name) if names.index(name) < len(s.args) else \
                len(s.args) + list(s.kwargs).index(name)
            if pos in frozen:
                raise
            frozen.add(pos)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if results is not None:
        outs = [outs[i] for i in results]
    gen = torch.Generator().manual_seed(seed)
    cts: list[torch.Tensor | None] = [
        torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
        if _is_float(o) else None for o in outs]
    diff = [i for i, o in enumerate(outs) if cts[i] is not None and o.requires_grad]
    wrt = [i for i, t in enumerate(made) if t.requires_grad]
    grads: list[torch.Tensor | None] = [None] * len(made)
    if diff and wrt:
        got = torch.autograd.grad([outs[i] for i in diff], [made[i] for i in wrt],
                                  [cts[i] for i in diff], allow_unused=True)
        for i, g in zip(wrt, got, strict=True):
            grads[i] = g
    return EagerGrads(cts, diff, wrt, grads, [o.detach() if isinstance(o, torch.Tensor) else o
                                              for o in outs])


def joint_module(op: str, sample: Sample, results: Sequence[int] | None,
                 inputs: Sequence[int] | None = None, outputs: Sequence[int] | None = None,
                 symbolic: bool = False) -> tuple[Module, list[Any]]:
    """The decomposed op's @forward/@backward module (verified, round-tripped) and inputs."""
    d, args = decomposed(op, sample, symbolic, results)
    m = build_joint(d, inputs=inputs, outputs=outputs)
    verify(m)
    text = str(m)
    assert str(parse(text)) == text, "the joint module does not round-trip"
    return m, args


def run_joint(m: Module, inputs: list[Any], cts: Sequence[torch.Tensor | None]
              ) -> list[torch.Tensor]:
    """Forward, then backward with the cotangents of the outputs the joint graph took."""
    fwd, bwd = m.graph("forward"), m.graph("backward")
    interp = Interpreter(m)
    args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    res = interp.run(with_philox_inputs(fwd, args), "forward").outputs
    n_saved = fwd.attrs["saved"]
    assert isinstance(n_saved, int)
    saved = res[len(res) - n_saved:] if n_saved else []
    tangents = bwd.attrs["tangents"]
    assert isinstance(tangents, list)
    ct_in: list[torch.Tensor] = []
    for i in tangents:
        assert isinstance(i, int)
        c = cts[i] if i < len(cts) else None
        assert c is not None, f"eager gives no cotangent for output {i}"
        want = bwd.params[len(bwd.params) - len(tangents) + len(ct_in)].type
        # where eager's result dtype differs from the graph's (group norm's f32 mean of a
        # bf16 input, compared by the entry's own rule), the graph's dtype is what it takes
        ct_in.append(c.to(want.dtype.torch) if isinstance(want, TensorType) else c)
    return list(interp.run([*saved, *ct_in], "backward").outputs)


def _reduce_mask(m: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
    """A result-shaped mask as a mask of an input broadcast into the result."""
    if m is None:
        return None
    while m.dim() > len(shape):
        m = m.any(0)
    for d, n in enumerate(shape):
        if m.dim() == len(shape) and m.shape[d] != n and n == 1:
            m = m.any(d, keepdim=True)
    try:
        return m.expand(shape)
    except RuntimeError:  # not broadcast-compatible: mask it all if anything is masked
        return torch.full(shape, bool(m.any()))


def check_vjp(entry: OpEntry, sample: Sample, seed: int = 0, mask: Mask | None = None,
              tol: Mapping[torch.dtype, tuple[float, float]] | None = None,
              symbolic: bool = False) -> bool:
    """Compare the joint graph's input gradients with eager's; False when eager differentiates
    nothing here (no result requires grad, or no input does)."""
    e = eager_grads(entry.op, sample, entry.results, seed)
    if not e.differentiable or not e.wrt:
        # eager differentiates nothing: the joint graph of every float input and result must
        # agree (zero gradients; random draws, comparisons, creation stop them)
        m, inputs = joint_module(entry.op, sample, entry.results, symbolic=symbolic)
        tangents = m.graph("backward").attrs["tangents"]
        assert isinstance(tangents, list)
        if tangents:
            cts = [c if c is not None else torch.zeros(0) for c in e.cts]
            for i, g in enumerate(run_joint(m, inputs, cts)):
                assert not g.any(), f"{entry.op}: eager gives no gradient, the joint graph " \
                                    f"gives a nonzero one for its input {i}"
        return False
    m, inputs = joint_module(entry.op, sample, entry.results, e.wrt, e.differentiable,
                             symbolic)
    got = run_joint(m, inputs, e.cts)
    # inf/NaN in the inputs or results: eager's fused backward formulas and the prim-by-prim
    # chain rule meet them in different products (0 * inf), so only elements where both
    # gradients are finite are compared
    special = not all(bool(t.isfinite().all()) for t in [*inputs, *e.outputs]
                      if _is_float(t))
    # a sample mixing f16/bf16 with wider tensors: gradients of the wide ones carry the half
    # type's rounding (of a cotangent, of a product eager rounds), so the half tolerance
    halves = [HALF_TOL[t.dtype] for t in [*inputs, *e.outputs]
              if isinstance(t, torch.Tensor) and t.dtype in HALF_TOL]
    half = max(halves) if halves else None
    for i, g in zip(e.wrt, got, strict=True):
        x = inputs[i]
        eg = e.grads[i]
        w = eg if eg is not None else torch.zeros_like(x)
        assert g.shape == w.shape and g.dtype == w.dtype, \
            f"input {i}: gradient {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}"
        skip = _reduce_mask(mask(sample), tuple(g.shape)) if mask is not None else None
        if special:
            both = g.isfinite() & w.isfinite()
            skip = ~both if skip is None else skip | ~both
        if skip is not None:
            g, w = g.masked_fill(skip, 0), w.masked_fill(skip, 0)
        # the widest that applies: the check's per-op table, the entry's, the half types'
        # (of the gradient's dtype, or of any f16/bf16 tensor in the sample)
        cands = [(tol or {}).get(w.dtype), entry.tolerance(w.dtype), HALF_TOL.get(w.dtype),
                 half]
        t = max((c for c in cands if c is not None), default=None)
        kw: dict[str, Any] = {"rtol": t[0], "atol": t[1]} if t else {}
        prefix = f"{entry.op}: gradient of input {i}: "
        torch.testing.assert_close(g, w, equal_nan=True, **kw,
                                   msg=lambda msg: prefix + msg)  # noqa: B023 (used at once)
    return True
