"""Views feeding extern ops: slices, selects, expands, permutes and reshapes of inputs and of
intermediates, read by gather, matmul and concatenate, lowered (`loop.view` strided views, or
copies where a view is not affine) and compiled, against eager. Also the lowering of
concatenate and pad as index rewrites, and the index simplification that keeps reshapes affine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.indexing import affine_view, flat_offset, ivar, simplify_index
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Interpreter, parse, verify
from ember.ir.expr import FloorDiv, PyMod
from ember.ir.passes import run_pipeline


@dataclass
class _Prog:
    """A prims graph under construction and the same computation in eager torch."""

    lines: list[str] = field(default_factory=list)
    k: int = 0

    def add(self, op: str, args: str, attrs: str, t: torch.Tensor) -> str:
        name = f"v{self.k}"
        self.k += 1
        dt = {torch.float32: "f32", torch.int64: "i64"}[t.dtype]
        sep = ", " if attrs and args else ""
        self.lines.append(f"  %{name} = prims.{op}({args}{sep}{attrs}) : "
                          f"{dt}{list(t.shape)}")
        return name


def _view_step(draw: Any, p: _Prog, name: str, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    kind = draw(st.sampled_from(["slice", "select", "expand", "permute", "merge", "split"]))
    shape = list(x.shape)
    if kind == "slice":
        start, limit, step = [], [], []
        for n in shape:
            s = draw(st.integers(0, n - 1))
            start.append(s)
            limit.append(draw(st.integers(s + 1, n)))
            step.append(draw(st.sampled_from([1, 2])))
        y = x[tuple(slice(a, b, c) for a, b, c in zip(start, limit, step, strict=True))]
        return p.add("slice", f"%{name}", f"start={start}, limit={limit}, step={step}", y), y
    if kind == "select" and len(shape) > 2:
        d = draw(st.integers(0, len(shape) - 1))
        i = draw(st.integers(0, shape[d] - 1))
        lo = [0] * len(shape)
        hi = list(shape)
        lo[d], hi[d] = i, i + 1
        s = x.narrow(d, i, 1)
        sn = p.add("slice", f"%{name}", f"start={lo}, limit={hi}, step={[1] * len(shape)}", s)
        y = s.squeeze(d)
        return p.add("squeeze", f"%{sn}", f"dims=[{d}]", y), y
    if kind == "expand" and len(shape) < 4:
        n = draw(st.integers(1, 3))
        y = x.unsqueeze(0).expand(n, *shape)
        dims = list(range(1, len(shape) + 1))
        return p.add("broadcast_in_dim", f"%{name}", f"shape={list(y.shape)}, "
                     f"broadcast_dims={dims}", y), y
    if kind == "permute":
        perm = draw(st.permutations(range(len(shape))))
        y = x.permute(*perm)
        return p.add("permute", f"%{name}", f"dims={list(perm)}", y), y
    if kind == "merge" and len(shape) > 2:
        y = x.reshape(*shape[:-2], shape[-2] * shape[-1])
        return p.add("reshape", f"%{name}", f"shape={list(y.shape)}", y), y
    if kind == "split" and len(shape) < 4 and shape[-1] % 2 == 0:
        y = x.reshape(*shape[:-1], 2, shape[-1] // 2)
        return p.add("reshape", f"%{name}", f"shape={list(y.shape)}", y), y
    return name, x


@st.composite
def view_programs(draw: Any) -> tuple[str, list[torch.Tensor], list[torch.Tensor]]:
    """(IR text, inputs, eager outputs): views of an input or intermediate into an extern."""
    shape = draw(st.lists(st.integers(1, 4), min_size=2, max_size=3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g)
    p = _Prog()
    params = [f"%x: f32{shape}"]
    inputs = [x]
    name, cur = "x", x
    if draw(st.booleans()):  # an intermediate rather than the input itself
        cur = -x
        name = p.add("neg", "%x", "", cur)
    for _ in range(draw(st.integers(1, 3))):
        name, cur = _view_step(draw, p, name, cur)
    consumer = draw(st.sampled_from(["matmul_lhs", "matmul_rhs", "concatenate", "gather"]))
    if cur.dim() < 2:
        consumer = "concatenate"
    if consumer == "matmul_lhs":
        w = torch.randn(*cur.shape[:-2], cur.shape[-1], 3, generator=g)  # prims: same rank
        params.append(f"%w: f32{list(w.shape)}")
        inputs.append(w)
        out = torch.matmul(cur, w)
        res = p.add("matmul", f"%{name}, %w", "", out)
    elif consumer == "matmul_rhs":
        w = torch.randn(*cur.shape[:-2], 2, cur.shape[-2], generator=g)
        params.append(f"%w: f32{list(w.shape)}")
        inputs.append(w)
        out = torch.matmul(w, cur)
        res = p.add("matmul", f"%w, %{name}", "", out)
    elif consumer == "concatenate":
        neg = -cur
        nn = p.add("neg", f"%{name}", "", neg)
        d = draw(st.integers(0, cur.dim() - 1))
        out = torch.cat([cur, neg, cur], d)
        res = p.add("concatenate", f"[%{name}, %{nn}, %{name}]", f"dim={d}", out)
    else:
        d = cur.dim() - 1
        ishape = [*cur.shape[:-1], draw(st.integers(1, 3))]
        idx = torch.randint(0, cur.shape[-1], ishape, generator=g)
        params.append(f"%i: i64{ishape}")
        inputs.append(idx)
        out = torch.gather(cur, d, idx)
        res = p.add("gather", f"%{name}, %i", f"dim={d}", out)
    # the view is read again by a pointwise kernel: the extern's view must not change it
    twice = cur * 2.0
    tw = p.add("mul", f"%{name}, 2.0", "", twice)
    dt = "f32"
    text = (f"ember.ir 1.0\n\ngraph @f({', '.join(params)}) -> ({dt}{list(out.shape)}, "
            f"{dt}{list(twice.shape)}) {{\n" + "\n".join(p.lines) +
            f"\n  return (%{res}, %{tw})\n}}\n")
    return text, inputs, [out, twice]


@settings(max_examples=60, deadline=None)
@given(view_programs())
def test_views_into_externs_lower_like_eager(prog: tuple[str, list[Any], list[Any]]) -> None:
    text, inputs, want = prog
    m = parse(text)
    verify(m)
    low = run_pipeline(m, "lower-loops,fuse", verify_each=True)
    assert str(parse(str(low))) == str(low)
    torch.testing.assert_close(Interpreter(low).run(inputs).outputs, want)


@settings(max_examples=8, deadline=None)
@given(view_programs())
def test_views_into_externs_compile_like_eager(prog: tuple[str, list[Any], list[Any]]) -> None:
    text, inputs, want = prog
    compiled = compile_module(parse(text))
    run = compiled_runner(compiled)  # the generated wrapper (strided views, buffer reuse)
    torch.testing.assert_close(run(None, inputs).outputs, want)
    torch.testing.assert_close(Interpreter(compiled).run(inputs).outputs, want)


BERT = """ember.ir 1.0

graph @f(%a: i64[1, 512], %p: i64[1, 512]) -> (i64[4, 128]) {
  %s = aten.slice.Tensor(%p, 1, 0, 128) : i64[1, 128]
  %x = aten.expand.default(%a, [1, -1]) : i64[1, 512]
  %e = aten.gather.default(%x, 1, %s) : i64[1, 128]
  %y = aten.expand.default(%e, [4, 128]) : i64[4, 128]
  return (%y)
}
"""


def test_bert_position_ids_slice_into_gather() -> None:
    """The slice of position ids read by gather was passed unsliced (an identity permute of the
    base): the view's index rewrite must survive into the extern's operand."""
    a = torch.arange(512).reshape(1, 512) * 3
    p = torch.randperm(512).reshape(1, 512)
    want = torch.gather(a, 1, p[:, :128]).expand(4, 128)
    compiled = compile_module(parse(BERT))
    views = [n for n in compiled.graph().nodes if n.op == "kernels.view"]
    assert [n.kwargs["shape"] for n in views] == [[1, 128]]  # no copy of the slice
    torch.testing.assert_close(compiled_runner(compiled)(None, [a, p]).outputs[0], want)


CAT_PAD = """ember.ir 1.0

graph @f(%a: f32[4, 3, 8], %b: f32[4, 3, 8], %c: f32[4, 5, 8]) -> (f32[4, 8, 8], f32[6, 5, 9]) {
  %n = prims.neg(%b) : f32[4, 3, 8]
  %x = prims.concatenate([%a, %n, %c], dim=1) : f32[4, 11, 8]
  %s = prims.slice(%x, start=[0, 2, 0], limit=[4, 10, 8], step=[1, 1, 1]) : f32[4, 8, 8]
  %p = prims.pad(%c, 2.5, config=[[1, 1, 0], [-1, 1, 0], [0, 1, 0]]) : f32[6, 5, 9]
  return (%s, %p)
}
"""


def test_concatenate_and_pad_are_kernels_not_externs() -> None:
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(4, n, 8, generator=g) for n in (3, 3, 5))
    want = [torch.cat([a, -b, c], 1)[:, 2:10],
            torch.constant_pad_nd(c, [0, 1, -1, 1, 1, 1], 2.5)]
    m = parse(CAT_PAD)
    low = run_pipeline(m, "lower-loops,fuse", verify_each=True)
    assert {n.op for n in low.graph().nodes} == {"loop.pointwise"}
    torch.testing.assert_close(Interpreter(low).run([a, b, c]).outputs, want)
    compiled = compile_module(m)
    torch.testing.assert_close(compiled_runner(compiled)(None, [a, b, c]).outputs, want)


def test_reshape_indices_fold_to_affine() -> None:
    """[4, 128, 1024] read as [512, 1024] and back: plain affine indices, so the C++ inner loop
    is contiguous (no // or mod per element)."""
    i0, i1, i2 = ivar(0), ivar(1), ivar(2)
    rng = {i0: 512, i1: 256}
    assert simplify_index(FloorDiv(256 * i0 + i1, 32768), rng) == FloorDiv(i0, 128)
    assert simplify_index(PyMod(256 * i0 + i1, 256), rng) == i1
    assert simplify_index(FloorDiv(128 * i0 + i1, 128), {i0: 4, i1: 128}) == i0
    assert simplify_index(PyMod(FloorDiv(i0, 4), 8), {}) == PyMod(FloorDiv(i0, 4), 8)
    flat = 1024 * i0 + 32 * i1 + i2
    split = [FloorDiv(flat, 1024), PyMod(FloorDiv(flat, 32), 32), PyMod(flat, 32)]
    assert flat_offset(split, [4, 32, 32]) == flat
    assert flat_offset([FloorDiv(i0, 128), PyMod(i0, 128), i1], [4, 128, 1024]) == 1024 * i0 + i1
    assert affine_view([i0 * 3 + 2, 0, i1], 2) == ([2, 0, 0], [[3, 0], [0, 0], [0, 1]])
    assert affine_view([FloorDiv(i0, 2)], 1) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.data())
def test_simplified_indices_have_the_same_values(shape: list[int], data: Any) -> None:
    """simplify_index never changes an index's value over the loop ranges."""
    vs = [ivar(k) for k in range(len(shape))]
    coefs = data.draw(st.lists(st.integers(-8, 8), min_size=len(shape), max_size=len(shape)))
    d = data.draw(st.integers(1, 12))
    e = sum((c * v for c, v in zip(coefs, vs, strict=True)), data.draw(st.integers(0, 9)))
    kind = data.draw(st.sampled_from([FloorDiv, PyMod]))
    inner = kind(e, d)
    outer = data.draw(st.sampled_from([None, FloorDiv, PyMod]))
    expr = outer(inner, data.draw(st.integers(1, 5))) if outer else inner
    simp = simplify_index(expr, dict(zip(vs, shape, strict=True)))
    grid = torch.cartesian_prod(*[torch.arange(n) for n in shape]).reshape(-1, len(shape))
    for row in grid.tolist():
        env = dict(zip(vs, row, strict=True))
        assert int(expr.subs(env)) == int(simp.subs(env) if not isinstance(simp, int) else simp)
    assert math.prod(shape) == len(grid)


CONV = """ember.ir 1.0

graph @f(%x: f32[2, 3, 9, 8], %w1: f32[4, 3, 3, 3], %w2: f32[6, 2, 3, 1]) -> (f32[2, 6, 5, 8], f32[2, 4, 9, 8]) {
  %c1 = prims.convolution(%x, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 9, 8]
  %r = prims.maximum(%c1, 0.0) : f32[2, 4, 9, 8]
  %c2 = prims.convolution(%r, %w2, stride=[2, 1], padding=[1, 0], dilation=[1, 1], groups=2) : f32[2, 6, 5, 8]
  return (%c2, %r)
}
"""


def test_convolutions_run_channels_last_like_eager() -> None:
    """Each 2-d convolution reads an NHWC buffer written by the kernel before it (the ReLU
    fused into that copy) and is read back through a permuted view."""
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(s, generator=g) for s in ([2, 3, 9, 8], [4, 3, 3, 3], [6, 2, 3, 1]))
    r = torch.relu(torch.conv2d(x, w1, padding=1))
    want = [torch.conv2d(r, w2, stride=(2, 1), padding=(1, 0), groups=2), r]
    compiled = compile_module(parse(CONV))
    ops = [n.kwargs.get("op") for n in compiled.graph().nodes if n.op == "kernels.extern"]
    assert ops == ["loop.conv2d_packed", "loop.conv2d_packed"]  # weights are graph inputs
    torch.testing.assert_close(compiled_runner(compiled)(None, [x, w1, w2]).outputs, want)
    torch.testing.assert_close(Interpreter(compiled).run([x, w1, w2]).outputs, want)


CHAIN = """ember.ir 1.0

graph @f(%x: f32[8, 16], %w: f32[16, 16]) -> (f32[8, 16], f32[8, 16]) {
  %a = prims.exp(%x) : f32[8, 16]
  %m = prims.matmul(%a, %w) : f32[8, 16]
  %b = prims.sin(%m) : f32[8, 16]
  %m2 = prims.matmul(%b, %w) : f32[8, 16]
  %c = prims.cos(%m2) : f32[8, 16]
  %m3 = prims.matmul(%c, %w) : f32[8, 16]
  %d = prims.tanh(%m3) : f32[8, 16]
  return (%d, %a)
}
"""


def test_plan_buffers_reuses_dead_buffers_never_outputs() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g) / 4
    a = torch.exp(x)
    c = torch.cos(torch.sin(a @ w) @ w)
    want = [torch.tanh(c @ w), a]
    compiled = compile_module(parse(CHAIN))
    gr = compiled.graph()
    reused = {r for n in gr.nodes for r in n.kwargs.get("reuse", [])}  # type: ignore[union-attr]
    assert reused and not reused & set(gr.outputs)
    assert "reuse=" in str(compiled) and str(parse(str(compiled))) == str(compiled)
    run = compiled_runner(compiled)
    for _ in range(2):  # the second call reuses the same storage again
        torch.testing.assert_close(run(None, [x, w]).outputs, want)


@st.composite
def pad_cat_programs(draw: Any) -> tuple[str, list[torch.Tensor], list[torch.Tensor]]:
    """prims.pad (negative = crop) and prims.concatenate of views, against eager."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g)
    p = _Prog()
    cfg = [[draw(st.integers(-n + 1, 2)), draw(st.integers(-n + 1, 2)), 0] for n in shape]
    cfg = [[lo, hi, 0] if lo + hi > -n else [0, 0, 0] for (lo, hi, _), n in zip(cfg, shape,
                                                                             strict=True)]
    pads = [v for lo, hi, _ in reversed(cfg) for v in (lo, hi)]
    value = draw(st.sampled_from([0.0, -1.5]))
    padded = torch.constant_pad_nd(x, pads, value)
    pn = p.add("pad", f"%x, {value}", f"config={cfg}", padded)
    rv = torch.flip(x, [0])
    rn = p.add("rev", "%x", "dims=[0]", rv)
    d = draw(st.integers(0, len(shape) - 1))
    cat = torch.cat([rv, x, rv * 2.0], d)
    mn = p.add("mul", f"%{rn}, 2.0", "", rv * 2.0)
    cn = p.add("concatenate", f"[%{rn}, %x, %{mn}]", f"dim={d}", cat)
    outs = [padded, cat]
    text = (f"ember.ir 1.0\n\ngraph @f(%x: f32{shape}) -> (f32{list(padded.shape)}, "
            f"f32{list(cat.shape)}) {{\n" + "\n".join(p.lines) + f"\n  return (%{pn}, %{cn})\n}}\n")
    return text, [x], outs


@settings(max_examples=60, deadline=None)
@given(pad_cat_programs())
def test_pad_and_concatenate_lower_like_eager(prog: tuple[str, list[Any], list[Any]]) -> None:
    text, inputs, want = prog
    low = run_pipeline(parse(text), "lower-loops,fuse", verify_each=True)
    assert not any(n.op == "loop.extern" for n in low.graph().nodes)
    torch.testing.assert_close(Interpreter(low).run(inputs).outputs, want)


ATTENTION = """ember.ir 1.0

graph @f(%x: f32[2, 8, 2, 12]) -> (f32[2, 2, 8, 4]) {
  %q = aten.slice.Tensor(%x, 3, 0, 4) : f32[2, 8, 2, 4]
  %k = aten.slice.Tensor(%x, 3, 4, 8) : f32[2, 8, 2, 4]
  %v = aten.slice.Tensor(%x, 3, 8, 12) : f32[2, 8, 2, 4]
  %qt = aten.transpose.int(%q, 1, 2) : f32[2, 2, 8, 4]
  %kt = aten.transpose.int(%k, 1, 2) : f32[2, 2, 8, 4]
  %vt = aten.transpose.int(%v, 1, 2) : f32[2, 2, 8, 4]
  %o, %l = aten._scaled_dot_product_flash_attention_for_cpu.default(%qt, %kt, %vt, 0.0, true, scale=0.5) : (f32[2, 2, 8, 4], f32[2, 2, 8])
  return (%o)
}
"""


def test_fused_attention_stays_one_extern_on_strided_views() -> None:
    """decompose{keep_attention=true} (the inductor pipeline) keeps torch's flash kernel as one
    extern reading q, k, v as strided views of x; plain decompose lowers it to prims."""
    x = torch.randn(2, 8, 2, 12, generator=torch.Generator().manual_seed(0))
    q, k, v = (x[..., i:i + 4].transpose(1, 2) for i in (0, 4, 8))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    compiled = compile_module(parse(ATTENTION))
    nodes = compiled.graph().nodes
    # (q is a head split: the kernel's [B, L, H, E] output read where it writes it)
    assert [(n.kwargs["op"], n.kwargs.get("kernel")) for n in nodes if n.op == "kernels.extern"] \
        == [("loop.attention_heads_last_cpu",
             "aten._scaled_dot_product_flash_attention_for_cpu.default")]
    assert not any(n.op == "kernels.call" for n in nodes[:-1])  # no copies of q, k, v
    torch.testing.assert_close(compiled_runner(compiled)(None, [x]).outputs[0], want)
    decomposed = run_pipeline(parse(ATTENTION), "decompose")
    assert not any(n.op.startswith("aten.") for n in decomposed.graph().nodes)
    torch.testing.assert_close(Interpreter(decomposed).run([x]).outputs[0], want)


CONV_BN = """ember.ir 1.0

graph @f(%x: f32[2, 3, 6, 5], %w: f32[4, 3, 3, 3], %m: f32[4], %v: f32[4], %g: f32[4], %b: f32[4]) -> (f32[2, 4, 6, 5], {extra}) {{
  %c = prims.convolution(%x, %w, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : f32[2, 4, 6, 5]
  %ve = prims.add(%v, 1e-05) : f32[4]
  %rs = prims.rsqrt(%ve) : f32[4]
  %mb = prims.broadcast_in_dim(%m, shape=[2, 4, 6, 5], broadcast_dims=[1]) : f32[2, 4, 6, 5]
  %rb = prims.broadcast_in_dim(%rs, shape=[2, 4, 6, 5], broadcast_dims=[1]) : f32[2, 4, 6, 5]
  %s = prims.sub(%c, %mb) : f32[2, 4, 6, 5]
  %n = prims.mul(%s, %rb) : f32[2, 4, 6, 5]
  %gb = prims.broadcast_in_dim(%g, shape=[2, 4, 6, 5], broadcast_dims=[1]) : f32[2, 4, 6, 5]
  %y = prims.mul(%n, %gb) : f32[2, 4, 6, 5]
  %bb = prims.broadcast_in_dim(%b, shape=[2, 4, 6, 5], broadcast_dims=[1]) : f32[2, 4, 6, 5]
  %z = prims.add(%y, %bb) : f32[2, 4, 6, 5]
  %r = prims.maximum(%z, 0.0) : f32[2, 4, 6, 5]
  return (%r, {ret})
}}
"""


def test_batchnorm_relu_fold_into_the_convolution() -> None:
    """Eval BatchNorm + ReLU after a convolution fold into it (weight * A, bias B; the ReLU is
    ember's NaN-propagating max fused into the result's reader, never oneDNN's post-op, which
    maps NaN to 0): one extern, no kernel rereads the activation; computed from this call's
    inputs. A folded value that is also a graph output stops the fold there."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 6, 5, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    m, gm, b = (torch.randn(4, generator=g) for _ in range(3))
    v = torch.rand(4, generator=g) + 0.5
    c = torch.conv2d(x, w, padding=1)
    y = (c - m[:, None, None]) * torch.rsqrt(v + 1e-5)[:, None, None] * gm[:, None, None]
    r = torch.relu(y + b[:, None, None])
    for extra, ret, want, relu in [("f32[4]", "%ve", [r, v + 1e-5], True),
                                   ("f32[2, 4, 6, 5]", "%y", [r, y], False)]:
        compiled = compile_module(parse(CONV_BN.format(extra=extra, ret=ret)))
        convs = [n for n in compiled.graph().nodes if n.op == "kernels.extern"]
        assert len(convs) == 1 and not convs[0].kwargs.get("relu", False)
        folded = run_pipeline(parse(CONV_BN.format(extra=extra, ret=ret)), "conv-nhwc")
        assert [n.kwargs["relu"] for n in folded.graph().nodes if n.op == "loop.conv2d"] \
            == [relu]
        assert len(convs[0].args) == 4  # x, weight, A, bias B (A folds into the packed weight)
        assert not any(n.op == "kernels.call" and n.kwargs["out_shapes"] == [[2, 4, 6, 5]]
                       for n in compiled.graph().nodes[:-1])  # nothing rereads the activation
        run = compiled_runner(compiled)
        torch.testing.assert_close(run(None, [x, w, m, v, gm, b]).outputs, want)
        m2 = m + 1.0  # parameters read at each call
        y2 = (c - m2[:, None, None]) * torch.rsqrt(v + 1e-5)[:, None, None] * gm[:, None, None]
        got = run(None, [x, w, m2, v, gm, b]).outputs
        torch.testing.assert_close(got[0], torch.relu(y2 + b[:, None, None]))


EMBED = """ember.ir 1.0

graph @f(%ids: i64[4, 6], %w: f32[10, 8], %p: i64[1, 16]) -> (f32[4, 6, 8], f32[6, 8], f32[6, 5]) {
  %r = prims.reshape(%ids, shape=[24]) : i64[24]
  %b = prims.broadcast_in_dim(%r, shape=[24, 8], broadcast_dims=[0]) : i64[24, 8]
  %e = prims.gather(%w, %b, dim=0) : f32[24, 8]
  %o = prims.reshape(%e, shape=[4, 6, 8]) : f32[4, 6, 8]
  %s = prims.slice(%p, start=[0, 2], limit=[1, 8], step=[1, 1]) : i64[1, 6]
  %q = prims.reshape(%s, shape=[6]) : i64[6]
  %qb = prims.broadcast_in_dim(%q, shape=[6, 8], broadcast_dims=[0]) : i64[6, 8]
  %pe = prims.gather(%w, %qb, dim=0) : f32[6, 8]
  %nb = prims.broadcast_in_dim(%q, shape=[6, 5], broadcast_dims=[0]) : i64[6, 5]
  %part = prims.gather(%w, %nb, dim=0) : f32[6, 5]
  return (%o, %pe, %part)
}
"""


def test_embedding_gathers_are_index_selects() -> None:
    """A gather whose index only varies along its dim (ids broadcast over the row) is an
    index_select of the 1-d ids; one reading a prefix of the rows stays a gather."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (4, 6), generator=g)
    w = torch.randn(10, 8, generator=g)
    p = torch.randint(0, 10, (1, 16), generator=g)
    q = p[0, 2:8]
    want = [w[ids], w[q], w[q][:, :5]]
    compiled = compile_module(parse(EMBED))
    ops = [n.kwargs["op"] for n in compiled.graph().nodes if n.op == "kernels.extern"]
    assert ops == ["loop.index_select", "loop.index_select", "prims.gather"]
    torch.testing.assert_close(compiled_runner(compiled)(None, [ids, w, p]).outputs, want)
    torch.testing.assert_close(Interpreter(compiled).run([ids, w, p]).outputs, want)
