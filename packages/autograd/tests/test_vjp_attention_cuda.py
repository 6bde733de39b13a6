"""The VJP rules of torch's fused CUDA attention forms (autograd/vjp/attention_cuda.py), on the
IR: each form's joint graph calls its own backward kernel with the forward's output,
logsumexp and random state, and the bias gradient follows eager. (The kernels run on a GPU
only: numerics are checked in Triton's interpreter with CPU stand-ins,
packages/inductor/tests/test_cuda_training_interp.py, and on the device,
packages/runtime/tests/test_training_cuda.py.)"""

from __future__ import annotations

import pytest

from ember.autograd.joint import joint_graph, partition_joint
from ember.autograd.vjp import VJPError
from ember.ir import Module, Node, Value, parse, verify

T = "f32[1, 2, 4, 8]"
FORMS = {
    "flash": ("aten._scaled_dot_product_flash_attention.default(%q, %k, %v, 0.0, true, "
              "scale=0.25) : (" + T + ", f32[1, 2, 4], i64, i64, u64[2], u64[], f32[0])", 7),
    "efficient": ("aten._scaled_dot_product_efficient_attention.default(%q, %k, %v, BIAS, "
                  "LSE, 0.0, true) : (" + T + ", f32[1, 2, 32], i64[], i64[])", 4),
    "cudnn": ("aten._scaled_dot_product_cudnn_attention.default(%q, %k, %v, BIAS, LSE, 0.0, "
              "true) : (" + T + ", f32[1, 2, 4, 1], i64, i64, i64[], i64[])", 6),
}


def module(form: str, bias: bool = False, lse: bool = True) -> Module:
    call, n = FORMS[form]
    call = call.replace("BIAS", "%b" if bias else "none").replace("LSE", str(lse).lower())
    names = ", ".join(["%o", *(f"%r{i}" for i in range(1, n))])
    params = f"%q: {T}, %k: {T}, %v: {T}" + (", %b: f32[1, 2, 4, 4]" if bias else "")
    return parse(f"ember.ir 1.0\n\ngraph @f({params}) -> ({T}) {{\n  {names} = {call}\n"
                 f"  return (%o)\n}}\n")


def backward_call(g: object, form: str) -> Node:
    nodes = [n for n in g.nodes if n.op.endswith("_backward.default")]  # type: ignore[attr-defined]
    assert len(nodes) == 1 and form in nodes[0].op, [n.op for n in nodes]
    return nodes[0]


@pytest.mark.parametrize("form", list(FORMS))
def test_the_backward_kernel_reads_the_forwards_output_logsumexp_and_random_state(
        form: str) -> None:
    m = module(form)
    j = joint_graph(m, inputs=[0, 1, 2])
    fwd = j.nodes[0]  # (the joint graph's own copy of the forward node)
    assert fwd.op == m.graph().nodes[0].op
    out, lse = fwd.results[0], fwd.results[1]
    call = backward_call(j, form)
    read = [a for a in call.args if isinstance(a, Value)]
    assert out in read and lse in read
    # the random state: flash's rng_state/unused, the others' philox seed and offset
    state = {"flash": fwd.results[4:6], "efficient": fwd.results[2:4],
             "cudnn": fwd.results[4:6]}[form]
    assert all(s in read for s in state)
    assert call.kwargs.get("scale") == fwd.kwargs.get("scale")
    assert [r for r in j.outputs[1:]] == list(call.results[:3])  # dq, dk, dv
    # partitioned: the backward reads the saved output and logsumexp, never recomputes the
    # kernel (an extern) or keeps a score matrix
    m2 = m.clone()
    f, b, _ = partition_joint(m2, j, "min-cut")
    assert [n.op for n in f.nodes] == [fwd.op]
    assert not any(n.op == fwd.op for n in b.nodes)
    m2.items.clear()
    m2.items["forward"], m2.items["backward"] = f, b
    verify(m2)


@pytest.mark.parametrize("form", ["flash", "cudnn"])
def test_max_q_and_max_k_are_the_static_sequence_lengths(form: str) -> None:
    call = backward_call(joint_graph(module(form), inputs=[0, 1, 2]), form)
    assert [a for a in call.args if isinstance(a, int) and not isinstance(a, bool)] == [4, 4]


def test_efficient_bias_gets_the_kernels_gradient_only_where_it_needs_one() -> None:
    j = joint_graph(module("efficient", bias=True), inputs=[0, 1, 2, 3])
    call = backward_call(j, "efficient")
    assert [True, True, True, True] in call.args and len(call.results) == 4
    assert j.outputs[-1] is call.results[3]
    j = joint_graph(module("efficient", bias=True), inputs=[0, 1, 2])
    call = backward_call(j, "efficient")
    assert [True, True, True, False] in call.args and len(call.results) == 3


def test_cudnn_bias_that_needs_a_gradient_is_refused_as_eager_refuses_it() -> None:
    joint_graph(module("cudnn", bias=True), inputs=[0, 1, 2])  # a fixed mask: fine
    with pytest.raises(VJPError, match="attn_bias has no derivative"):
        joint_graph(module("cudnn", bias=True), inputs=[0, 1, 2, 3])


@pytest.mark.parametrize("form", ["efficient", "cudnn"])
def test_no_logsumexp_is_a_clear_error(form: str) -> None:
    with pytest.raises(VJPError, match="compute_log_sumexp=False"):
        joint_graph(module(form, lse=False), inputs=[0, 1, 2])
