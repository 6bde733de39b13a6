"""What the partitioned graphs keep alive: the min-cut saves a layer's weight rather than its
transposed copy, and a weight's gradient comes out of its matmul in the weight's own layout
(no transposed view for a kernel, or autograd's accumulation into `.grad`, to copy)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.autograd.joint import build_joint, joint_graph, partition_joint
from ember.autograd.testing import run_joint
from ember.ir import Graph, Node, Value, parse, verify

# y = tanh(x @ W1^T) @ W2^T, summed: two Linear layers as the decomposition writes them
LINEAR = """ember.ir 1.0

graph @f(%x: f32[8, 16], %w1: f32[32, 16], %w2: f32[4, 32]) -> (f32[]) {
  %t1 = prims.permute(%w1, dims=[1, 0]) : f32[16, 32]
  %h = prims.matmul(%x, %t1) : f32[8, 32]
  %a = prims.tanh(%h) : f32[8, 32]
  %t2 = prims.permute(%w2, dims=[1, 0]) : f32[32, 4]
  %y = prims.matmul(%a, %t2) : f32[8, 4]
  %s = prims.sum(%y, dims=[0, 1]) : f32[]
  return (%s)
}
"""


def _producers(g: Graph) -> dict[Value, Node]:
    return {r: n for n in g.nodes for r in n.results}


def test_min_cut_saves_weights_not_their_transposes() -> None:
    m = parse(LINEAR)
    fwd, bwd, report = partition_joint(m, joint_graph(m, inputs=[0, 1, 2]), "min-cut")
    saved = fwd.outputs[1:]
    made = _producers(fwd)
    assert not [v.name for v in saved if v in made and made[v].op == "prims.permute"]
    assert {"w1", "w2"} <= {v.name for v in saved}  # the caller holds them anyway
    # beyond its inputs the step keeps one [8, 32] activation (tanh's input or output)
    assert report.activation_bytes == 8 * 32 * 4
    assert report.saved_bytes > report.activation_bytes


def test_weight_gradients_come_out_in_the_weights_layout() -> None:
    m = build_joint(parse(LINEAR), inputs=[0, 1, 2], partitioner="min-cut")
    verify(m)
    bwd = m.graph("backward")
    made = _producers(bwd)
    for out in bwd.outputs[1:]:  # the weights' gradients
        assert made[out].op == "prims.matmul", made[out].op
    for n in bwd.nodes:  # no transpose of a product anywhere in the backward
        if n.op == "prims.permute":
            src = n.args[0]
            assert not (isinstance(src, Value) and src in made
                        and made[src].op == "prims.matmul")
    x, w1, w2 = torch.randn(8, 16), torch.randn(32, 16), torch.randn(4, 32)
    leaves = [t.clone().requires_grad_() for t in (x, w1, w2)]
    (torch.tanh(leaves[0] @ leaves[1].T) @ leaves[2].T).sum().backward()
    got = run_joint(m, [x, w1, w2], [torch.tensor(1.0)])
    torch.testing.assert_close(got, [t.grad for t in leaves])


# two layers in bf16 (neg between them) as the decomposition writes a low-precision linear: operands
# upcast to f32, one f32 product, rounded back to bf16 once
LINEAR_BF16 = """ember.ir 1.0

graph @f(%x: bf16[8, 16], %w1: bf16[32, 16], %w2: bf16[4, 32]) -> (f32[]) {
  %t1 = prims.permute(%w1, dims=[1, 0]) : bf16[16, 32]
  %x32 = prims.convert_element_type(%x, dtype=f32) : f32[8, 16]
  %t1f = prims.convert_element_type(%t1, dtype=f32) : f32[16, 32]
  %h32 = prims.matmul(%x32, %t1f) : f32[8, 32]
  %h = prims.convert_element_type(%h32, dtype=bf16) : bf16[8, 32]
  %a = prims.neg(%h) : bf16[8, 32]
  %t2 = prims.permute(%w2, dims=[1, 0]) : bf16[32, 4]
  %a32 = prims.convert_element_type(%a, dtype=f32) : f32[8, 32]
  %t2f = prims.convert_element_type(%t2, dtype=f32) : f32[32, 4]
  %y = prims.matmul(%a32, %t2f) : f32[8, 4]
  %s = prims.sum(%y, dims=[0, 1]) : f32[]
  return (%s)
}
"""


def test_bf16_weight_gradients_come_out_in_the_weights_layout() -> None:
    # the product is rounded to bf16 before the transpose's VJP sees it: still swapped, the
    # rounding kept (no [in, out] product plus a transposed copy of it alive together)
    m = build_joint(parse(LINEAR_BF16), inputs=[0, 1, 2], partitioner="min-cut")
    verify(m)
    bwd = m.graph("backward")
    made = _producers(bwd)
    for out in bwd.outputs[1:]:  # the weights' gradients: bf16, rounded from their product
        conv = made[out]
        assert conv.op == "prims.convert_element_type", conv.op
        src = conv.args[0]
        assert isinstance(src, Value) and made[src].op == "prims.matmul"
        assert list(src.type.shape) == list(out.type.shape)
    for n in bwd.nodes:  # no transpose of a (rounded) product anywhere in the backward
        src = n.args[0] if n.op == "prims.permute" else None
        while isinstance(src, Value) and src in made and \
                made[src].op == "prims.convert_element_type":
            src = made[src].args[0]
        assert not (isinstance(src, Value) and src in made and made[src].op == "prims.matmul")
    x, w1, w2 = (torch.randn(*s).bfloat16() for s in ((8, 16), (32, 16), (4, 32)))
    leaves = [t.clone().requires_grad_() for t in (x, w1, w2)]
    h = (leaves[0].float() @ leaves[1].T.float()).bfloat16()
    ((-h).float() @ leaves[2].T.float()).sum().backward()
    got = run_joint(m, [x, w1, w2], [torch.tensor(1.0)])
    # (neg is exact in bf16: every gradient is eager's, rounded at eager's points)
    torch.testing.assert_close(got, [t.grad for t in leaves])


def test_batched_transposed_products_keep_eagers_gradients() -> None:
    # attention's q @ k^T: the gradient of k comes out as (ct^T @ q), no transposed copy
    text = """ember.ir 1.0

graph @f(%q: f32[2, 5, 3], %k: f32[2, 5, 3]) -> (f32[2, 5, 5]) {
  %kt = prims.permute(%k, dims=[0, 2, 1]) : f32[2, 3, 5]
  %s = prims.matmul(%q, %kt) : f32[2, 5, 5]
  return (%s)
}
"""
    m = build_joint(parse(text))
    bwd = m.graph("backward")
    made = _producers(bwd)
    assert made[bwd.outputs[1]].op == "prims.matmul"
    q, k, ct = torch.randn(2, 5, 3), torch.randn(2, 5, 3), torch.randn(2, 5, 5)
    lq, lk = q.clone().requires_grad_(), k.clone().requires_grad_()
    (lq @ lk.transpose(1, 2)).backward(ct)
    torch.testing.assert_close(run_joint(m, [q, k], [ct]), [lq.grad, lk.grad])


def test_recomputation_happens_where_it_is_first_needed() -> None:
    # min-cut recomputes tanh in the backward; the joint order would put it first, live from
    # the backward's start. It is placed just before its first reader instead.
    m = parse(LINEAR)
    fwd, bwd, report = partition_joint(m, joint_graph(m, inputs=[0, 1, 2]), "min-cut")
    assert report.recomputed >= 1
    forward_names = {r.name for n in fwd.nodes for r in n.results}
    recomputed = [i for i, n in enumerate(bwd.nodes) if n.results[0].name in forward_names]
    assert recomputed and recomputed[0] > 0, [n.op for n in bwd.nodes]
    for i in recomputed:  # each is read by the node right after it, or by another recomputed one
        users = [j for j, n in enumerate(bwd.nodes) if bwd.nodes[i].results[0] in n.operands()]
        assert users and (users[0] == i + 1 or users[0] in recomputed), (i, users)


def test_same_padded_convolution_input_gradient_pads_in_the_convolution() -> None:
    # stride 1, padding 1, 3x3: the input gradient is a padding-1 convolution of the cotangent,
    # not a convolution of a padded copy of it (a buffer as large as the activation)
    text = """ember.ir 1.0

graph @f(%x: f32[2, 3, 6, 6], %w: f32[4, 3, 3, 3]) -> (f32[2, 4, 6, 6]) {
  %y = prims.convolution(%x, %w, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 6]
  return (%y)
}
"""
    m = build_joint(parse(text))
    bwd = m.graph("backward")
    assert not [n for n in bwd.nodes if n.op == "prims.pad"]
    x, w, ct = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 6, 6)
    lx, lw = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.nn.functional.conv2d(lx, lw, padding=1).backward(ct)
    torch.testing.assert_close(run_joint(m, [x, w], [ct]), [lx.grad, lw.grad])


# SwiGLU's gate: a matmul's output reshaped, then silu(gate) * up (the pointwise chain fuses)
GATED = """ember.ir 1.0

graph @f(%x: f32[8, 16], %wg: f32[16, 12], %wu: f32[16, 12]) -> (f32[]) {
  %g = prims.matmul(%x, %wg) : f32[8, 12]
  %gr = prims.reshape(%g, shape=[2, 4, 12]) : f32[2, 4, 12]
  %u = prims.matmul(%x, %wu) : f32[8, 12]
  %ur = prims.reshape(%u, shape=[2, 4, 12]) : f32[2, 4, 12]
  %n = prims.neg(%gr) : f32[2, 4, 12]
  %e = prims.exp(%n) : f32[2, 4, 12]
  %d = prims.add(%e, 1.0) : f32[2, 4, 12]
  %s = prims.div(%gr, %d) : f32[2, 4, 12]
  %h = prims.mul(%s, %ur) : f32[2, 4, 12]
  %o = prims.sum(%h, dims=[0, 1, 2]) : f32[]
  return (%o)
}
"""


def test_min_cut_saves_a_matmuls_output_not_its_view_or_a_fused_value() -> None:
    """A value the forward never writes (a view, or a pointwise value whose readers all fuse)
    costs twice its bytes in the cut: saving the matmul's own output instead costs the forward
    no copy and no extra write (as AOTAutograd weighs unmaterialized values)."""
    m = parse(GATED)
    fwd, bwd, _ = partition_joint(m, joint_graph(m, inputs=[1, 2]), "min-cut")
    made = _producers(fwd)
    saved = {made[v].op for v in fwd.outputs[1:] if v in made}
    assert saved == {"prims.matmul"}, saved
    x, wg, wu = torch.randn(8, 16), torch.randn(16, 12), torch.randn(16, 12)
    lg, lu = wg.clone().requires_grad_(), wu.clone().requires_grad_()
    (F.silu((x @ lg).reshape(2, 4, 12)) * (x @ lu).reshape(2, 4, 12)).sum().backward()
    got = run_joint(build_joint(m, inputs=[1, 2], partitioner="min-cut"), [x, wg, wu],
                    [torch.tensor(1.0)])
    torch.testing.assert_close(got, [lg.grad, lu.grad])
