"""The article's example on a GPU: greedy generate() of a dolly-v2-3b-shaped GPT-NeoX (issue 20).

Run from the repository root on a machine with CUDA, triton and transformers, without installing
ember:

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :).devlibs python3 benchmarks/generate_gpu.py

The model is transformers' GPTNeoXForCausalLM with databricks/dolly-v2-3b's shape (hidden 2560,
32 layers, 32 heads, intermediate 10240, rotary_pct 0.25, vocabulary 50280), random weights
(seed 0), bf16. Each case is a greedy generate() of `--new` tokens (64) from a random prompt of
`--prompt` tokens (32), at batch 1 and 8, with a static cache (`cache_implementation="static"`)
and with the default DynamicCache. Variants, in one process: eager; ember (`compile(model.forward)`,
default mode, then mode="reduce-overhead"); torch.compile (default, then "reduce-overhead").
Per batch size (batch 1 first), each case runs through every variant but torch.compile's
reduce-overhead, which runs after them (it crashed inside generate() before). Each
variant's compiled forward serves all its cases (its recompiles show in their first calls).

Per case: the first call's seconds (capture, compile, warm-up), `--warm` untimed calls, then
`--reps` timed calls
(CUDA synchronized around each; the median reported) as tokens/s = batch x new tokens / s, and
the tokens compared with eager's (greedy in bf16 can diverge late: the first divergent position
is reported, per row, never hidden). ember's explain() counts (graphs, recompilations,
fallbacks, CUDA-graph recordings and replays) are recorded per case. `--budget S` stops
starting a case expected to end past S seconds (its variant's last first call, or
`--compile-guess`, plus its timed calls); rows are written to OUT/generate.jsonl as they finish, and a markdown
table to OUT/generate.md at the end.

Tokens against eager's (the bf16 rule): greedy decoding in bf16 may take the other of two
tokens whose logits eager itself barely tells apart. A compiled row's tokens are accepted only
where they equal eager's up to a first divergent position p at which eager's logits (its
forward on the prompt and its own tokens before p, no cache) put the two tokens within
`NEAR_TIE_ULPS` bf16 roundings of the logits' scale: |logit[eager's] - logit[compiled]| <=
2 * 2^-8 * max|logit|. Such a row reports `near_tie: true`; any other divergence is a wrong
result. In float32 on the CPU the tokens must be equal exactly (the runtime tests check that).

`--step` (ember variants, static cache): after the timed calls, one decode step of one more
generate() is kept and timed alone (CUDA synchronized per call): the compiled call, its guard
check, its input matching, the CUDA graph's replay alone (the device's time), and eager's
forward; the host time a step adds is the compiled call minus the replay. `--profile-first`
samples the first call's Python stack (every 5 ms) and reports the functions most often on
it (the seconds of a first call: capture, passes, Triton compiles, recording).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from gpu_rows import host_ms, version_of

START = time.perf_counter()
OUT = Path(os.environ.get("OUT", "/tmp/generate_gpu"))
VARIANTS = ("eager", "ember", "ember-reduce-overhead", "torch.compile",
            "torch.compile-reduce-overhead")


def elapsed() -> float:
    return time.perf_counter() - START


def emit(row: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "generate.jsonl").open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    short = {k: v for k, v in row.items() if k not in ("trace", "explain")}
    print(json.dumps(short, default=str)[:700], flush=True)


NEAR_TIE_ULPS = 2  # a divergence within this many bf16 roundings of the logit scale


def build_model(layers: int, device: str, tiny: bool = False) -> Any:
    import transformers as T
    shape: dict[str, Any] = dict(  # databricks/dolly-v2-3b's config.json, but the layer count
        hidden_size=2560, num_hidden_layers=layers, num_attention_heads=32,
        intermediate_size=10240, rotary_pct=0.25, vocab_size=50280,
        max_position_embeddings=2048, use_parallel_residual=True, bos_token_id=0,
        eos_token_id=0, tie_word_embeddings=False)
    if tiny:  # (a smoke run's shape: the same architecture, small)
        shape.update(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=1000)
    cfg = T.GPTNeoXConfig(**shape)
    rope = getattr(cfg, "rope_parameters", None) or {}
    frac = rope.get("partial_rotary_factor", getattr(cfg, "rotary_pct", None))
    if frac != 0.25:
        raise RuntimeError(f"this transformers' GPTNeoXConfig did not take rotary_pct=0.25 "
                           f"(rotary fraction {frac})")
    torch.manual_seed(0)
    with torch.device(device):
        model: Any = T.GPTNeoXForCausalLM(cfg)
    return model.to(torch.bfloat16).eval()


def generate(model: Any, ids: torch.Tensor, new: int, cache: str) -> torch.Tensor:
    # disable_compile: on CUDA with a static cache, generate() otherwise wraps the decode step
    # in torch.compile(mode="reduce-overhead") itself (transformers' CompileConfig), under
    # every variant (an "eager" row would be torch.compile's, and ember's compiled forward
    # would be traced by dynamo)
    kw: dict[str, Any] = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=0, attention_mask=torch.ones_like(ids),
                              disable_compile=True)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        out = model.generate(ids, **kw)
    if ids.is_cuda:
        torch.cuda.synchronize()
    new_tokens: torch.Tensor = out[:, ids.shape[1]:]
    return new_tokens


def first_divergence(got: torch.Tensor, want: torch.Tensor) -> list[int | None]:
    """Per row, the first new-token position where the tokens differ (None: all equal)."""
    out: list[int | None] = []
    for g, w in zip(got.tolist(), want.tolist(), strict=True):
        out.append(next((i for i, (a, b) in enumerate(zip(g, w, strict=False)) if a != b),
                        None if len(g) == len(w) else min(len(g), len(w))))
    return out


def ember_counts(cf: Any) -> dict[str, Any]:
    import ember.runtime as er
    rep = er.explain(cf)
    return {"graphs": rep.graph_count, "recompilations": len(rep.recompilations),
            "fallbacks": [f"{f.kind}: {f.reason}"[:200] for f in rep.fallbacks],
            "cuda_recordings": rep.recordings, "cuda_replays": rep.replays,
            "cuda_rerecordings": sum(r.rerecorded for r in rep.cuda_graphs),
            "cuda_results_in_place": sum(getattr(r, "recycled", 0) for r in rep.cuda_graphs),
            # why each graph was recorded again or not recorded (which inputs moved; which
            # kernel was left to the reference interpreter)
            "cuda_reasons": [f"@{r.name}: {why} (x{n})" for r in rep.cuda_graphs
                             for why, n in getattr(r, "reasons", {}).items()]
            + [f"@{r.name}: not recorded: {r.skipped}" for r in rep.cuda_graphs
               if r.skipped is not None],
            "cuda_graphs": [r.text()[:300] for r in rep.cuda_graphs], "explain": str(rep)}


def torch_counters() -> dict[str, Any]:
    """torch.compile's own counts (dynamo's graphs and recompiles, inductor's CUDA-graph
    events), cumulative over the process: its side of explain's captures and recordings."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    keep = ("stats", "inductor", "recompiles")
    return {k: {n: v for n, v in counters[k].items()
                if k != "inductor" or "cudagraph" in n or "graph" in n}
            for k in keep if k in counters}


def divergence_gaps(model: Any, ids: torch.Tensor, got: torch.Tensor, want: torch.Tensor,
                    div: list[int | None]) -> list[dict[str, Any] | None]:
    """Per divergent row: eager's logits at the first divergent position (its prompt and
    eager's tokens before it, no cache), and how far apart eager's token and the compiled one
    are there. A gap within bf16's rounding of the logits (their scale x 2^-8) is a near tie:
    the compiled run took the other of two tokens eager barely tells apart."""
    out: list[dict[str, Any] | None] = []
    for b, p in enumerate(div):
        if p is None or p >= got.shape[1] or p >= want.shape[1]:
            out.append(None)
            continue
        seq = torch.cat([ids[b], want[b, :p]])[None]
        with torch.no_grad():
            # (the class's forward: the instance's may be the compiled one)
            logits = type(model).forward(model, seq).logits[0, -1].float()
        e, c = int(want[b, p]), int(got[b, p])
        scale = float(logits.abs().max())
        gap = float(logits[e] - logits[c])
        out.append({"position": p, "eager_token": e, "compiled_token": c,
                    "gap": round(gap, 4), "logit_scale": round(scale, 3),
                    "near_tie": abs(gap) <= scale * 2 ** -8 * NEAR_TIE_ULPS})
    return out


def compiled_forward(model: Any, variant: str) -> Any:
    """The variant's compiled forward (None: eager)."""
    if variant == "eager":
        return None
    if variant.startswith("ember"):
        import ember.runtime as er
        mode = "reduce-overhead" if variant.endswith("reduce-overhead") else None
        return er.compile(model.forward, mode=mode)
    mode = "reduce-overhead" if variant.endswith("reduce-overhead") else None
    return torch.compile(model.forward, mode=mode)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(args.layers, device, args.tiny)
    emit({"section": "env", "device": torch.cuda.get_device_name() if device == "cuda"
          else platform.processor(), "torch": torch.__version__,
          "triton": version_of("triton"), "transformers": version_of("transformers"),
          "python": platform.python_version(), "layers": args.layers,
          "params": sum(p.numel() for p in model.parameters()),
          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "commit": os.environ.get("EMBER_COMMIT", "")})
    cases = [(c, b) for b in args.batches for c in args.caches]
    gen = torch.Generator().manual_seed(1)
    vocab = 1000 if args.tiny else 50000
    prompts = {b: torch.randint(2, vocab, (b, args.prompt), generator=gen).to(device)
               for b in args.batches}
    eager_tokens: dict[tuple[str, int], torch.Tensor] = {}
    compiled: dict[str, Any] = {}  # variant -> its compiled forward, kept across cases
    last_first: dict[str, float] = {}  # variant -> its last first call's seconds
    # per batch size (batch 1, the headline, first): every case through every variant, then
    # torch.compile's reduce-overhead last (it crashed inside generate() before)
    tail = [v for v in args.variants if v == "torch.compile-reduce-overhead"]
    order = []
    for b in args.batches:
        mine = [(c, bb) for c, bb in cases if bb == b]
        order += [(c, v) for c in mine for v in args.variants if v not in tail]
        order += [(c, v) for v in tail for c in mine]
    if args.cases:  # an explicit order: VARIANT:BATCH[:CACHE] (a short run keeps the first)
        order = []
        for c in args.cases:
            v, b, *rest = c.split(":")
            if v not in VARIANTS or not b.isdigit() or int(b) not in prompts:
                raise SystemExit(f"--cases: {c!r} is not VARIANT:BATCH[:CACHE] of "
                                 f"{', '.join(VARIANTS)} and --batches {args.batches}")
            order.append(((rest[0] if rest else "static", int(b)), v))
    rows: list[dict[str, Any]] = []
    for (cache, batch), variant in order:
        row = one_case(args, model, variant, cache, batch, prompts[batch], compiled,
                       last_first, eager_tokens)
        emit(row)
        rows.append(row)
        cf = compiled.get(variant)
        if args.step and cache == "static" and variant.startswith("ember") and cf is not None \
                and "error" not in row and "skipped" not in row:
            # (a row of its own, after the case's: a run cut short keeps the case)
            try:
                model.forward = cf
                step = {"section": "step", "variant": variant, "cache": cache,
                        "batch": batch, **step_times(model, cf, prompts[batch], cache)}
            except Exception as e:
                step = {"section": "step", "variant": variant,
                        "error": f"{type(e).__name__}: {str(e)[:300]}"}
            finally:
                model.__dict__.pop("forward", None)
            emit(step)
    return rows


def one_case(args: argparse.Namespace, model: Any, variant: str, cache: str, batch: int,
             ids: torch.Tensor, compiled: dict[str, Any], last_first: dict[str, float],
             eager_tokens: dict[tuple[str, int], torch.Tensor]) -> dict[str, Any]:
    row: dict[str, Any] = {"section": "case", "variant": variant, "cache": cache,
                           "batch": batch, "new": args.new}
    guess = 5.0 if variant == "eager" else args.compile_guess
    expect = last_first.get(variant, guess) + (args.reps + args.warm) * 3.0
    if elapsed() + expect > args.budget:
        row["skipped"] = (f"budget: {elapsed():.0f} s used of {args.budget:.0f}, this case "
                          f"expected to take {expect:.0f} s")
        return row
    try:
        cf = compiled.get(variant)
        if cf is None and variant != "eager":
            cf = compiled[variant] = compiled_forward(model, variant)
        if cf is not None:
            model.forward = cf
        sampler = StackSampler() if args.profile_first and variant != "eager" and \
            variant not in last_first else None
        t0 = time.perf_counter()
        if sampler is not None:
            with sampler:
                toks = generate(model, ids, args.new, cache)
            row["first_profile"] = sampler.top(30)
        else:
            toks = generate(model, ids, args.new, cache)
        row["first_s"] = last_first[variant] = round(time.perf_counter() - t0, 3)
        before = ember_counts(cf) if variant.startswith("ember") and cf is not None else None
        for _ in range(args.warm):  # (CUDA graphs record on a binding's second call)
            generate(model, ids, args.new, cache)
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            toks = generate(model, ids, args.new, cache)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        row["s"] = round(med, 4)
        row["tokens_per_s"] = round(batch * args.new / med, 1)
        row["steps_per_s"] = round(args.new / med, 1)
        if variant == "eager":
            eager_tokens[(cache, batch)] = toks
            row["same_tokens"] = True
        elif (cache, batch) in eager_tokens:
            div = first_divergence(toks, eager_tokens[(cache, batch)])
            row["same_tokens"] = all(d is None for d in div)
            row["first_divergence"] = div
            if not row["same_tokens"]:
                row["divergence"] = divergence_gaps(model, ids, toks,
                                                    eager_tokens[(cache, batch)], div)
        if variant.startswith("ember") and cf is not None:
            row.update(ember_counts(cf))  # (cumulative over this variant's cases so far)
            if before is not None:  # per generate() after this case's first call
                calls = args.warm + args.reps
                row["per_generate"] = {
                    k: round((row[k] - before[k]) / calls, 2)
                    for k in ("graphs", "cuda_recordings", "cuda_rerecordings", "cuda_replays")}
        elif variant.startswith("torch.compile"):
            row["torch_counters"] = torch_counters()  # (cumulative over the process)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        row["trace"] = traceback.format_exc()[-3000:]
    finally:
        model.__dict__.pop("forward", None)
    return row


class StackSampler:
    """The main thread's Python stack, sampled every `dt` seconds from another thread: per
    function (file:name), the share of samples it was on the stack (inclusive)."""

    def __init__(self, dt: float = 0.005):
        import threading
        self.dt, self.samples = dt, 0
        self.counts: dict[str, int] = {}
        self.main = threading.main_thread().ident
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StackSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop = True
        self.thread.join()

    def _run(self) -> None:
        while not self.stop:
            f = sys._current_frames().get(self.main) if self.main is not None else None
            seen: set[str] = set()
            while f is not None:
                c = f.f_code
                seen.add(f"{os.path.basename(c.co_filename)}:{c.co_name}")
                f = f.f_back
            for k in seen:
                self.counts[k] = self.counts.get(k, 0) + 1
            self.samples += 1
            time.sleep(self.dt)

    def top(self, k: int) -> list[tuple[str, float]]:
        n = max(self.samples, 1)
        return [(name, round(c / n, 3))
                for name, c in sorted(self.counts.items(), key=lambda kv: -kv[1])[:k]]


def step_times(model: Any, cf: Any, ids: torch.Tensor, cache: str, calls: int = 10,
               reps: int = 3) -> dict[str, Any]:
    """One decode step of a generate() through `cf`, timed alone (module docstring)."""
    import gc

    from ember.runtime.cudagraphs import _GraphRunner
    steps: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def spy(*a: Any, **k: Any) -> Any:
        steps.append((a, k))
        return cf(*a, **k)

    # forward's own signature: generate() passes the arguments a signature names, and a
    # (*a, **k) one got other keyword arguments (a recompile of forward, not the step timed)
    spy.__signature__ = inspect.signature(type(model).forward.__get__(model))  # type: ignore
    model.forward = spy
    try:
        generate(model, ids, 8, cache)
    finally:
        model.forward = cf
    args, kwargs = steps[-3]  # (a decode step: it started 3 steps before the end)
    steps.clear()
    cache_obj: Any = kwargs["past_key_values" if "past_key_values" in kwargs else "cache"]
    layers = cache_obj.layers
    at = [layer.cumulative_length.clone() - 3 for layer in layers]
    cuda = ids.is_cuda

    def again() -> None:  # the step's own cache slot again, before each timed call
        for layer, c in zip(layers, at, strict=True):
            layer.cumulative_length.copy_(c)

    def timed(fn: Any) -> float:
        return host_ms(fn, reps=reps, calls=calls, before=again)

    entry, S = cf._hot, cf.self_obj
    with torch.no_grad():
        inputs = entry.code.guard(S, args, kwargs)
        row: dict[str, Any] = {
            "forward_ms": timed(lambda: cf(*args, **kwargs)),
            "guard_ms": timed(lambda: entry.code.guard(S, args, kwargs)),
            "matches_ms": timed(lambda: entry.matches(inputs)),
            "eager_forward_ms": timed(lambda: type(model).forward(model, *args, **kwargs)),
            "guards": len(entry.code.guards), "inputs": len(inputs)}
        runners = [o for o in gc.get_referrers(*[r for r in cf.history.cuda_graphs])
                   if isinstance(o, _GraphRunner)] if cf.history.cuda_graphs else []
        if runners and cuda:
            runner = max(runners, key=lambda o: o.rec.replays)
            rec = max((r for rs in runner.recordings.values() for r in rs),
                      key=lambda r: r.replays)
            row["replay_ms"] = timed(lambda: rec.graph.replay())
            row["static_inputs"], row["copied_inputs"] = len(rec.static), len(rec.copied)
            row["host_ms"] = round(row["forward_ms"] - row["replay_ms"], 4)
    return row  # (the step's arguments, its cache among them, are dropped with this frame)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| variant | cache | batch | first call s | tokens/s | steps/s | eager's tokens | "
            "ember graphs (captures) | CUDA recordings (re-recordings) / replays | fallbacks |")
    out = [head, "|" + "---|" * 10]
    for r in rows:
        if r.get("section") != "case":
            continue
        if "skipped" in r or "error" in r:
            out.append(f"| {r['variant']} | {r['cache']} | {r['batch']} | "
                       f"{r.get('skipped') or r.get('error', '')[:120]} | | | | | | |")
            continue
        same = r.get("same_tokens")
        tok = "yes" if same else (f"no: first divergence per row {r.get('first_divergence')}"
                                  if same is False else "-")
        ties = [d for d in r.get("divergence") or [] if d]
        if ties and all(d.get("near_tie") for d in ties):
            tok = f"near tie at position(s) {sorted({d['position'] for d in ties})}"
        cg = (f"{r.get('cuda_recordings')} ({r.get('cuda_rerecordings', '-')}) / "
              f"{r.get('cuda_replays')}" if "cuda_recordings" in r else "")
        pg = r.get("per_generate")
        if pg:  # after the first call: recordings (re-recordings) per generate()
            cg += f"; per generate() {pg['cuda_recordings']} ({pg['cuda_rerecordings']})"
        out.append(f"| {r['variant']} | {r['cache']} | {r['batch']} | {r['first_s']} | "
                   f"{r['tokens_per_s']} | {r['steps_per_s']} | {tok} | {r.get('graphs', '')} | "
                   f"{cg} | {len(r.get('fallbacks', [])) if 'fallbacks' in r else ''} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--new", type=int, default=64, help="new tokens per generate()")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--caches", nargs="+", default=["static", "dynamic"],
                    choices=["static", "dynamic"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--reps", type=int, default=2, help="timed calls per case (median)")
    ap.add_argument("--warm", type=int, default=0,
                    help="untimed calls after the first: a steady state (recordings of a "
                         "DynamicCache's bindings happen in the second generate())")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds after which no new case starts")
    ap.add_argument("--compile-guess", type=float, default=60.0,
                    help="a compiled variant's first call, before one was measured (s)")
    ap.add_argument("--step", action="store_true",
                    help="time one decode step alone per ember variant (static cache)")
    ap.add_argument("--profile-first", action="store_true",
                    help="sample the first call's Python stack per compiled variant")
    ap.add_argument("--cases", nargs="+", default=None,
                    help="run these cases in this order, each VARIANT:BATCH[:CACHE] (cache "
                         "static by default); eager's case of a batch must come before the "
                         "others' for their tokens to be checked")
    ap.add_argument("--tiny", action="store_true",
                    help="a small model of the same architecture (a CPU smoke run)")
    args = ap.parse_args()
    if "eager" not in args.variants:
        args.variants.insert(0, "eager")  # the tokens every variant is checked against
    rows = run(args)
    md = table(rows)
    (OUT / "generate.md").write_text(md)
    print(md, flush=True)
    print(f"total {elapsed():.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
