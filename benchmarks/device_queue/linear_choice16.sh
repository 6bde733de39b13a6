#!/bin/bash
# s12h2 (issue 18): loop.linear_packed's thread-aware choice (linear.use_packed: above 2 threads
# oneDNN's packed linear only from SMALL_LINEAR * threads / 2 multiply-adds and with K >= 512 or
# a bias; addmm otherwise) and its bound call's fast path, on the 16-core CPU machine, from the
# repository root of ember at or after the s12h2 commit. ~3-4 min. Writes $OUT/linear16.txt.
# 1) every linear shape of the zoo's transformers (diag16.txt's table, hard-coded: no model
#    libraries needed) at 16, 8, 4 and 3 threads: oneDNN on the pack vs addmm, alternating, wall
#    clock, median of 40 after warm-up; the rule's pick and whether it was the faster (by >10%).
#    3-7 threads were never measured: this fills them in.
# 2) the bound call (what the generated wrapper calls) new vs old (5c74e44's linear.py from git
#    history; skipped without it) vs the raw faster op, per shape, at 16 threads, interleaved:
#    the per-call cost over the op, and the old rule's loss on small products. On the 2-core
#    machine at 1 thread (thread CPU time, random order, 400 reps, 2x64x64): addmm path
#    5.5 -> 4.5 us, packed path 25.5 -> 21.8 us.
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
export OMP_NUM_THREADS=16
git show 5c74e44:packages/inductor/src/ember/inductor/targets/cpu/linear.py > "$T/old_linear.py" 2>/dev/null || rm -f "$T/old_linear.py"
cat > "$T/lin.py" <<'PY'
import importlib.util, os, statistics, sys, time
sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]
import torch
from dq import interleaved
import ember.inductor  # noqa
from ember.inductor.targets.cpu import linear
ROWS = [(2, 192, 1000, 1), (2, 256, 256, 1), (2, 384, 1000, 1), (2, 768, 1000, 1), (32, 256, 256, 0),
        (32, 256, 384, 0), (32, 384, 512, 0), (32, 384, 768, 0), (32, 768, 384, 0), (32, 1024, 384, 0),
        (98, 128, 128, 0), (98, 192, 256, 0), (98, 256, 384, 0), (98, 256, 512, 0), (98, 256, 1280, 0),
        (98, 512, 256, 0), (98, 768, 3072, 1), (98, 1536, 768, 0), (98, 3072, 768, 1), (256, 256, 128, 0),
        (256, 256, 256, 0), (256, 256, 256, 1), (256, 256, 768, 1), (256, 256, 1024, 0), (256, 256, 1024, 1),
        (256, 256, 8192, 0), (256, 1024, 256, 0), (256, 1024, 256, 1), (392, 128, 128, 0), (392, 128, 256, 0),
        (392, 128, 640, 0), (392, 256, 128, 0), (392, 384, 1536, 1), (392, 768, 384, 0), (392, 1536, 384, 1),
        (394, 192, 192, 1), (394, 192, 576, 1), (394, 192, 768, 1), (394, 768, 192, 1), (394, 768, 3072, 1),
        (394, 3072, 768, 1), (1568, 192, 768, 1), (1568, 384, 192, 0), (1568, 768, 192, 1), (6272, 96, 384, 1),
        (6272, 384, 96, 1)]
old = None
if os.path.exists(sys.argv[1]):
    spec = importlib.util.spec_from_file_location("old_linear", sys.argv[1])
    old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
    from ember.inductor.wrapper import register_binder
    register_binder(linear.LINEAR_OP, linear.bind)  # (the old module registered its own)
op = torch.ops.mkldnn._linear_pointwise.default

def med(fns, reps):  # us, wall clock, after 5 rounds of warm-up, the order rotated each round
    ts = interleaved(fns, reps, warm=5, clock=time.perf_counter_ns)
    return {k: statistics.median(v) / 1e3 for k, v in ts.items()}

torch.manual_seed(0)
print("## 1) oneDNN packed vs addmm, us (wall, median of 40, alternating); rule = use_packed's pick")
bad = {}
with torch.no_grad():
    for m, k, n, bias in ROWS:
        x = torch.randn(m, k); w = torch.nn.Parameter(torch.randn(n, k) * 0.05, requires_grad=False)
        b = torch.randn(n) if bias else None
        row = [f"{m:5d} {k:5d} {n:5d} {bias}"]
        for t in (16, 8, 4, 3):
            torch.set_num_threads(t)
            pw = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            r = med({"p": lambda: op(x, pw, b, "none", [], ""),
                     "a": lambda: torch.nn.functional.linear(x, w, b)}, 40)
            pick = linear.use_packed(m, k, n, bool(bias), t)
            wrong = (r["p"] < r["a"]) != pick and abs(r["p"] - r["a"]) > 0.1 * min(r.values())
            bad.setdefault(t, []).append(f"{m}x{k}x{n}{'b' if bias else ''}") if wrong else None
            row.append(f"| {t:2d}t {r['p']:8.1f} {r['a']:8.1f} {r['a'] / r['p']:5.2f} {'P' if pick else 'A'}{'!' if wrong else ' '}")
        print(" ".join(row), flush=True)
for t, v in bad.items():
    print(f"rule wrong by >10% at {t}t: {len(v)}: {' '.join(v)}")
print("## 2) bound call at 16 threads, us (wall, median of 60, interleaved): new call, old call, best raw op")
torch.set_num_threads(16)
with torch.no_grad():
    for m, k, n, bias in ROWS:
        x = torch.randn(m, k); w = torch.nn.Parameter(torch.randn(n, k) * 0.05, requires_grad=False)
        b = torch.randn(n) if bias else None
        kw = {"bias": True} if bias else {}
        args = (x, w, b) if bias else (x, w)
        pw = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
        fns = {"new": lambda c=linear.bind(kw): c(*args),
               "packed": lambda: op(x, pw, b, "none", [], ""),
               "addmm": lambda: torch.nn.functional.linear(x, w, b)}
        if old is not None:
            fns["old"] = lambda c=old.bind(kw): c(*args)
        r = med(fns, 60)
        best = min(r["packed"], r["addmm"])
        print(f"{m:5d} {k:5d} {n:5d} {bias} | new {r['new']:8.1f} old {r.get('old', float('nan')):8.1f} "
              f"best op {best:8.1f} | new-best {r['new'] - best:6.1f}", flush=True)
PY
$PY "$T/lin.py" "$T/old_linear.py" 2>&1 | tee "$OUT/linear16.txt"
