"""The layout of saved activations: a CPU convolution's output is saved channels-last.

The CPU target computes 2-d f32 convolutions channels-last (oneDNN's fast layout; the
inductor's conv-nhwc pass): the forward's convolution output is an NHWC buffer its readers
index through a permuted view. Saved for the backward as the [N, C, H, W] value the prims graph
names, it cost a transposing copy kernel per convolution at the end of the forward (an extra
pass over the activation, and its memory), and the backward then read it NCHW while its
convolution gradients (`loop.conv2d_backward_nhwc`) want NHWC again.

`channels_last_saved(forward, backward)` saves each such value (and a saved convolution input
computed in the forward, e.g. a ReLU's output: conv-nhwc writes it NHWC for the convolution)
as its NHWC permute instead:
@forward returns `prims.permute(%y, dims=[0, 2, 3, 1])` (lowered, the NHWC buffer itself: a
permute of a permuted view is the buffer), and @backward takes the [N, H, W, C] tensor and reads
`prims.permute(%y_nhwc, dims=[0, 3, 1, 2])` where it read %y (a view its kernels index: no
copy). The values are the same; only the saved tensor's dim order changes, so it holds for every
backend (the interpreter permutes a view). It applies only to CPU graphs (a GPU target has its
own layouts), and `plan_training` runs it after the partitioner.

Then `nhwc_backward(backward)` carries that layout through the backward's pointwise chains
(BatchNorm's and ReLU's gradients): each elementwise prim whose 4-d operands all have an NHWC
twin, and each broadcast of a per-channel (or per-sample-and-channel) vector to 4-d, is
computed on NHWC tensors; a reduction over such a value reads the twin with its dims renamed;
a convolution gradient's 4-d result gets a twin (its NHWC permute, which the CPU target's
`loop.conv2d_backward_nhwc` writes as it is). A value still read in NCHW order is the permute
of its twin. Lowered, every full-size buffer of the backward is then written and read in NHWC
order: kernels read the saved NHWC activations contiguously, and the cotangent of each
convolution gradient is already the NHWC buffer it takes (before, kernels iterated NCHW over
NHWC operands: strided loads in the inner loop).
"""

from __future__ import annotations

from ember.ir import DType, Graph, Node, TensorType, Value
from ember.ir.graph import fresh_name
from ember.prims import PRIMS_BY_OP

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
POS = [TO_NHWC.index(d) for d in range(4)]  # where NCHW dim d sits in NHWC
CONVOLUTION = "prims.convolution"


def _channels_last(v: Value, conv_inputs: set[Value]) -> bool:
    """A 2-d f32 convolution's output or input (not a graph input) on the CPU with concrete
    channels (conv-nhwc's case: the forward has it as an NHWC buffer)."""
    t = v.type
    return v.node is not None and (v.node.op == CONVOLUTION or v in conv_inputs) \
        and isinstance(t, TensorType) and t.rank == 4 and t.dtype == DType.f32 \
        and isinstance(t.shape[1], int) and t.device in (None, "cpu") and 0 not in t.shape


def _permuted_type(t: TensorType, dims: list[int]) -> TensorType:
    return TensorType(t.dtype, tuple(t.shape[d] for d in dims), None, t.device)


def channels_last_saved(forward: Graph, backward: Graph) -> int:
    """Save CPU convolution outputs NHWC (module doc), in place; returns how many."""
    s = forward.attrs.get("saved")
    if not isinstance(s, int) or s <= 0:
        return 0
    k = len(forward.outputs) - s
    names = {v.name for g in (forward, backward) for v in g.params} \
        | {r.name for g in (forward, backward) for n in g.nodes for r in n.results}

    def fresh(base: str) -> str:
        return fresh_name(base, names)

    done = 0
    front: list[Node] = []
    conv_inputs = {n.args[0] for n in forward.nodes if n.op == CONVOLUTION
                   and isinstance(n.args[0], Value)}
    for i in range(s):
        v, p = forward.outputs[k + i], backward.params[i]
        if not _channels_last(v, conv_inputs) or not isinstance(p.type, TensorType) \
                or list(p.type.shape) != list(v.type.shape):  # type: ignore[union-attr]
            continue
        t = v.type
        assert isinstance(t, TensorType)
        cl = Value(fresh(f"{v.name}.nhwc"), _permuted_type(t, TO_NHWC))
        cl.node = Node("prims.permute", [v], {"dims": list(TO_NHWC)}, [cl], v.node.loc
                       if v.node is not None else None)
        forward.nodes.append(cl.node)
        forward.outputs[k + i] = cl
        forward.result_types[k + i] = cl.type
        # the backward's parameter becomes the NHWC tensor; its old Value, defined by the
        # permute back, keeps every reader as it was
        pc = Value(fresh(f"{p.name}.nhwc"), _permuted_type(t, TO_NHWC))
        back = Node("prims.permute", [pc], {"dims": list(TO_NCHW)}, [p])
        p.node, p.index = back, 0
        backward.params[i] = pc
        front.append(back)
        done += 1
    backward.nodes[:0] = front
    if done:
        nhwc_backward(backward, names)
    return done


def _rank4(v: object) -> bool:
    return isinstance(v, Value) and isinstance(v.type, TensorType) and v.type.rank == 4


def nhwc_backward(g: Graph, names: set[str]) -> None:
    """Compute the backward's 4-d pointwise chains on NHWC twins (module doc), in place;
    `names` holds the names taken (new ones are added)."""
    def fresh(base: str) -> str:
        return fresh_name(base, names)

    twin: dict[Value, Value] = {}
    out: list[Node] = []
    made: set[int] = set()  # the nodes written here (only those may be dropped as dead)

    def permute(v: Value, dims: list[int], at: Node, result: Value | None = None) -> Value:
        t = v.type
        assert isinstance(t, TensorType)
        r = result or Value(fresh(f"{v.name}.nhwc"), _permuted_type(t, dims))
        r.node, r.index = Node("prims.permute", [v], {"dims": list(dims)}, [r], at.loc), 0
        out.append(r.node)
        made.add(id(r.node))
        return r

    def swap(n: Node, args: list[object], kwargs: dict[str, object]) -> None:
        """n's NHWC twin (args/kwargs given); n's result becomes a permute of it."""
        r = n.results[0]
        t = r.type
        assert isinstance(t, TensorType)
        y = Value(fresh(f"{r.name}.nhwc"), _permuted_type(t, TO_NHWC))
        y.node = Node(n.op, args, kwargs, [y], n.loc)
        out.append(y.node)
        made.add(id(y.node))
        permute(y, TO_NCHW, n, r)
        twin[r] = y

    for n in g.nodes:
        prim = PRIMS_BY_OP.get(n.op)
        r = n.results[0] if len(n.results) == 1 else None
        if n.op == "prims.permute" and n.kwargs.get("dims") == TO_NCHW and _rank4(n.args[0]) \
                and r is not None:
            out.append(n)
            x = n.args[0]
            assert isinstance(x, Value)
            twin[r] = x
        elif prim is not None and prim.elementwise and r is not None and _rank4(r) \
                and all(a in twin for a in n.operands()) and any(True for _ in n.operands()) \
                and not any(isinstance(a, list) for a in n.args):
            swap(n, [twin[a] if isinstance(a, Value) else a for a in n.args], dict(n.kwargs))
        elif n.op == "prims.broadcast_in_dim" and r is not None and _rank4(r) \
                and isinstance(n.kwargs.get("broadcast_dims"), list) \
                and isinstance(n.kwargs.get("shape"), list):
            given = n.kwargs["broadcast_dims"]
            assert isinstance(given, list)
            bd = [POS[d] for d in given if isinstance(d, int)]
            if len(bd) != len(given) or bd != sorted(set(bd)):
                out.append(n)
                continue
            shape = n.kwargs["shape"]
            assert isinstance(shape, list)
            swap(n, list(n.args), {**n.kwargs, "shape": [shape[d] for d in TO_NHWC],
                                   "broadcast_dims": bd})
        elif prim is not None and prim.reduction is not None and n.args \
                and n.args[0] in twin and isinstance(n.kwargs.get("dims"), list):
            given = n.kwargs["dims"]
            assert isinstance(given, list)
            dims = [d for d in given if isinstance(d, int)]
            kept = [POS[d] for d in range(4) if d not in dims]
            if kept == sorted(kept):  # the result's dims keep their order
                n.args = [twin[n.args[0]], *n.args[1:]]
                n.kwargs = {**n.kwargs, "dims": sorted(POS[d] for d in dims)}
            out.append(n)
        else:
            out.append(n)
            for res in n.results:  # a convolution gradient's result: NHWC from the target
                if _rank4(res) and n.op.startswith("aten.convolution_backward"):
                    twin[res] = permute(res, TO_NHWC, n)
    # drop what no longer has a reader (the NCHW values the twins replaced, unused twins)
    used = set(g.outputs)
    keep: list[Node] = []
    for n in reversed(out):
        if id(n) in made and not any(r in used for r in n.results):
            continue
        keep.append(n)
        used.update(n.operands())
    g.nodes = keep[::-1]


__all__ = ["channels_last_saved"]
