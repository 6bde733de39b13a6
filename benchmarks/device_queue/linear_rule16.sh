#!/bin/bash
# s13h7 (issue 18): why hf/mobilebert (ember 9.45 ms vs torch.compile 8.07 at 16 threads) and
# timm/edgenext_xx_small (8.22 vs 7.12) trail torch.compile at 16 threads. Run from ember's
# repository root on the 16-core host, < 4 min (~3.5). Writes $OUT/s13h7-*.txt and the census
# (parallelism-<date>-16t-s13h7.md/.json). (A copy: /tmp/lead/devq/s13h7.sh.)
# 1) the linear rule (targets/cpu/linear.py use_packed: above 2 threads oneDNN's packed linear
#    only from SMALL_LINEAR*threads/2 multiply-adds and with K >= 512 or a bias, else addmm):
#    both models compiled four times in ONE process (separate weights), the rule patched per
#    variant: "default", "addmm" (every linear addmm above 2 threads, as torch.compile does),
#    "packed" (the 1-2 thread rule: oneDNN from 1M multiply-adds), "k512" (the default less
#    its "or a bias": mobilebert's K=128/256 products addmm, K=1024 oneDNN); with eager; round
#    robin (order rotated), wall clock, 16 threads, 40 reps: median, min, ratio to eager.
#    16 threads on the zoo: eager 12.2 / 12.2, torch.compile 8.07 / 7.12 (0.66 / 0.58 of eager).
# 2) every linear shape of the two models, oneDNN packed vs addmm (bias), 16 and 8 threads.
# 3) the census measured at 16 threads (benchmarks/parallelism.py --measure): per line, wall.
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
export OMP_NUM_THREADS=16
# 0) 77a9bf4 + 79185f6 (wrapper.py: no .view()/.reshape() where a pointer kernel rewrites a buffer
#    of another shape, nor for a reshape to a buffer's own shape): the wrapper code before them vs
#    now, swapped per call in one process, 16 threads, wall. 1 thread here (thread time, 150
#    reps, paired): mobilebert -2.41 ms (A/A +0.14), edgenext -0.51..-1.90 ms (A/A +0.03..0.10).
cat > "$T/ab_views.py" <<'PY'
"""A/B of shape_free and the identity reshape (wrapper.py): the same compiled model, its wrapper's code swapped
per call between the old generation (shape_free -> False) and the new, interleaved, thread time."""
import statistics, sys, time
sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]
import torch
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
from dq import compile_capturing, interleaved
from ember.inductor import wrapper as W
reps = int(sys.argv[2])
for name in sys.argv[1].split(","):
    compiled, args, seen = compile_capturing(name)
    fns = {}
    codes = []
    for module, graph, interp, w in seen:
        orig, orig_other = W._Gen.shape_free, W._Gen.other
        def old_other(self, i, node):  # the reshape as before (always a call)
            rt = node.results[0].type if len(node.results) == 1 else None
            if node.op == "kernels.view" and node.kwargs.get("op") == "prims.reshape" \
                    and isinstance(node.args[0], W.Value) and isinstance(rt, W.TensorType):
                self.lines.append(f"    v{i}_0 = {self.name(node.args[0])}.reshape("
                                  f"{W._shape(list(rt.shape))})")
                self.names[node.results[0]] = f"v{i}_0"
                return
            return orig_other(self, i, node)
        W._Gen.shape_free = lambda self, r: False
        W._Gen.other = old_other
        try:
            old = W.generate(module, graph, interp)
        finally:
            W._Gen.shape_free, W._Gen.other = orig, orig_other
        nl = sum(a != b for a, b in zip(old.source.splitlines(), w.source.splitlines()))
        codes.append((w.call, old.call.__code__, w.call.__code__, nl))
    print(name, "lines changed per graph:", [c[3] for c in codes], flush=True)
    def run(which):
        for fn, o, n, _ in codes:
            fn.__code__ = o if which == "old" else n
        with torch.no_grad():
            return compiled(*args)
    def first(o):
        while not isinstance(o, torch.Tensor):
            o = o[0] if isinstance(o, (tuple, list)) else (o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0])
        return o
    a, b = first(run("old")).clone(), first(run("new")).clone()
    assert torch.equal(a, b), "old and new differ"
    aa = len(sys.argv) > 4
    ts = interleaved({"old": lambda: run("old"), "new": lambda: run("old" if aa else "new")}, reps, warm=3,
                     clock=time.perf_counter_ns)
    o, n = (statistics.median(ts[k]) / 1e6 for k in ("old", "new"))
    d = statistics.median([x - y for x, y in zip(ts["old"], ts["new"])]) / 1e6
    print(f"{name}: old {o:.3f} ms new {n:.3f} ms (median of {reps}, wall, {torch.get_num_threads()} threads), paired old-new {d:.3f} ms", flush=True)
PY
timeout 70 $PY "$T/ab_views.py" hf/mobilebert,timm/edgenext_xx_small 100 16 2>&1 | grep -v Warning | tee "$OUT/s13h7-shape-free16.txt"
cat > "$T/ab.py" <<'PY'
import statistics, sys, time
sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]
import torch
from dq import interleaved
from zoo_models import BY_NAME, FULL
from ember.runtime.compile import compile as ember_compile
from ember.inductor.targets.cpu import linear
threads, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
MODE = ["default"]
orig = linear.use_packed
def rule(m, k, n, bias, t):  # consulted on a bound call's slow path (its first call)
    if MODE[0] == "addmm":
        return t <= 2 and orig(m, k, n, bias, t)
    if MODE[0] == "packed":
        return orig(m, k, n, bias, min(t, 2))
    if MODE[0] == "k512":  # the default without "or a bias": oneDNN only from K >= 512
        return orig(m, k, n, bias, t) and (t <= 2 or k >= 512)
    return orig(m, k, n, bias, t)
linear.use_packed = rule
def first(o):
    while not isinstance(o, torch.Tensor):
        o = o[0] if isinstance(o, (tuple, list)) else (o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0])
    return o
for name in sys.argv[3].split(","):
    fns = {}
    with torch.no_grad():
        torch.manual_seed(0)
        fn, args = BY_NAME[name].build(FULL)
        ref = first(fn(*args))
        fns["eager"] = lambda fn=fn, a=args: fn(*a)
        for mode in ("default", "addmm", "packed", "k512"):
            torch.manual_seed(0)
            f2, a2 = BY_NAME[name].build(FULL)
            MODE[0] = mode
            t0 = time.perf_counter()
            c = ember_compile(f2)
            for _ in range(3):
                out = c(*a2)
            print(f"{name} {mode}: compiled+3 calls {time.perf_counter() - t0:.1f} s, max|diff| vs eager "
                  f"{(first(out) - ref).abs().max().item():.2e}", flush=True)
            fns[mode] = lambda c=c, a=a2, m=mode: (MODE.__setitem__(0, m), c(*a))
        ts = interleaved(fns, reps, warm=5, clock=time.perf_counter_ns)
    e = statistics.median(ts["eager"])
    print(f"## {name} at {threads} threads, wall ms, {reps} rounds (order rotated): median / min / median vs eager")
    for k, v in ts.items():
        print(f"  {k:8s} {statistics.median(v) / 1e6:8.3f} {min(v) / 1e6:8.3f} {statistics.median(v) / e:6.3f}", flush=True)
PY
cat > "$T/shapes.py" <<'PY'
import statistics, sys, time
sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]
import torch
from dq import interleaved
from ember.inductor.targets.cpu import linear
ROWS = [(256, 128, 128), (256, 128, 256), (256, 128, 1024), (256, 256, 128), (256, 256, 256),
        (256, 384, 256), (256, 1024, 128), (128, 168, 168), (128, 168, 504), (128, 168, 672),
        (128, 672, 168), (512, 88, 88), (512, 88, 264), (512, 88, 352), (512, 352, 88),
        (2048, 48, 48), (2048, 48, 144), (2048, 48, 192), (2048, 192, 48), (8192, 24, 96),
        (8192, 96, 24)]
op = torch.ops.mkldnn._linear_pointwise.default
print("## M K N (bias) | threads: oneDNN packed us, addmm us, addmm/packed, rule's pick (wall, median of 40)")
torch.manual_seed(0)
with torch.no_grad():
    for m, k, n in ROWS:
        x = torch.randn(m, k); w = torch.randn(n, k) * 0.05; b = torch.randn(n)
        row = [f"{m:5d} {k:5d} {n:5d}"]
        for t in (16, 8):
            torch.set_num_threads(t)
            pw = torch.ops.mkldnn._reorder_linear_weight(w, None)
            ts = interleaved({"p": lambda: op(x, pw, b, "none", [], ""),
                              "a": lambda: torch.nn.functional.linear(x, w, b)}, 40, warm=5,
                             clock=time.perf_counter_ns)
            p, a = (statistics.median(ts[i]) / 1e3 for i in "pa")
            row.append(f"| {t:2d}t {p:7.1f} {a:7.1f} {a / p:5.2f} {'P' if linear.use_packed(m, k, n, True, t) else 'A'}")
        print(" ".join(row), flush=True)
PY
timeout 130 $PY "$T/ab.py" 16 40 hf/mobilebert,timm/edgenext_xx_small 2>&1 | grep -v Warning | tee "$OUT/s13h7-linear-rule16.txt"
timeout 40 $PY "$T/shapes.py" 2>&1 | tee "$OUT/s13h7-shapes16.txt"
timeout 90 $PY benchmarks/parallelism.py --models hf/mobilebert,timm/edgenext_xx_small --target 16 \
    --reps 8 --measure --top 40 --out "$OUT" --tag s13h7 2>&1 | tail -5
