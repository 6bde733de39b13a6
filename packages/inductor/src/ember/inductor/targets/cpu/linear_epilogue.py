"""What a packed linear (linear.py) folds of the nodes after its product: the bias, then GELU.

`F.linear(x, w, b)` decomposes to `add(broadcast_in_dim(b, [M, N], broadcast_dims=[1]),
matmul(x, w.T))`; oneDNN's linear adds the bias as it writes the product (the same f32 sum
of the same accumulator: bitwise the separate add), so the add kernel, or the bias loads of
the kernel the add fused into, are gone. A GELU after it (erf form, as `aten.gelu`
decomposes it), whose intermediate values only the GELU reads, is oneDNN's GELU post-op:
the GELU kernel's pass over the [M, N] activation is gone, and oneDNN's erf GELU is eager's
(torch's CPU GELU is oneDNN's eltwise: bitwise equal). The GELU may come after a reshape of
the 2-d product ([B*L, N] -> [B, L, N]): an elementwise function commutes with it; so may
the bias add (a matmul of a 3-d x that is not contiguous, Mixer's token MLP). Only a
product known to reach linear.py's SMALL_LINEAR takes the GELU: a smaller one is addmm, and
eager's GELU after it costs a torch call where the kernel it replaces cost ~2 us.

Measured (session 9, linear -> GELU -> linear compiled, the fold off vs on interleaved, 1
thread): erf GELU 256x256x1024 1562 -> 1465 us, 6272x96x384 5936 -> 5372 us; the bias alone
1406 -> 1358 us. Not folded: the tanh GELU (oneDNN's post-op was no faster than ember's
kernel: 1433 vs 1436 us, GPT-2 16.55 vs 16.70 ms), a residual add (oneDNN's binary add
post-op took longer than the product plus a separate add, 256x256x1024 918 vs 704 us),
SiLU/ReLU (no transformer here has one whose pass a fold would remove: llama's SiLU fuses
into the gate product's mul kernel), CLIP's x * sigmoid(1.702x) (torch's oneDNN call takes
no swish alpha).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import TypeAlias

from ember.inductor.lowering import _Lowering
from ember.ir import Node, TensorType, Value

# an expression over the pre-activation value U: (op, operand, ...), a number, or U
Pattern: TypeAlias = "str | float | tuple[Pattern, ...]"
U = "U"
_COMMUTATIVE = ("prims.add", "prims.mul")
_HALF_X = ("prims.mul", U, 0.5)
# aten.gelu's erf decomposition (prims/decomp/activations.py): x * 0.5 * (1 + erf(x / sqrt 2))
GELU_ERF: Pattern = ("prims.mul", _HALF_X,
                     ("prims.add", 1.0, ("prims.erf", ("prims.mul", U, math.sqrt(0.5)))))
# the op's act= attribute -> its pattern
ACTIVATIONS: dict[str, Pattern] = {"gelu": GELU_ERF}


@dataclass
class LinearEpilogue:
    """The bias ([N] value, or None) and the activation (an ACTIVATIONS key, or None) folded
    into a product, and what the lowering's driver does with the folded nodes."""
    bias: Value | None = None
    act: str | None = None
    folded: dict[Node, Value | None] = field(default_factory=dict)


def _f32(v: float) -> float:
    if not abs(v) < 3e38:  # (no f32, or beyond its range: no pattern constant)
        return v
    r: float = struct.unpack("f", struct.pack("f", v))[0]
    return r


def _defs(lw: _Lowering, v: object) -> Node | None:
    return v.node if isinstance(v, Value) else None


def _match(lw: _Lowering, v: object, pat: Pattern, u: Value, seen: list[Node]) -> bool:
    """`v` computes `pat` with U as `u`; the nodes matched are appended to `seen`."""
    if pat == U:
        return v is u
    if isinstance(pat, float):  # equal as the f32 constant the computation rounds it to
        return isinstance(v, (int, float)) and not isinstance(v, bool) and _f32(v) == _f32(pat)
    assert isinstance(pat, tuple)
    n = _defs(lw, v)
    if n is None or n.op != pat[0] or n.kwargs or len(n.args) != len(pat) - 1 \
            or len(n.results) != 1 or n.results[0].type != u.type:
        return False
    orders = [n.args, n.args[::-1]] if n.op in _COMMUTATIVE else [n.args]
    for args in orders:
        mark = len(seen)
        if all(_match(lw, a, p, u, seen) for a, p in zip(args, pat[1:], strict=True)):
            seen.append(n)
            return True
        del seen[mark:]
    return False


def _activation(lw: _Lowering, u: Value) -> tuple[str, list[Node]] | None:
    """The GELU computed from `u` by nodes that alone read `u` and each other's values (the
    last one's result excepted), if any: its act= name and its nodes, the result's last."""
    outputs = set(lw.g.outputs)
    if len(lw.readers(u)) > 4:  # (a GELU reads u at most 4 times)
        return None
    near: list[Node] = []  # the nodes within a GELU's depth of u: the candidate results
    frontier = [u]
    for _ in range(8):
        nxt = []
        for v in frontier:
            for r in lw.readers(v):
                if len(r.results) == 1 and r not in near and len(near) < 32:
                    near.append(r)
                    nxt.append(r.results[0])
        frontier = nxt
    for act, pat in ACTIVATIONS.items():
        for sink in near:
            seen: list[Node] = []
            if not _match(lw, sink.results[0], pat, u, seen):
                continue
            nodes = list(dict.fromkeys(seen))
            inside = set(nodes)
            if all(r in inside for n in nodes[:-1] for r in lw.readers(n.results[0])) \
                    and all(r in inside for r in lw.readers(u)) \
                    and not any(n.results[0] in outputs for n in nodes[:-1]):
                return act, nodes
    return None


def _bias(lw: _Lowering, y: Value, add: Node) -> Value | None:
    """The [N] value `add` adds to `y` ([M, N] or [..., N]) by broadcasting it along the last
    dim, if it does and is lowered already (a graph input, or a value before the product)."""
    if add.op != "prims.add" or add.kwargs or len(add.args) != 2 or y not in add.args \
            or add.results[0].type != y.type:
        return None
    other = add.args[1] if add.args[0] is y else add.args[0]
    bc = _defs(lw, other)
    t = y.type
    if bc is None or bc.op != "prims.broadcast_in_dim" or other is y \
            or not isinstance(t, TensorType) or bc.kwargs.get("broadcast_dims") != [t.rank - 1]:
        return None
    b = bc.args[0]
    if not isinstance(b, Value) or not isinstance(b.type, TensorType) \
            or list(b.type.shape) != [t.shape[-1]] or b.type.dtype != t.dtype \
            or not (b in lw.g.params or b in lw.env):
        return None
    return b


def _row_view(lw: _Lowering, y: Value, r: Node, outputs: set[Value]) -> Value | None:
    """The result of `r` if it reshapes the [M, N] product `y` to [..., N] (a matmul of a
    3-d x: the bias add comes after it) and only one node reads it."""
    v = r.results[0] if r.op == "prims.reshape" and len(r.results) == 1 else None
    if v is None or v in outputs or len(lw.readers(v)) != 1 \
            or not isinstance(v.type, TensorType) or not isinstance(y.type, TensorType) \
            or v.type.shape[-1] != y.type.shape[-1]:
        return None
    return v


def linear_epilogue(lw: _Lowering, product: Node, activation: bool = True) -> LinearEpilogue:
    """The bias add and (if `activation`) the GELU after `product` (a prims.matmul to become
    a packed linear) that its extern can compute instead, as module docstring says."""
    epi = LinearEpilogue()
    outputs = set(lw.g.outputs)
    y = product.results[0]
    cur = y  # the value the extern's result stands for so far
    rs = lw.readers(y)
    if y not in outputs and len(rs) == 1:
        # the add on the product, or on its row-keeping reshape (each row of N stays a row:
        # the bias along the last dim is the bias along the product's columns)
        base = _row_view(lw, y, rs[0], outputs) or y
        add = lw.readers(base)[0]
        b = _bias(lw, base, add)
        if b is not None:
            epi.bias = b
            epi.folded[add] = base
            cur = add.results[0]
    if cur in outputs or not activation:
        return epi
    rs = lw.readers(cur)
    # the GELU reads the 2-d value, or its reshape (the product's [B*L, N] as [B, L, N])
    view = rs[0] if len(rs) == 1 and rs[0].op == "prims.reshape" else None
    u = view.results[0] if view is not None else cur
    if view is not None and u in outputs:
        return epi
    found = _activation(lw, u)
    if found is not None:
        epi.act, nodes = found
        epi.folded.update({n: None for n in nodes[:-1]})
        epi.folded[nodes[-1]] = u  # the GELU's result: the (reshaped) extern result
    return epi


__all__ = ["ACTIVATIONS", "LinearEpilogue", "linear_epilogue"]
