"""The CUDA target keeps torch's fused attention as one extern (issue 16, item 3), without a GPU.

Graphs are captured on the CPU, retyped onto cuda:0, and their CPU flash attention node is
rewritten into the form sdpa dispatches to on a GPU (`cuda_form_of_cpu_attention`: flash
without a mask, memory-efficient with one), then compiled by the CUDA front end and
`inductor-cuda` (code generation only). Checked: the op stays one extern on strided views of
q/k/v (no copy kernels, no softmax kernel), its output's head merge is a reshape of the
[B, L, H, E] buffer the kernel writes, a bias whose rows are not 16-element aligned is padded
as eager's sdpa pads it, and the extern's types agree with torch's meta kernels. Numerics run
on the device (packages/prims/tests/test_attention_cuda.py); here the same lowering runs on a
CPU graph in Triton's interpreter with a CPU stand-in for the CUDA kernels (their math through
eager sdpa), which checks the views, the heads-last output and the bias padding numerically.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.indexing import affine_view, parse_index
from ember.inductor.launch import strided_view
from ember.inductor.targets import targets, unregister_target
from ember.inductor.targets.cuda import FRONT, register_cuda_target
from ember.inductor.targets.cuda.attention import (
    EFFICIENT,
    FLASH,
    HEADS_LAST,
    cuda_form_of_cpu_attention,
)
from ember.ir import Module, Node, Value, parse
from ember.ir.passes import run_pipeline
from ember.prims.decomp.context import DecompositionError
from ember.testing.triton_mode import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY


@pytest.fixture(autouse=True, scope="module")
def _cuda_target() -> Iterator[None]:
    """The cuda target's lowering rules, registered for this file only (it registers itself
    only where CUDA is; other files check what happens without it)."""
    had = targets().get("cuda") is not None
    register_cuda_target()
    yield
    if not had:
        unregister_target("cuda")


_TYPE = re.compile(r"((?:f16|bf16|f32|f64|i64|b8)\[[^\]]*\](?:\{[^}]*\})?)(?!@)")
B, L, H, E = 2, 8, 2, 16
D = H * E


def block(x: torch.Tensor, w: torch.Tensor, o: torch.Tensor,
          mask: torch.Tensor | None = None) -> torch.Tensor:
    """An attention layer: one qkv linear split into heads, sdpa, heads merged, projected."""
    b, t, _ = x.shape
    q, k, v = (u.reshape(b, t, H, E).transpose(1, 2) for u in (x @ w).split(D, -1))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return y.transpose(1, 2).reshape(b, t, D) @ o


def decode(x: torch.Tensor, mem: torch.Tensor, w: torch.Tensor, o: torch.Tensor,
           mask: torch.Tensor) -> torch.Tensor:
    """A decode step: one query row against S keys/values, a [B, 1, 1, S] mask."""
    b, t, _ = x.shape
    s = mem.shape[1]
    q = (x @ w[:, :D]).reshape(b, t, H, E).transpose(1, 2)
    k, v = ((mem @ u).reshape(b, s, H, E).transpose(1, 2) for u in w[:, D:].split(D, -1))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return y.transpose(1, 2).reshape(b, t, D) @ o


def compiled(*args: torch.Tensor, front: str = FRONT) -> Module:
    with torch.no_grad():
        c = capture(block, args, {})
    assert c.module is not None
    on_cuda = cuda_form_of_cpu_attention(parse(_TYPE.sub(r"\1@cuda:0", str(c.module))))
    return run_pipeline(on_cuda, f"{front},inductor-cuda")


def inputs(S: int | None = None) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, L if S is None else S, D, generator=g)
    w, o = torch.randn(D, 3 * D, generator=g), torch.randn(D, D, generator=g)
    if S is None:
        return x, w, o
    return x, w, o, torch.randn(B, 1, S, S, generator=g)


def nodes(m: Module) -> list[Node]:
    return [n for g in m.graphs.values() for n in g.nodes]


def attention(m: Module) -> Node:
    (n,) = [n for n in nodes(m) if n.kwargs.get("op") == HEADS_LAST]
    return n


def test_attention_is_one_extern_on_strided_views_with_no_softmax_kernel() -> None:
    m = compiled(*inputs())
    n = attention(m)
    assert n.kwargs["kernel"] == FLASH
    assert "kept whole" in str(n.kwargs["why"])  # the decision, in the dump
    for a in n.args[:3]:  # q, k, v: strided views of the qkv GEMM's output, never copies
        assert isinstance(a, Value) and a.node is not None
        assert a.node.op == "kernels.extern" or a.node.kwargs.get("op") == "loop.view", a.node
    assert not any(n.op == "kernels.call" for n in nodes(m))  # no softmax, no head copies
    # the head merge reads the [B, L, H, E] buffer as it is: a reshape view, no copy kernel
    (out,) = n.results[:1]
    readers = [r for r in nodes(m) if out in list(r.operands())]
    assert readers and all(r.kwargs.get("op") == "prims.reshape" for r in readers), readers


def test_decomposed_attention_makes_more_kernels() -> None:
    """Without keep_cuda_attention the same graph has a softmax kernel and head copies."""
    kept = compiled(*inputs())
    decomposed = compiled(*inputs(), front="decompose,cse,dce")
    count = lambda m: sum(1 for n in nodes(m) if n.op == "kernels.call")  # noqa: E731
    assert not any(n.kwargs.get("op") == HEADS_LAST for n in nodes(decomposed))
    # the kept graph is two GEMMs and the attention extern: no Triton kernel at all; decomposed,
    # a softmax kernel (its row max and sum fused in) and the head merge's copy
    assert (count(kept), count(decomposed)) == (0, 2)


def _bias_strides(m: Module, n: Node) -> tuple[list[int], int, Any]:
    bias = n.args[3]
    assert isinstance(bias, Value) and bias.node is not None
    view = bias.node
    assert view.kwargs.get("op") == "loop.view", view
    src = view.args[0]
    assert isinstance(src, Value)
    shape = [int(d) for d in src.type.shape]  # type: ignore[union-attr]
    index = [parse_index(e) for e in view.kwargs["index"]]  # type: ignore[union-attr]
    aff = affine_view(index, len(view.kwargs["shape"]))  # type: ignore[arg-type]
    assert aff is not None
    t = strided_view(torch.empty(shape), [int(d) for d in view.kwargs["shape"]],  # type: ignore[union-attr]
                     aff[0], aff[1])
    return list(t.stride()), t.storage_offset(), shape


@pytest.mark.parametrize("S", [7, 16])
def test_bias_rows_are_aligned_as_eager_pads_them(S: int) -> None:
    m = compiled(*inputs(S))
    n = attention(m)
    assert n.kwargs["kernel"] == EFFICIENT
    strides, offset, src_shape = _bias_strides(m, n)
    assert src_shape[-1] % 16 == 0  # 7 -> padded to 16 before the broadcast; 16 as it is
    assert offset % 16 == 0 and all(s % 16 == 0 for s in strides[:-1]), strides
    assert strides[1] == 0  # the mask's broadcast over heads stays a stride, not a copy
    padded = "prims.pad" in str(run_pipeline(
        cuda_form_of_cpu_attention(parse(_TYPE.sub(r"\1@cuda:0", str(
            capture(block, inputs(S), {}).module)))), f"{FRONT},cuda-attention"))
    assert padded == (S % 16 != 0)


@pytest.mark.parametrize("S", [None, 7])
def test_extern_types_agree_with_torch_meta_kernels(S: int | None) -> None:
    m = compiled(*inputs(S))
    n = attention(m)
    metas = []
    for a in n.args:
        if isinstance(a, Value):
            t = a.type
            metas.append(torch.empty([int(d) for d in t.shape], device="meta",  # type: ignore[union-attr]
                                     dtype=torch.float32))
        else:
            metas.append(a)
    op = torch.ops.aten._scaled_dot_product_flash_attention.default if S is None else \
        torch.ops.aten._scaled_dot_product_efficient_attention.default
    kw = {k: v for k, v in n.kwargs.items() if k not in ("op", "kernel", "why")}
    want = op(*metas, **kw)
    got = n.results
    assert list(got[0].type.shape) == list(want[0].transpose(1, 2).shape)  # type: ignore[union-attr]
    assert got[1].type.dtype.name == "f32" and want[1].dtype == torch.float32  # type: ignore[union-attr]
    # the IR has no results for the kernel's None ones (cum_seq_q/k of dense inputs)
    for r, w in zip(got[1:], [w for w in want[1:] if w is not None], strict=True):
        if isinstance(w, torch.Tensor):
            assert list(r.type.shape) == list(w.shape), (r.type, w.shape)  # type: ignore[union-attr]


def test_dropout_is_not_kept() -> None:
    """The front end keeps only what the extern can run as eager does: with dropout the op goes
    to its decomposition, which refuses it (eager's random numbers cannot be matched)."""
    text = ("ember.ir 1.0\n\ngraph @f(%q: f32[1, 2, 4, 8]@cuda:0) -> (f32[1, 2, 4, 8]@cuda:0) {\n"
            "  %o, %l, %a, %b, %c, %d, %e = aten._scaled_dot_product_flash_attention.default("
            "%q, %q, %q, DROPOUT) : (f32[1, 2, 4, 8]@cuda:0, f32[1, 2, 4]@cuda:0, "
            "i64[]@cuda:0, i64[]@cuda:0, i64[]@cuda:0, i64[]@cuda:0, f32[0]@cuda:0)\n"
            "  return (%o)\n}\n")
    keep = parse(text.replace("DROPOUT", "0.0"))
    drop = parse(text.replace("DROPOUT", "0.5"))
    ops = lambda m: {n.op for n in m.graph().nodes}  # noqa: E731
    assert FLASH in ops(run_pipeline(keep, FRONT))
    assert FLASH not in ops(run_pipeline(keep, "decompose,cse,dce"))
    with pytest.raises(DecompositionError, match="dropout_p=0.5"):
        run_pipeline(drop, FRONT)


def _stand_in(name: str) -> Any:
    """The op's record with a CPU reference: eager sdpa's output, zeros for the rest (unused)."""
    from ember.ir.torch_ops import torch_opdef
    real = torch_opdef(name)
    assert real is not None

    def run(interp: Any, args: list[Any], kw: dict[str, Any]) -> Any:
        q, k, v = args[:3]
        bias = args[3] if name == EFFICIENT else None
        causal = bool(args[6] if name == EFFICIENT else args[4]) if len(args) > 4 else False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal,
                                             scale=kw.get("scale"))
        if name == FLASH:
            return (out, torch.zeros(out.shape[:-1]), 0, 0, torch.zeros(2, dtype=torch.uint64),
                    torch.zeros((), dtype=torch.uint64), torch.zeros(0))
        return (out, torch.zeros(*out.shape[:2], 0), torch.zeros((), dtype=torch.int64),
                torch.zeros((), dtype=torch.int64))
    return dataclasses.replace(real, reference=run)


@pytest.mark.parametrize("S", [None, 7, 16, "decode"])
def test_lowering_matches_eager_in_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                   S: int | str | None) -> None:
    from ember.inductor.backend import compiled_runner
    from ember.inductor.targets import targets
    from ember.inductor.targets.cuda.attention import LOWERINGS
    from ember.ir.registry import default_registry
    for op, rule in LOWERINGS.items():  # the CUDA target's rule, on this CPU graph
        monkeypatch.setitem(targets()["cpu"].lowerings, op, rule)  # type: ignore[index]
    reg = default_registry()
    for op in (FLASH, EFFICIENT):
        reg.register(_stand_in(op))  # unregistered below
    try:
        fn: Any = decode if S == "decode" else block
        if S == "decode":
            g = torch.Generator().manual_seed(1)
            args = tuple(torch.randn(*s, generator=g) for s in
                         ((B, 1, D), (B, 7, D), (D, 3 * D), (D, D), (B, 1, 1, 7)))
        else:
            args = inputs(S)  # type: ignore[arg-type]
        with torch.no_grad():
            c = capture(fn, args, {})
        assert c.module is not None
        m = run_pipeline(cuda_form_of_cpu_attention(c.module),
                         f"{FRONT},inductor-cuda-interpret")
        assert attention(m).kwargs["kernel"] == (FLASH if S is None else EFFICIENT)
        got = compiled_runner(m)(None, list(args)).outputs[0]
        want = fn(*args)  # the graph returns the product's [B*L, D] matrix (a view of it)
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    finally:
        for op in (FLASH, EFFICIENT):
            reg.unregister(op)
