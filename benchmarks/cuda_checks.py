"""Correctness of ember's CUDA target on whole models, in one device call (issue 16).

Run from the repository root on a GPU machine (or with --device cpu, a smoke run of the same
code through the CPU target):

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :).devlibs python3 benchmarks/cuda_checks.py

Sections (`--sections`, comma-separated; each writes its rows to OUT/cuda_checks.jsonl):

- **train**: training steps through `compile(backend="inductor")` (benchmarks/suites.py's
  training cases: conv+BN in f32, whose BatchNorm a CUDA capture records as
  `aten.cudnn_batch_norm`; GPT-NeoX small): losses and parameters against eager's over 3 SGD
  steps, the fallbacks and graph breaks explain() reports, then ms per step (eager, ember).
- **attention**: bf16 inference of hf/vit, hf/bert (padding mask), hf/gpt2 and hf/llama
  (causal; GQA 4:2 through repeat_kv), a decode step with a KV cache and a GQA layer
  (`enable_gqa=True`): relative error against eager, which attention ops capture recorded, and
  the kernel census of what ran (Triton kernels; attention externs: torch's fused kernel kept
  whole, `loop.attention_heads_last`).
- **moe**: hf/mixtral and hf/qwen2-moe in bf16 (benchmarks/zoo_models.py): whether ember
  compiled them (graphs, graph breaks, fallbacks, notes, the captured op counts of grouped
  matmul / histc / topk), relative error against eager.

Each case's row says `compiled` (every graph ran through the inductor, no fallback, no graph
break) so an eager path cannot pass as compiled.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
OUT = Path(os.environ.get("OUT", "/tmp/cuda_checks"))
ATTENTION_EXTERNS = ("loop.attention_heads_last",
                     "aten._scaled_dot_product_flash_attention.default",
                     "aten._scaled_dot_product_efficient_attention.default",
                     "aten._scaled_dot_product_cudnn_attention.default",
                     "aten._scaled_dot_product_flash_attention_for_cpu.default")


def emit(row: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "cuda_checks.jsonl").open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    short = {k: v for k, v in row.items() if k not in ("trace", "explain")}
    print(json.dumps(short, default=str)[:700], flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def ms_per_call(fn: Callable[[], Any], device: str, n: int = 20) -> float:
    for _ in range(3):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return round((time.perf_counter() - t0) / n * 1e3, 3)


def census(cf: Any) -> dict[str, Any]:
    """What ember ran for compiled `cf`: graphs, breaks, fallbacks, notes, the captured ops of
    interest, and per compiled module its kernel and extern counts. `compiled` is true only if
    every captured graph went through the inductor with no fallback and no graph break."""
    import ember.runtime as er
    inner = getattr(cf, "compiled", cf)
    hist = inner.history
    ops: collections.Counter[str] = collections.Counter()
    for g in hist.graphs:
        ops.update(g.op_counts)
    row: dict[str, Any] = {
        "graphs": len(hist.graphs), "graph_breaks": len(hist.breaks),
        "fallbacks": [f"{f.kind}: {f.reason}"[:240] for f in hist.fallbacks],
        "breaks": [f"{b.reason}"[:240] for b in hist.breaks][:4],
        "notes": [n[:240] for n in hist.notes][:6],
        "captured_attention": sorted(op for op in ops if "attention" in op),
        "captured_norms": sorted(op for op in ops if "norm" in op),
        "captured_moe_ops": {op: c for op, c in ops.items()
                             if any(k in op for k in ("grouped_mm", "histc", "topk", "bincount",
                                                      "nonzero", "one_hot"))}}
    kernels = externs = 0
    ex: collections.Counter[str] = collections.Counter()
    for m in _compiled_modules(inner):
        kernels += sum(1 for k in m.kernels.values() if k.lang in ("triton", "cpp"))
        for g in m.graphs.values():
            for n in g.nodes:
                if n.op == "kernels.extern":
                    ex[str(n.kwargs.get("op"))] += 1
                    externs += 1
    row.update(kernels=kernels, externs=dict(ex.most_common()),
               attention_externs=sum(c for op, c in ex.items() if op in ATTENTION_EXTERNS))
    # each graph the inductor took leaves a note (inference: "compiled it to", training: "runs
    # its forward as"); a graph without one ran some other way
    by_inductor = sum(1 for n in hist.notes if "the inductor backend compiled it" in n
                      or "training: backend 'inductor' runs" in n)
    row["graphs_by_inductor"] = by_inductor
    row["compiled"] = bool(hist.graphs) and not hist.fallbacks and not hist.breaks \
        and by_inductor >= len(hist.graphs)
    try:
        row["explain"] = str(er.explain(cf)).split("\n-- graph")[0][:1500]
    except Exception as e:  # noqa: BLE001
        row["explain"] = f"explain failed: {e}"
    return row


def _compiled_modules(inner: Any) -> list[Any]:
    """The inductor's compiled modules (inference) of a compiled function: its own and its
    children's (resume functions after graph breaks, callees)."""
    seen: list[Any] = []
    todo = [inner, *(c for _, c in getattr(inner, "_spawned", {}).values())]
    for cf in todo:
        m = getattr(cf, "_last_compiled", None)
        if m is not None and all(m is not s for s in seen):
            seen.append(m)
    return seen


def rel_err(a: Any, b: Any) -> float:
    def flat(x: Any) -> list[torch.Tensor]:
        for attr in ("logits", "last_hidden_state"):
            if hasattr(x, attr):
                return [getattr(x, attr)]
        xs = x if isinstance(x, (tuple, list)) else [x]
        return [t for t in xs if isinstance(t, torch.Tensor)]
    fa, fb = flat(a), flat(b)
    num = sum(float((x.float() - y.float()).norm()) ** 2 for x, y in zip(fa, fb, strict=True))
    den = sum(float(y.float().norm()) ** 2 for y in fb)
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


# ---- train ------------------------------------------------------------------------------------

def train_case(name: str, built: Any, device: str) -> dict[str, Any]:
    import ember.runtime as er
    model, loss_fn, args = built
    model = model.to(device)
    args = tuple(a.to(device) for a in args)
    row: dict[str, Any] = {"section": "train", "case": name, "device": device}

    def trainer(make: Callable[[Any], Any]) -> tuple[Any, Callable[[], Any], Any]:
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        fn = make(lambda *a: loss_fn(m, *a))

        def step() -> Any:
            out = fn(*args)
            out.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return out.detach()
        return m, step, fn
    me, se, _ = trainer(lambda f: f)
    want = [se() for _ in range(3)]
    mc, sc, fn = trainer(lambda f: er.compile(f, backend="inductor"))
    t0 = time.perf_counter()
    got = [sc()]
    sync(device)
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    got += [sc() for _ in range(2)]
    row["losses"] = [float(x) for x in got]
    try:
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close([p.detach() for p in mc.parameters()],
                                   [p.detach() for p in me.parameters()], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close([b for b in mc.buffers()], [b for b in me.buffers()],
                                   rtol=1e-3, atol=1e-3)
        row["ok"] = True
    except AssertionError as e:
        row["ok"], row["error"] = False, str(e).splitlines()[:4]
    row.update(census(fn))
    row["eager_ms"] = ms_per_call(se, device)
    row["ember_ms"] = ms_per_call(sc, device)
    return row


def run_train(device: str, names: list[str]) -> None:
    import suites
    cases = {c.name: c for c in suites.SUITES["training"]()}
    for name in names:
        try:
            emit(train_case(name, cases[name].build(), device))
        except Exception as e:  # noqa: BLE001  (a failing case is a result)
            emit({"section": "train", "case": name, "ok": False,
                  "error": f"{type(e).__name__}: {str(e)[:300]}",
                  "trace": traceback.format_exc(limit=5)})


# ---- attention --------------------------------------------------------------------------------

class DecodeAttention(nn.Module):
    """One decode step of an attention layer with a KV cache: the new token's k/v written at
    position `pos` of the [B, Hkv, S, E] caches (index_copy), sdpa of the one query over the
    first pos+1 cached positions (a boolean mask; with kv_heads < heads, enable_gqa), the head
    merge and the output projection."""

    def __init__(self, d: int = 256, heads: int = 8, kv_heads: int = 8, cache: int = 64):
        super().__init__()
        self.h, self.hkv, self.e = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.e, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.cache = cache

    def forward(self, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                pos: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        q = self.q(x).view(B, 1, self.h, self.e).transpose(1, 2)
        k, v = self.kv(x).view(B, 1, 2, self.hkv, self.e).permute(2, 0, 3, 1, 4)
        kc = kc.index_copy(2, pos, k)
        vc = vc.index_copy(2, pos, v)
        mask = (torch.arange(self.cache, device=x.device) <= pos).view(1, 1, 1, -1)
        y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask,
                                           enable_gqa=self.hkv != self.h)
        return self.o(y.transpose(1, 2).reshape(B, 1, -1))


class GQALayer(nn.Module):
    """Causal self-attention with 8 query heads over 2 kv heads (enable_gqa=True)."""

    def __init__(self, d: int = 256, heads: int = 8, kv_heads: int = 2):
        super().__init__()
        self.h, self.hkv, self.e = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.e)
        self.o = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.e).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.hkv, self.e).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(B, L, -1))


def attention_models() -> dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]]:
    import zoo_models
    zoo = {m.name: m for m in zoo_models.ZOO}
    out: dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]] = {
        n: (lambda n=n: zoo[n].build(zoo_models.FULL))  # type: ignore[misc]
        for n in ("hf/vit", "hf/bert", "hf/gpt2", "hf/llama")}

    def decode(kv_heads: int) -> tuple[Any, tuple[Any, ...]]:
        m = DecodeAttention(kv_heads=kv_heads).eval()
        return m, (torch.randn(2, 1, 256), torch.randn(2, kv_heads, 64, 32),
                   torch.randn(2, kv_heads, 64, 32), torch.tensor([37]))
    out["decode-kv-cache"] = lambda: decode(8)
    out["decode-kv-cache-gqa"] = lambda: decode(2)
    out["gqa-causal"] = lambda: (GQALayer().eval(), (torch.randn(2, 128, 256),))
    # not attention: nn.RMSNorm, whose F.rms_norm a GPU capture may record as
    # aten._fused_rms_norm (on the CPU it is composite)
    out["rmsnorm"] = lambda: (nn.Sequential(nn.Linear(256, 256), nn.RMSNorm(256)).eval(),
                              (torch.randn(2, 128, 256),))
    return out


def attention_case(name: str, build: Callable[[], Any], device: str, dtype: torch.dtype,
                   f32_reference: bool = False) -> dict[str, Any]:
    """One model in `dtype`: ember's output against eager's (and with `f32_reference`, both
    against the model run in f32: a router's top-k may flip on a bf16 rounding, so an MoE
    decoder is right when ember is no further from f32 than eager is)."""
    import ember.runtime as er
    row: dict[str, Any] = {"section": "attention", "case": name, "device": device,
                           "dtype": str(dtype).replace("torch.", "")}
    torch.manual_seed(0)
    model, args = build()
    model = model.to(device, dtype).eval()
    args = tuple(a.to(device, dtype) if a.is_floating_point() else a.to(device) for a in args)
    with torch.no_grad():
        want = model(*args)
        cf = er.compile(model, dynamic=False)
        t0 = time.perf_counter()
        got = cf(*args)
        sync(device)
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        row["rel_err"] = rel_err(got, want)
        tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
        row["ok"] = row["rel_err"] < tol
        if f32_reference:
            try:
                m32 = copy.deepcopy(model).float()
                ref = m32(*(a.float() if a.is_floating_point() else a for a in args))
                del m32
                row["eager_vs_f32"] = rel_err(want, ref)
                row["ember_vs_f32"] = rel_err(got, ref)
                row["ok"] = row["ok"] or row["ember_vs_f32"] <= 1.25 * row["eager_vs_f32"]
            except Exception as e:  # noqa: BLE001  (an f32 path the model lacks: reported)
                row["f32_error"] = f"{type(e).__name__}: {str(e)[:160]}"
        row.update(census(cf))
        row["eager_ms"] = ms_per_call(lambda: model(*args), device)
        row["ember_ms"] = ms_per_call(lambda: cf(*args), device)
    return row


def run_attention(device: str, names: list[str]) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    models = attention_models()
    for name in names:
        try:
            emit(attention_case(name, models[name], device, dtype))
        except Exception as e:  # noqa: BLE001
            emit({"section": "attention", "case": name, "ok": False,
                  "error": f"{type(e).__name__}: {str(e)[:300]}",
                  "trace": traceback.format_exc(limit=5)})


# ---- moe --------------------------------------------------------------------------------------

def run_moe(device: str, names: list[str]) -> None:
    import zoo_models
    zoo = {m.name: m for m in zoo_models.ZOO}
    dtype = torch.bfloat16
    for name in names:
        try:
            row = attention_case(name, lambda n=name: zoo[n].build(zoo_models.FULL),  # type: ignore[misc]
                                 device, dtype, f32_reference=True)
            row["section"] = "moe"
            emit(row)
        except Exception as e:  # noqa: BLE001
            emit({"section": "moe", "case": name, "ok": False,
                  "error": f"{type(e).__name__}: {str(e)[:300]}",
                  "trace": traceback.format_exc(limit=5)})


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows of a run as markdown tables, one per section."""
    def f(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        if isinstance(v, (list, tuple)):
            return "; ".join(str(x)[:120] for x in v) or "none"
        if isinstance(v, dict):
            return ", ".join(f"{k} {c}" for k, c in v.items())
        return "" if v is None else str(v)
    cols = {"train": ("case", "ok", "compiled", "graphs", "graph_breaks", "fallbacks",
                      "compile_s", "eager_ms", "ember_ms", "error"),
            "attention": ("case", "ok", "compiled", "rel_err", "captured_attention",
                          "captured_norms",
                          "attention_externs", "kernels", "graph_breaks", "fallbacks",
                          "compile_s", "eager_ms", "ember_ms", "error"),
            "moe": ("case", "ok", "compiled", "rel_err", "eager_vs_f32", "ember_vs_f32", "graphs",
                    "graph_breaks", "fallbacks",
                    "captured_moe_ops", "kernels", "compile_s", "eager_ms", "ember_ms",
                    "error")}
    out: list[str] = []
    for sec, names in cols.items():
        sel = [r for r in rows if r.get("section") == sec]
        if not sel:
            continue
        out += [f"### {sec}", "", "| " + " | ".join(names) + " |",
                "|" + "---|" * len(names)]
        out += ["| " + " | ".join(f(r.get(n)) for n in names) + " |" for r in sel]
        out.append("")
    return "\n".join(out)


SECTIONS = {"train": (run_train, "conv+BN train,GPT-NeoX train"),
            "attention": (run_attention, "hf/vit,hf/bert,hf/gpt2,hf/llama,decode-kv-cache,"
                                         "decode-kv-cache-gqa,gqa-causal,rmsnorm"),
            "moe": (run_moe, "hf/mixtral,hf/qwen2-moe")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--report", default="", help="print a run's cuda_checks.jsonl as markdown "
                    "tables (no run)")
    for s, (_, default) in SECTIONS.items():
        ap.add_argument(f"--{s}", default=default, help=f"the {s} section's cases")
    a = ap.parse_args()
    if a.report:
        print(markdown([json.loads(ln) for ln in Path(a.report).read_text().splitlines()
                        if ln.strip()]))
        return 0
    import ember.inductor  # noqa: F401  (registers the targets)
    for s in a.sections.split(","):
        run, _ = SECTIONS[s]
        run(a.device, [n for n in getattr(a, s).split(",") if n])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
