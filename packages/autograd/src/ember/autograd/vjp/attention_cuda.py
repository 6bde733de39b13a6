"""VJP rules of torch's fused CUDA attention: each form's own backward kernel, one extern call.

On a GPU, sdpa dispatches to `_scaled_dot_product_flash_attention`, `_efficient_attention` or
`_cudnn_attention`, and the CUDA front end keeps the form whole
(`decompose{keep_cuda_attention=true}`, no dropout, static shapes). Differentiated, each one is
torch's matching backward kernel, called as derivatives.yaml calls it: the forward's output,
its logsumexp and its random state (flash: rng_state/unused, the memory-efficient and cuDNN
kernels: philox seed and offset) are forward results the backward reads, so the partitioner
saves them (an extern's results are never recomputed) and the backward recomputes the
probabilities from the logsumexp instead of keeping the [L, S] matrix. Decomposed instead,
the scores and probabilities would be saved or recomputed as GEMMs and a softmax.

The IR has no results for the ones torch's meta kernel leaves None (flash's cum_seq_q/k of
dense inputs, cuDNN's debug mask): `_schema_results` lines the node's results up with the
schema's return positions by running the meta kernel, so the rule holds across torch versions
that rename returns (flash's philox_seed/offset became rng_state/unused).

Gradients of the attention bias follow eager: the memory-efficient kernel computes one
(grad_input_mask's last entry, asked only where the bias needs a gradient), cuDNN's backward
has none (derivatives.yaml does not differentiate its attn_bias): a bias that needs a gradient
there is a VJPError, as eager's backward raises.
"""

from __future__ import annotations

from typing import Any

from ember.autograd.vjp.core import Grad, VJPContext, VJPError, is_float_tensor, vjp
from ember.ir import Node, TensorType, Value

FLASH = "aten._scaled_dot_product_flash_attention.default"
EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
CUDNN = "aten._scaled_dot_product_cudnn_attention.default"
BACKWARD = {op: op.replace(".default", "_backward.default") for op in (FLASH, EFFICIENT, CUDNN)}


def _arg(node: Node, at: int, name: str, default: Any) -> Any:
    return node.args[at] if len(node.args) > at else node.kwargs.get(name, default)


def _meta(a: Any) -> Any:
    from ember.ir.torch_ops import meta_tensor

    if isinstance(a, Value):
        if not isinstance(a.type, TensorType):
            return 1  # a scalar value's number does not change which results are None
        return meta_tensor(a.type, {})
    if isinstance(a, list):
        return [_meta(x) for x in a]
    return a


def _schema_results(node: Node) -> list[Value | None]:
    """The node's results at the positions of its schema's returns (None where the meta kernel
    gives None, which the IR leaves out)."""
    from ember.ir.torch_ops import resolve

    op = resolve(node.op)
    if op is None:
        raise VJPError(f"{node.op}: not an operator of this torch")
    try:
        out = op(*[_meta(a) for a in node.args], **{k: _meta(v) for k, v in node.kwargs.items()})
    except Exception as e:  # symbolic sizes, or a torch whose meta kernel refuses the call
        raise VJPError(f"{node.op}: its meta kernel cannot say which results it returns "
                       f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    outs = list(out) if isinstance(out, tuple) else [out]
    if sum(o is not None for o in outs) != len(node.results):
        raise VJPError(f"{node.op}: {len(node.results)} result(s) in the graph, the meta kernel "
                       f"of this torch returns {sum(o is not None for o in outs)}")
    it = iter(node.results)
    return [None if o is None else next(it) for o in outs]


def _scale(node: Node) -> dict[str, Any]:
    s = node.kwargs.get("scale")
    return {} if s is None else {"scale": s}


def _size(x: Any, dim: int, fallback: Value | None) -> Any:
    """max_q/max_k of dense inputs: the sequence length (a literal where static, so no scalar
    crosses from the forward graph into the backward's)."""
    d = x.type.shape[dim] if isinstance(x, Value) and isinstance(x.type, TensorType) else None
    return int(d) if isinstance(d, int) else fallback


def _lse(node: Node, res: list[Value | None], flag_at: int | None) -> Value:
    lse = res[1]
    if flag_at is not None and _arg(node, flag_at, "compute_log_sumexp", False) is not True:
        raise VJPError(f"{node.op} with compute_log_sumexp=False has no logsumexp for its "
                       f"backward kernel (sdpa asks for it whenever an input requires grad)")
    if lse is None:
        raise VJPError(f"{node.op}: the forward returns no logsumexp for its backward kernel")
    return lse


def _qkv(node: Node, got: list[Value]) -> list[Grad]:
    grads: list[Grad] = [*got[:3], *([None] * (len(node.args) - 3))]
    return [g if is_float_tensor(a) else None for a, g in zip(node.args, grads, strict=True)]


@vjp(FLASH)
def _flash(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    q, k, v = node.args[:3]
    ct = cts[0]
    assert ct is not None
    res = _schema_results(node)
    out, lse = res[0], _lse(node, res, None)
    got = ctx.op(BACKWARD[FLASH], ct, q, k, v, out, lse, res[2], res[3],
                 _size(q, 2, res[4]), _size(k, 2, res[5]), _arg(node, 3, "dropout_p", 0.0),
                 _arg(node, 4, "is_causal", False), res[6], res[7], **_scale(node))
    return _qkv(node, got)


@vjp(EFFICIENT)
def _efficient(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    q, k, v, bias = node.args[:4]
    ct = cts[0]
    assert ct is not None
    res = _schema_results(node)
    out, lse = res[0], _lse(node, res, 4)
    with_bias = ctx.needs_grad(bias)
    got = ctx.op(BACKWARD[EFFICIENT], ct, q, k, v, bias, out, lse, res[2], res[3],
                 _arg(node, 5, "dropout_p", 0.0), [True, True, True, with_bias],
                 _arg(node, 6, "is_causal", False), **_scale(node))
    grads = _qkv(node, got)
    if with_bias:
        grads[3] = got[3]
    return grads


@vjp(CUDNN)
def _cudnn(ctx: VJPContext, node: Node, cts: list[Value | None]) -> list[Grad]:
    q, k, v, bias = node.args[:4]
    ct = cts[0]
    assert ct is not None
    if ctx.needs_grad(bias):
        raise VJPError(f"{CUDNN}: its attn_bias has no derivative (torch's cuDNN attention "
                       f"backward computes none; eager's backward raises as well)")
    res = _schema_results(node)
    out, lse = res[0], _lse(node, res, 4)
    got = ctx.op(BACKWARD[CUDNN], ct, q, k, v, out, lse, res[6], res[7], bias, res[2], res[3],
                 _size(q, 2, res[4]), _size(k, 2, res[5]), _arg(node, 5, "dropout_p", 0.0),
                 _arg(node, 6, "is_causal", False), **_scale(node))
    return _qkv(node, got)


__all__ = ["BACKWARD", "CUDNN", "EFFICIENT", "FLASH"]
