"""Per-channel affine epilogues of 2-d convolutions (BatchNorm in eval mode, then ReLU or ReLU6).

`(conv(x, w) - mean) * rsqrt(var + eps) * gamma + beta`, then `max(., 0)`, is
`relu(conv(x, w * A[o]) + B[o])` with `A`, `B` per output channel: the lowering folds such a
chain into the convolution (oneDNN applies the bias as it writes the result), so no kernel
reads and writes the activation again. The ReLU is ember's own NaN-propagating max (a kernel
that fuses into the result's pointwise reader, or torch's relu_ inside the convolution's extern
when only convolutions read it), never oneDNN's ReLU post-op, which maps NaN to 0 where
torch.relu keeps it (BatchNorm with a negative running variance gives NaN). `A` and `B` (and
the scaled weight) are small kernels computed on every call from the graph's inputs, so
parameters changed between calls (running statistics, weights) are read as they are then; a
parameter weight's packed `weight * A` is cached by packed.py, which compares A by value and
the weight's version each call. Folding rounds differently from the unfolded chain (as
TorchInductor's freezing does): within f32 tolerances. A ReLU followed by min(., c) (ReLU6,
hardtanh(0, c)) folds too, as `relu_max=c`: a clamp to [0, c] that keeps NaN (torch.clamp_
inside the extern, or the max/min kernel), never oneDNN's hardtanh post-op, which drops NaN.
So does SiLU, y / (1 + exp(-y)) (`silu=true`: torch's silu_ inside the extern, eager's own
kernel, or the same prims in a kernel), and hardswish, y * min(max(y + 3, 0), 6) / 6
(`hardswish=true`: torch's hardswish_ inside the extern, eager's own kernel; mobilenetv3's
activation, each one a pass over the activation otherwise). A residual add after the steps (`residual=true`, the
residual the last operand) is oneDNN's binary add post-op where the weight is packed (the
convolution writes conv + bias + residual in one pass, the add kernel is gone), else a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.ir import DType, Graph, Node, TensorType, Value

AFFINE_OPS = ("prims.sub", "prims.add", "prims.mul", "prims.div")
Operand = Value | float  # a per-channel [C] vector, or a number


@dataclass
class Epilogue:
    conv: Node
    steps: list[tuple[str, Operand]] = field(default_factory=list)  # y = y <op> operand
    relu: bool = False
    relu_max: float | None = None  # ReLU6-like: min(relu(y), relu_max) after the ReLU
    silu: bool = False  # y / (1 + exp(-y)) instead of a ReLU
    hardswish: bool = False  # y * min(max(y + 3, 0), 6) / 6 instead of a ReLU
    residual: Value | None = None  # y + residual (same shape) after the steps, before relu
    chain: list[Node] = field(default_factory=list)  # the nodes folded, in order

    @property
    def last(self) -> Node:
        return self.chain[-1]


def _per_channel(g_defs: dict[Value, Node], v: object, t: TensorType) -> Operand | None:
    """`v` as a per-channel operand of a [N, C, H, W] value: a number, or a broadcast of a
    [C] vector along dim 1."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if not isinstance(v, Value):
        return None
    d = g_defs.get(v)
    if d is None or d.op != "prims.broadcast_in_dim" or d.kwargs.get("broadcast_dims") != [1]:
        return None
    u = d.args[0]
    if not isinstance(u, Value) or not isinstance(u.type, TensorType) \
            or list(u.type.shape) != [t.shape[1]] or u.type.dtype != t.dtype:
        return None
    return u


def _clamp_max(relu: Node, readers: dict[Value, list[Node]], outputs: set[Value]
               ) -> float | None:
    """c where the ReLU's only reader is min(relu, c) with a number c >= 0 (ReLU6)."""
    y = relu.results[0]
    if y in outputs or len(readers.get(y, [])) != 1:
        return None
    r = readers[y][0]
    if r.op != "prims.minimum" or len(r.args) != 2 or r.kwargs or r.results[0].type != y.type:
        return None
    a, b = r.args
    c = b if a is y else a if b is y else None
    if not isinstance(c, (int, float)) or isinstance(c, bool) or not c >= 0:
        return None  # (also refuses a NaN bound)
    return float(c)


def _silu(y: Value, readers: dict[Value, list[Node]], outputs: set[Value]) -> list[Node]:
    """The nodes of SiLU as prims write it, y / (1 + exp(-y)) (neg, exp, add, div: y read by
    the neg and the div, each other value by the next node only), or []."""
    rs = readers.get(y, [])
    if len(rs) != 2:
        return []
    neg = next((r for r in rs if r.op == "prims.neg" and r.args == [y] and not r.kwargs), None)
    div = next((r for r in rs if r.op == "prims.div" and len(r.args) == 2 and r.args[0] is y
                and not r.kwargs), None)
    chain = [neg]
    for op in ("prims.exp", "prims.add"):
        prev = chain[-1]
        v = prev.results[0] if prev is not None and len(prev.results) == 1 else None
        nxt = readers.get(v, []) if v is not None and v not in outputs else []
        r = nxt[0] if len(nxt) == 1 else None
        if r is None or r.op != op or r.kwargs or r.results[0].type != y.type:
            return []
        one = [a for a in r.args if a is not v] if op == "prims.add" else [1.0]
        if len(one) != 1 or not isinstance(one[0], (int, float)) or isinstance(one[0], bool) \
                or one[0] != 1:
            return []
        chain.append(r)
    last = chain[-1]
    assert last is not None
    if div is None or div.args[1] is not last.results[0] or last.results[0] in outputs \
            or readers.get(last.results[0]) != [div] or div.results[0].type != y.type:
        return []
    return [n for n in [*chain, div] if n is not None]


def _number(v: object, want: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == want


def _hardswish(y: Value, readers: dict[Value, list[Node]], outputs: set[Value]) -> list[Node]:
    """The nodes of hardswish as the decomposition writes it, y * min(max(y + 3, 0), 6) / 6
    (add, maximum, minimum, mul, div: y read by the add and the mul, each other value by the
    next node only), or []."""
    rs = readers.get(y, [])
    if len(rs) != 2:
        return []
    add = next((r for r in rs if r.op == "prims.add" and len(r.args) == 2 and y in r.args
                and _number(r.args[1] if r.args[0] is y else r.args[0], 3)), None)
    mul = next((r for r in rs if r.op == "prims.mul" and len(r.args) == 2 and y in r.args),
               None)
    if add is None or mul is None or add is mul:
        return []
    chain = [add]
    for op, c in (("prims.maximum", 0), ("prims.minimum", 6)):
        v = chain[-1].results[0]
        nxt = readers.get(v, []) if v not in outputs else []
        r = nxt[0] if len(nxt) == 1 else None
        if r is None or r.op != op or r.kwargs or len(r.args) != 2 or r.args[0] is not v \
                or not _number(r.args[1], c) or r.results[0].type != y.type:
            return []
        chain.append(r)
    gate = chain[-1].results[0]
    if gate in outputs or readers.get(gate) != [mul] or mul.kwargs \
            or [a for a in mul.args if a is not y] != [gate] \
            or mul.results[0].type != y.type:
        return []
    p = mul.results[0]
    nxt = readers.get(p, []) if p not in outputs else []
    div = nxt[0] if len(nxt) == 1 else None
    if div is None or div.op != "prims.div" or div.kwargs or len(div.args) != 2 \
            or div.args[0] is not p or not _number(div.args[1], 6) \
            or div.results[0].type != y.type:
        return []
    return [*chain, mul, div]


def conv_epilogues(g: Graph) -> dict[Node, Epilogue]:
    """Each f32 2-d convolution whose result feeds, through single-reader nodes that are not
    graph outputs, a chain of per-channel add/sub/mul/div, optionally ended by max(., 0)
    (and then min(., c): ReLU6), by SiLU or by hardswish; a residual add of a tensor of the result's type
    may come after the per-channel steps (before the activation)."""
    readers: dict[Value, list[Node]] = {}
    defs: dict[Value, Node] = {}
    for n in g.nodes:
        for res in n.results:
            defs[res] = n
        for v in n.operands():
            readers.setdefault(v, []).append(n)
    outputs = set(g.outputs)
    found: dict[Node, Epilogue] = {}
    claimed: set[int] = set()
    for n in g.nodes:
        t = n.results[0].type if n.results else None
        if n.op != "prims.convolution" or not isinstance(t, TensorType) or t.rank != 4 \
                or t.dtype != DType.f32:
            continue
        epi = Epilogue(n)
        cur = n.results[0]
        while cur not in outputs:
            silu = _silu(cur, readers, outputs)
            if silu:
                epi.silu = True
                epi.chain += silu
                break
            hswish = _hardswish(cur, readers, outputs)
            if hswish:
                epi.hardswish = True
                epi.chain += hswish
                break
            if len(readers.get(cur, [])) != 1:
                break
            r = readers[cur][0]
            if len(r.args) != 2 or r.results[0].type != cur.type or r.kwargs:
                break
            a, b = r.args
            zero = b if a is cur else a
            if r.op == "prims.maximum" and (a is cur or b is cur) \
                    and isinstance(zero, (int, float)) and not isinstance(zero, bool) \
                    and zero == 0:
                epi.relu = True
                epi.chain.append(r)
                epi.relu_max = _clamp_max(r, readers, outputs)
                if epi.relu_max is not None:
                    epi.chain.append(readers[r.results[0]][0])
                break
            other = b if a is cur else a if r.op in ("prims.add", "prims.mul") else None
            if r.op not in AFFINE_OPS or epi.residual is not None:
                break  # (steps after the residual would scale it too: not folded)
            op = _per_channel(defs, other, t) if other is not None and other is not cur \
                else None
            if op is None and r.op == "prims.add" and isinstance(other, Value) \
                    and other is not cur and other.type == t and id(r) not in claimed:
                # (claimed: two convolution chains meeting in one add, as a ResNet's
                # downsample branch and main branch do: the first one takes it)
                epi.residual = other  # a residual add: oneDNN's binary post-op
                epi.chain.append(r)
                cur = r.results[0]
                continue
            if op is None:
                break
            epi.steps.append((r.op, op))
            epi.chain.append(r)
            cur = r.results[0]
        if epi.chain:
            found[n] = epi
            claimed.update(id(m) for m in epi.chain)
    return found


__all__ = ["Epilogue", "conv_epilogues"]
