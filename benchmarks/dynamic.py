"""Dynamic-shape benchmarks (issue 17 #6): `.venv/bin/python benchmarks/dynamic.py [OPTIONS]`.

Two tables, measured in one process, interleaved (round robin over the contenders, the order
rotating each repetition), median ± half the IQR:

1. **size-generic vs specialized**: each `micro`/`models` case of suites.py compiled by ember
   twice, `dynamic=False` (static shapes: sizes are constants in the C++) and `dynamic=True`
   (every input dim a size symbol: the kernels take sizes as arguments), timed at the case's
   shape. The ratio generic/specialized is the cost of not knowing the sizes (target: <= 1.10).
2. **decode step**: one new token against a cache that grows by one each step, the way a greedy
   decode calls its model: `attention` (SDPA of one query token over torch.cat'ed keys/values)
   and `GPT-NeoX` (transformers, 2 layers × 128, DynamicCache, the forward called per step).
   Contenders: eager, torch.compile (`dynamic=None`, its default) and ember (`dynamic=None`,
   its default). Reported: the first pass over all steps (compiles included), the median step
   of a second pass, and how many graphs each compiler made (torch: dynamo's unique graphs).
3. **per-call overhead**: tiny BERT and GPT-NeoX (2 layers x 32, 8 tokens, one thread), where
   the call's fixed costs dominate: the whole call vs its pieces (the guard check, fast and
   full; the runner: generated wrapper and kernels; the output rebuild) and torch.compile's
   call, in CPU time of the calling thread (best of 9 x 100 calls).

Numbers are measured, never asserted; nothing is written unless `--out FILE` (markdown).

    --filter TEXT     only cases whose name contains TEXT
    --reps N          timed repetitions (default 9)
    --steps N         decode steps (default 48)
    --no-torch-compile
    --cpu-time        the generic table on one thread, in CPU time (steadier on a loaded machine)
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from suites import SUITES  # noqa: E402

import ember.runtime as er  # noqa: E402
from ember.runtime.bench import interleaved, quartiles  # noqa: E402


def _median_iqr(xs: list[float]) -> tuple[float, float]:
    m, q1, q3 = quartiles(xs)
    return m, (q3 - q1) / 2


def _time(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    t = clock()
    fn()
    return (clock() - t) * 1e3


# ---- 1. size-generic vs specialized ----------------------------------------------------------
def _main_output(out: Any) -> Any:
    """The tensor to check: a Hugging Face output's logits (or last hidden state)."""
    for k in ("logits", "last_hidden_state"):
        if hasattr(out, k):
            return getattr(out, k)
    return out


def generic_vs_specialized(filt: str, reps: int, cpu: bool = False) -> list[str]:
    """`cpu`: one thread, timed in the calling thread's CPU time (the kernels' work, without
    the time a loaded machine keeps the process waiting)."""
    clock = time.thread_time if cpu else time.perf_counter
    how = " (1 thread, CPU time)" if cpu else ""
    rows = [f"## Size-generic vs specialized kernels (ember, same shape){how}", "",
            "| case | specialized ms | size-generic ms | generic / specialized | graphs | "
            "fallbacks |", "|---|---|---|---|---|---|"]
    cases = [c for s in ("micro", "models") for c in SUITES[s]()
             if filt.lower() in c.name.lower()]
    for case in cases:
        fn, args = case.build()
        compiled = {"specialized": er.compile(fn, dynamic=False),
                    "generic": er.compile(fn, dynamic=True)}
        with torch.no_grad():
            want = fn(*args)
            status = []
            for k, cf in compiled.items():
                torch.testing.assert_close(_main_output(cf(*args)), _main_output(want),
                                           rtol=case.rtol, atol=case.atol)
                rep = er.explain(cf)
                status.append((rep.graph_count, len(rep.fallbacks)))
                if k == "generic" and "symbol" not in rep.graphs[-1].ir:
                    status[-1] = (rep.graph_count, -1)  # (nothing was made symbolic)
            for cf in compiled.values():  # warm up
                cf(*args)
            t = interleaved(compiled, args, reps, clock=clock)
        (s, si), (g, gi) = _median_iqr(t["specialized"]), _median_iqr(t["generic"])
        note = "" if status[1][1] != -1 else " (stayed static)"
        rows.append(f"| {case.name} | {s:.2f} ± {si:.2f} | {g:.2f} ± {gi:.2f} | {g / s:.2f}"
                    f"{note} | {status[0][0]} / {status[1][0]} | "
                    f"{status[0][1]} / {max(status[1][1], 0)} |")
        print(rows[-1], flush=True)
    return rows


# ---- 2. decode step ---------------------------------------------------------------------------
def attention_step(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    keys = torch.cat([cache_k, k], dim=2)
    values = torch.cat([cache_v, v], dim=2)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values), keys, values


def _attention_decode(steps: int) -> tuple[Callable[..., Any], Callable[[Callable[..., Any]],
                                                                         Any]]:
    torch.manual_seed(0)
    b, h, d, start = 1, 8, 64, 16
    q = [torch.randn(b, h, 1, d) for _ in range(steps)]
    kv = [(torch.randn(b, h, 1, d), torch.randn(b, h, 1, d)) for _ in range(steps)]
    ck0, cv0 = torch.randn(b, h, start, d), torch.randn(b, h, start, d)

    def decode(step: Callable[..., Any]) -> Any:
        ck, cv, outs = ck0, cv0, []
        for i in range(steps):
            out, ck, cv = step(q[i], ck, cv, *kv[i])
            outs.append(out)
        return outs
    return attention_step, decode


def _neox_decode(steps: int) -> tuple[Callable[..., Any], Callable[[Callable[..., Any]], Any]]:
    from transformers import DynamicCache, GPTNeoXConfig, GPTNeoXForCausalLM
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=512, vocab_size=1024, max_position_embeddings=512)
    model = GPTNeoXForCausalLM(cfg).eval()
    prompt = torch.randint(0, 1024, (1, 16))

    def decode(step: Callable[..., Any]) -> Any:
        cache = DynamicCache(config=cfg)
        out = step(input_ids=prompt, past_key_values=cache, use_cache=True)
        ids, toks = out.logits[:, -1:].argmax(-1), []
        for _ in range(steps):
            out = step(input_ids=ids, past_key_values=out.past_key_values, use_cache=True)
            ids = out.logits[:, -1:].argmax(-1)
            toks.append(ids)
        return torch.cat(toks, 1)
    return model, decode


def _graphs(who: str, compiled: Any) -> str:
    if who == "eager":
        return "-"
    if who == "ember":
        rep = er.explain(compiled)
        return f"{rep.graph_count} ({len(rep.fallbacks)} fallbacks)"
    from torch._dynamo.utils import counters
    return str(counters["stats"]["unique_graphs"])


def decode_steps(filt: str, steps: int, reps: int, with_torch: bool) -> list[str]:
    rows = ["", f"## Decode step: one token against a growing cache ({steps} steps)", "",
            "| case | contender | first pass s (compiles included) | step ms: median of passes | "
            "graphs |", "|---|---|---|---|---|"]
    for name, make in (("attention", _attention_decode), ("GPT-NeoX", _neox_decode)):
        if filt.lower() not in name.lower():
            continue
        fn, decode = make(steps)
        contenders: dict[str, Any] = {"eager": fn, "ember": er.compile(fn)}
        if with_torch:
            torch._dynamo.reset()
            contenders["torch.compile"] = torch.compile(fn)
        with torch.no_grad():
            want = decode(fn)
            first = {}
            for who, c in contenders.items():
                first[who] = _time(functools.partial(decode, c)) / 1e3
                torch.testing.assert_close(decode(c), want, rtol=1e-3, atol=1e-3)
            t = interleaved({who: functools.partial(decode, c) for who, c in contenders.items()},
                            (), reps)
        for who, c in contenders.items():
            m, i = _median_iqr([x / steps for x in t[who]])
            rows.append(f"| {name} | {who} | {first[who]:.2f} | {m:.3f} ± {i:.3f} "
                        f"(min {min(t[who]) / steps:.3f}) | {_graphs(who, c)} |")
            print(rows[-1], flush=True)
    return rows


# ---- 3. per-call overhead ---------------------------------------------------------------------
def _cpu_us(fn: Callable[[], Any], n: int = 100, reps: int = 9) -> float:
    """The best of `reps` runs of `n` calls, in this thread's CPU time (us per call): on a
    shared machine, time spent descheduled is not the call's."""
    best = math.inf
    for _ in range(reps):
        t = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t) / n * 1e6)
    return best


def _tiny_models() -> list[tuple[str, Any, tuple[Any, ...]]]:
    from transformers import BertConfig, BertModel, GPTNeoXConfig, GPTNeoXForCausalLM
    torch.manual_seed(0)
    small: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 32}
    return [("tiny BERT", BertModel(BertConfig(**small)).eval(), (torch.randint(0, 100, (1, 8)),)),
            ("tiny GPT-NeoX", GPTNeoXForCausalLM(GPTNeoXConfig(**small)).eval(),
             (torch.randint(0, 100, (1, 8)),))]


def call_overhead(with_torch: bool) -> list[str]:
    """Where a call's time goes when the data is tiny (2 layers x 32, 8 tokens, one thread):
    the compiled module's call, its guard check (the fast check ember runs, and the full one
    it replaces), the graph's runner (generated wrapper + kernels) and the output rebuild."""
    from ember.runtime.compile import compiled_function_of
    rows = ["", "## Per-call overhead on tiny models (1 thread, us of CPU time per call, best of "
            "9 x 100)", "", "| model | guards | eager | ember call | guard check (fast) | "
            "guard check (full) | runner | output | torch.compile call |",
            "|---|---|---|---|---|---|---|---|---|"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, m, args in _tiny_models():
            with torch.no_grad():
                c = er.compile(m)
                c(*args)
                c(*args)
                cf = compiled_function_of(c)
                assert cf is not None
                e: Any = cf.entries[0]
                S, code = cf.self_obj, e.code
                inputs = code.guard(S, args, {})
                outs = e.runner(inputs)
                t = {"eager": _cpu_us(functools.partial(m, *args)),
                     "call": _cpu_us(functools.partial(c, *args)),
                     "fast": _cpu_us(functools.partial(code.guard, S, args, {})),
                     "full": _cpu_us(functools.partial(code.full, S, args, {})),
                     "runner": _cpu_us(functools.partial(e.runner, inputs)),
                     "output": _cpu_us(functools.partial(e.resume, outs, S, args, {}, inputs))}
                tc = "-"
                if with_torch:
                    torch._dynamo.reset()
                    tm = torch.compile(m)
                    tm(*args)
                    tm(*args)
                    tc = f"{_cpu_us(functools.partial(tm, *args)):.0f}"
            rows.append(f"| {name} | {len(code.guards)} | {t['eager']:.0f} | {t['call']:.0f} | "
                        f"{t['fast']:.0f} | {t['full']:.0f} | {t['runner']:.0f} | "
                        f"{t['output']:.0f} | {tc} |")
            print(rows[-1], flush=True)
    finally:
        torch.set_num_threads(threads)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--filter", default="")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--skip-generic", action="store_true", help="skip the generic table")
    ap.add_argument("--skip-decode", action="store_true", help="skip the decode table")
    ap.add_argument("--skip-overhead", action="store_true", help="skip the per-call table")
    ap.add_argument("--cpu-time", action="store_true",
                    help="generic table: one thread, timed in CPU time (a loaded machine)")
    ap.add_argument("--out", type=Path, default=None, help="write the tables (markdown) here")
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(os.cpu_count() or 1)
    rows = [f"# Dynamic shapes ({os.cpu_count()} cores, torch {torch.__version__})", ""]
    if not a.skip_generic:
        if a.cpu_time:
            torch.set_num_threads(1)
        rows += generic_vs_specialized(a.filter, a.reps, a.cpu_time)
        torch.set_num_threads(os.cpu_count() or 1)
    if not a.skip_decode:
        rows += decode_steps(a.filter, a.steps, a.reps, not a.no_torch_compile)
    if not a.skip_overhead:
        rows += call_overhead(not a.no_torch_compile)
    if a.out is not None:
        a.out.write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
