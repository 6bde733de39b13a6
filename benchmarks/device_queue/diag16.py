"""Where ember's time goes at 16 threads against eager's (issue 18), on the device's CPU.

1. Which OpenMP runtimes the process maps once ember's kernels are loaded (two would mean two
   thread pools competing for the cores).
2. Every linear product of the zoo's transformers (shapes recorded from one eager call):
   oneDNN's linear on a packed weight (ember's loop.linear_packed) against torch.addmm
   (eager's and torch.compile's linear, MKL), at 16 and 8 threads, min of 15 after warm-up.
3. Eager's own profile at 16 threads (torch.profiler, self CPU time by op): what eager spends
   in its GEMMs, convolutions and attention, to set beside ember's census (parallelism.py).
Run from the repository root with packages/*/src on PYTHONPATH; prints to stdout.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from zoo_models import FULL  # noqa: E402
from zoo_worker import model_named  # noqa: E402

MODELS = sys.argv[1].split(",") if len(sys.argv) > 1 else [
    "hf/bert", "hf/llama", "hf/gpt2", "timm/deit_tiny_patch16_224", "timm/levit_128s",
    "tv/swin_t", "tv/vit_b_16", "tv/resnet50", "tv/mobilenet_v2"]


def gomp() -> None:
    import ember.runtime as er
    f = er.compile(lambda x: (x * 2).sin())
    f(torch.randn(100000))
    maps = Path("/proc/self/maps").read_text().splitlines()
    libs = sorted({ln.split()[-1] for ln in maps if "omp" in ln.split()[-1]})
    print("## OpenMP runtimes mapped:", libs, flush=True)


def best(fn, reps: int = 15) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts) * 1e6


def linears() -> None:
    shapes: dict[tuple[int, int, int, bool], list[str]] = {}
    for name in MODELS:
        m = model_named(name)
        if m is None or m.kind == "cnn":
            continue
        fn, args = m.build(FULL)
        hooks = []
        mods = fn.modules() if isinstance(fn, torch.nn.Module) else []
        for mod in mods:
            if isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D":
                def hook(mod, inp, out, name=name):
                    x = inp[0]
                    k = x.shape[-1]
                    mm = x.numel() // k
                    n = out.shape[-1]
                    shapes.setdefault((mm, k, n, getattr(mod, "bias", None) is not None),
                                      []).append(name)
                hooks.append(mod.register_forward_hook(hook))
        with torch.no_grad():
            fn(*args)
        for h in hooks:
            h.remove()
    print("## linear: M K N bias | count | threads: packed oneDNN us, addmm us, addmm/packed",
          flush=True)
    for (mm, k, n, bias), who in sorted(shapes.items()):
        x = torch.randn(mm, k)
        w = torch.nn.Parameter(torch.randn(n, k) * 0.05, requires_grad=False)
        b = torch.randn(n) if bias else None
        row = [f"{mm:6d} {k:5d} {n:5d} {int(bias)} | {len(who):3d} {sorted(set(who))[0]:28s}"]
        for t in (16, 8):
            torch.set_num_threads(t)
            pw = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            tp = best(lambda x=x, pw=pw, b=b: torch.ops.mkldnn._linear_pointwise(
                x, pw, b, "none", [], ""))
            wt = w.t()
            ta = best(lambda x=x, wt=wt, b=b: torch.addmm(b, x, wt) if b is not None
                      else torch.mm(x, wt))
            row.append(f"| {t:2d}t {tp:8.1f} {ta:8.1f} {ta / tp:5.2f}")
        print(" ".join(row), flush=True)
    torch.set_num_threads(16)


def eager_profiles() -> None:
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(16)
    for name in MODELS:
        m = model_named(name)
        if m is None:
            continue
        fn, args = m.build(FULL)
        with torch.no_grad():
            wall = best(lambda fn=fn, args=args: fn(*args), reps=10)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    fn(*args)
        ka = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        tot = sum(e.self_cpu_time_total for e in ka) / 5
        print(f"## eager {name} at 16t: {wall / 1000:.2f} ms a call (profiled self total "
              f"{tot / 1000:.2f} ms)", flush=True)
        for e in ka[:10]:
            print(f"   {e.key:44s} {e.self_cpu_time_total / 5 / 1000:7.3f} ms  x{e.count // 5}",
                  flush=True)


if __name__ == "__main__":
    print("threads", torch.get_num_threads(), "torch", torch.__version__,
          "OMP", os.environ.get("OMP_NUM_THREADS"), flush=True)
    print(torch.__config__.parallel_info(), flush=True)
    gomp()
    linears()
    eager_profiles()
