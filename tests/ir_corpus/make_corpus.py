"""Regenerate the corpus's inputs and expected outputs: `python tests/ir_corpus/make_corpus.py
[FILE ...]` (all files, or the named ones: `attention convnet`).

Expected outputs come from calling the ATen ops directly in Python (the functions below), not
from ember's interpreter, so the corpus checks replay against eager. Files per graph:
`<file>.<graph>.in.safetensors` (keyed by parameter name) and `<file>.<graph>.out.safetensors`
(`out0`, `out1`, ... and each parameter updated through `input_updates`, by name), the layout
`ember run --out` writes. Only regenerate on purpose: the corpus is a compatibility promise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

aten = torch.ops.aten
HERE = Path(__file__).parent
Eager = Callable[..., dict[str, Any]]


def _outs(*xs: Any, **updates: Any) -> dict[str, Any]:
    d: dict[str, Any] = {f"out{i}": x for i, x in enumerate(xs)}
    d.update(updates)
    return d


def ex_forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    y = aten.addmm.default(b, x, aten.t.default(w))
    m, _ = aten.max.dim(aten.relu.default(y), 1, False)
    return _outs(y, m)


def ex_step(p: torch.Tensor, g: torch.Tensor) -> dict[str, Any]:
    p1 = aten.add.Tensor(p, g, alpha=-0.1)
    return _outs(aten.sum.default(p1), p=p1)


def norm_rows(x: torch.Tensor) -> torch.Tensor:
    c = aten.sub.Tensor(x, aten.mean.dim(x, [1], True))
    v = aten.var.correction(x, [1], correction=0, keepdim=True)
    out: torch.Tensor = aten.mul.Tensor(c, aten.rsqrt.default(aten.add.Scalar(v, 1e-05)))
    return out


def sym_main(a: torch.Tensor, b: torch.Tensor, k: torch.Tensor) -> dict[str, Any]:
    s0 = a.shape[0]
    lo, hi = aten.split.Tensor(b, s0)
    vals, idx = aten.sort.default(lo, 1, True)
    kf = aten._to_copy.default(k, dtype=torch.float32)
    mask = aten.gt.Scalar(kf, 0.5)
    w = aten.where.ScalarOther(mask, kf, float("-inf"))
    cl = aten.clamp.default(vals, min=-0.5, max=0.5)
    return _outs(norm_rows(a), aten.gather.default(hi, 1, idx), cl,
                 torch.tensor(b.shape[0]), w, mask, vals)


def bn_stats(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor
             ) -> dict[str, Any]:
    m = aten.mean.dim(x, [0])
    v = aten.var.correction(x, [0], correction=1)
    rm = aten.add.Tensor(aten.mul.Tensor(running_mean, 0.9), aten.mul.Tensor(m, 0.1))
    rv = aten.lerp.Scalar(running_var, v, 0.1)
    return _outs(aten.sub.Tensor(x, m), running_mean=rm, running_var=rv)


def momentum(p: torch.Tensor, buf: torch.Tensor, g: torch.Tensor) -> dict[str, Any]:
    b2 = aten.add.Tensor(aten.mul.Scalar(buf, 0.9), g)
    p1 = aten.add.Tensor(p, b2, alpha=-0.01)
    return _outs(aten.linalg_vector_norm.default(p1), buf=b2, p=p1)


def literals(x: torch.Tensor, i: torch.Tensor) -> dict[str, Any]:
    s0 = x.shape[0]
    r = aten.reshape.default(x, [s0, 2, 4])
    return _outs(
        aten.view.default(x, [-1]),
        aten.nan_to_num.default(x, 0.0, float("inf"), float("-inf")),
        aten._to_copy.default(x, dtype=torch.float16),
        aten.gelu.default(x, approximate="none"),
        aten.permute.default(r, [1, 0, 2]),
        aten.bitwise_and.Scalar(i, -2),
        aten.constant_pad_nd.default(x, [0, 0, -1, 1], 2.5e-16),
    )


def attn_block(x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor, w_o: torch.Tensor,
               b_o: torch.Tensor) -> dict[str, Any]:
    s0 = x.shape[1]
    qkv = aten.addmm.default(b_qkv, aten.view.default(x, [2 * s0, 16]), aten.t.default(w_qkv))
    qkvp = aten.permute.default(aten.view.default(qkv, [2, s0, 3, 2, 8]), [2, 0, 3, 1, 4])
    q, k, v = aten.unbind.int(qkvp)
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)
    oc = aten.clone.default(aten.transpose.int(o, 1, 2), memory_format=torch.contiguous_format)
    proj = aten.addmm.default(b_o, aten.view.default(oc, [2 * s0, 16]), aten.t.default(w_o))
    return _outs(aten.add.Tensor(x, aten.view.default(proj, [2, s0, 16])), lse)


def gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
        kf: torch.Tensor, vf: torch.Tensor, bias: torch.Tensor) -> dict[str, Any]:
    sdpa = aten.scaled_dot_product_attention.default
    return _outs(sdpa(q, k, v, keep, enable_gqa=True), sdpa(q, kf, vf, bias, scale=0.5))


def products(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor,
             v: torch.Tensor, e: torch.Tensor) -> dict[str, Any]:
    return _outs(aten.mm.default(a, b), aten.bmm.default(c, d), aten.matmul.default(c, b),
                 aten.mv.default(a, v), aten.dot.default(v, v),
                 aten.baddbmm.default(e, c, d, beta=0.5, alpha=2), aten.matmul.default(c, v))


def convnet(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
            b2: torch.Tensor, wf: torch.Tensor, bf: torch.Tensor) -> dict[str, Any]:
    conv = aten.convolution.default
    r1 = aten.relu.default(conv(x, w1, b1, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    p1, i1 = aten.max_pool2d_with_indices.default(r1, [2, 2], [2, 2])
    r2 = aten.relu.default(conv(p1, w2, b2, [2, 2], [1, 1], [1, 1], False, [0, 0], 2))
    a2 = aten.avg_pool2d.default(r2, [2, 2], [1, 1], [1, 1], True, False)
    g = aten._adaptive_avg_pool2d.default(a2, [1, 1])
    f = aten.view.default(g, [x.shape[0], 8])
    return _outs(aten.addmm.default(bf, f, aten.t.default(wf)), i1, a2)


def decoder(z: torch.Tensor, wt: torch.Tensor, bt: torch.Tensor, s: torch.Tensor,
            w1d: torch.Tensor, v: torch.Tensor, w3d: torch.Tensor) -> dict[str, Any]:
    conv = aten.convolution.default
    up = conv(z, wt, bt, [2, 2], [1, 1], [1, 1], True, [1, 1], 1)
    mp, mi = aten.max_pool2d_with_indices.default(up, [3, 3], [2, 2], [1, 1], [2, 2], True)
    return _outs(up, conv(s, w1d, None, [2], [0], [2], False, [0], 2),
                 conv(v, w3d, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1),
                 mp, mi, aten._adaptive_avg_pool2d.default(up, [3, 4]))


def lookup(table: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
           acc_idx: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    emb = aten.embedding.default(table, ids)
    idx3 = aten.expand.default(aten.unsqueeze.default(acc_idx, 1), [5, 4])
    return _outs(
        emb,
        aten.index.Tensor(table, [cols, rows]),
        aten.index_put.default(table, [acc_idx], vals, True),
        aten.index_select.default(table, 0, rows),
        aten.masked_fill.Scalar(emb, mask, -1.5),
        aten.scatter_add.default(table, 0, idx3, aten.mul.Scalar(vals, 2.0)),
    )


def _inputs(seed: int, **specs: tuple[tuple[int, ...], torch.dtype]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, dt) in specs.items():
        if dt.is_floating_point:
            t = torch.randn(shape, generator=g, dtype=torch.float64).to(dt)
        else:
            t = torch.randint(0, 5, shape, generator=g).to(dt)
        out[name] = t
    return out


f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64
x_nan = _inputs(7, x=((5, 8), f32))["x"]
x_nan[0, 0], x_nan[1, 1], x_nan[2, 2] = float("nan"), float("inf"), float("-inf")

# (file, graph, eager function, inputs); sizes deliberately differ from the symbols' hints.
CASES: list[tuple[str, str, Eager, dict[str, torch.Tensor]]] = [
    ("ir_v1_example", "forward", ex_forward,
     _inputs(1, x=((5, 64), f32), w=((128, 64), f32), b=((128,), f32))),
    ("ir_v1_example", "step", ex_step, _inputs(2, p=((4,), f32), g=((4,), f32))),
    ("symbolic_multi", "norm_rows", lambda x: _outs(norm_rows(x)), _inputs(3, x=((7, 5), f32))),
    ("symbolic_multi", "main", sym_main,
     _inputs(4, a=((4, 3), f32), b=((8, 3), f32), k=((4,), i64))),
    ("mutation", "bn_stats", bn_stats,
     _inputs(5, x=((16, 4), f32), running_mean=((4,), f32), running_var=((4,), f32))),
    ("mutation", "momentum", momentum,
     _inputs(6, p=((3, 3), f64), buf=((3, 3), f64), g=((3, 3), f64))),
    ("literals", "f", literals, {"x": x_nan, "i": _inputs(8, i=((5, 8), i32))["i"]}),
    ("attention", "block", attn_block,
     _inputs(9, x=((2, 7, 16), f32), w_qkv=((48, 16), f32), b_qkv=((48,), f32),
             w_o=((16, 16), f32), b_o=((16,), f32))),
    ("attention", "gqa", gqa,
     {**_inputs(10, q=((1, 4, 3, 8), f32), k=((1, 2, 6, 8), f32), v=((1, 2, 6, 4), f32),
                kf=((1, 4, 6, 8), f32), vf=((1, 4, 6, 4), f32), bias=((3, 6), f32)),
      # row 1 attends to nothing: zeros, as eager's safe softmax gives
      "keep": torch.tensor([[1, 0, 1, 1, 0, 1], [0] * 6, [1] * 6]).bool().reshape(1, 1, 3, 6)}),
    ("attention", "products", products,
     _inputs(11, a=((3, 4), f64), b=((4, 5), f64), c=((2, 3, 4), f64), d=((2, 4, 5), f64),
             v=((4,), f64), e=((2, 3, 5), f64))),
    ("indexing", "lookup", lookup, {
        **_inputs(14, table=((10, 4), f32), vals=((5, 4), f32)),
        "ids": torch.tensor([[0, 9, 3], [3, 3, 7]]), "rows": torch.tensor([2, 0, 3]),
        "cols": torch.tensor([[4], [-1]]), "acc_idx": torch.tensor([1, 1, 8, 1, 0]),
        "mask": torch.arange(24).reshape(2, 3, 4) % 3 == 0}),
    ("convnet", "net", convnet,
     _inputs(12, x=((3, 3, 12, 12), f32), w1=((8, 3, 3, 3), f32), b1=((8,), f32),
             w2=((8, 4, 3, 3), f32), b2=((8,), f32), wf=((10, 8), f32), bf=((10,), f32))),
    ("convnet", "decoder", decoder,
     _inputs(13, z=((1, 4, 5, 5), f32), wt=((4, 3, 3, 3), f32), bt=((3,), f32),
             s=((2, 4, 9), f32), w1d=((6, 2, 3), f32), v=((1, 2, 4, 4, 4), f32),
             w3d=((2, 2, 2, 2, 2), f32))),
]


def main(files: list[str] | None = None) -> None:
    """Regenerate every case, or those of the named .ir files (stems: `attention convnet`)."""
    for file, graph, fn, inputs in CASES:
        if files and file not in files:
            continue
        expected = fn(**{k: v.clone() for k, v in inputs.items()})
        stem = HERE / f"{file}.{graph}"
        save_file({k: v.contiguous() for k, v in inputs.items()}, f"{stem}.in.safetensors")
        save_file({k: v.contiguous() for k, v in expected.items()}, f"{stem}.out.safetensors")
        print(f"wrote {stem.name}.{{in,out}}.safetensors")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
