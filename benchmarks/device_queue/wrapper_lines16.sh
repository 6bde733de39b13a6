#!/bin/bash
# s12h1 (issue 18, session 12): on the 16-core CPU machine, from the repository root of ember at
# or after d32f09b (the attention extern's binder 0c10ddd, the kernels' C caller be09146
# targets/cpu/trampoline.py, prims.matmul as torch.bmm d32f09b), zoo libraries importable (timm, transformers; HF offline).
# Per-line A/B of the generated wrappers, OLD (the attention through the interpreter's
# reference, kernels through ctypes, 3-d matmuls through torch.matmul) vs NEW, calls interleaved in one process; each line timed
# (benchmarks/parallelism.py's instrument), sums of per-line medians per line kind. At 1 thread
# by thread CPU time, at 16 threads by wall time. Output: $OUT/s12h1-ab.txt
# Then: does OpenMP's spin-wait slow levit's serial kernels at 16 threads (on the 16t census
# they took 1.6-1.9x their 1-thread time)? The census at 16t measured with
# OMP_WAIT_POLICY=PASSIVE vs the default: compare the 'kernel' lines without a pragma.
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
cat > "$T/hook_tramp.py" <<'PY'
from ember.inductor import launch as _L
from ember.inductor import wrapper as _W
_orig = _L.LoadedKernel.launcher
_mm = _W._matmul_kernel
def _nofast(self, nargs, nsizes=0):
    f = self.fast
    self.fast = None
    try:
        return _orig(self, nargs, nsizes)
    finally:
        self.fast = f
def old_setup():  # kernels through ctypes, prims.matmul through its reference
    _L.LoadedKernel.launcher = _nofast
    _W._matmul_kernel = lambda node: None
def new_setup():
    _L.LoadedKernel.launcher = _orig
    _W._matmul_kernel = _mm
PY
cat > "$T/ab_lines.py" <<'PY'
"""Per-line A/B: old vs new generated wrappers, each line timed (benchmarks/parallelism.py's
instrument: thread CPU time), calls interleaved old/new in one process, 1 thread. Reports per
line kind the sum of the lines' medians."""
import os, sys, time, statistics, re, collections
THREADS = int(os.environ.get("AB_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]
import torch
torch.set_num_threads(THREADS)
import parallelism as P
from dq import compile_capturing
from ember.inductor import wrapper as W
from ember.inductor.targets.cpu import attention, flash

def old_forward_run(interp, args, kw):  # HEAD's _forward_run
    out, lse = flash.forward(*args, **{k: v for k, v in kw.items() if k != "kernel"},
                             heads_last=True)
    return out.transpose(1, 2), lse.transpose(1, 2)

name, reps = sys.argv[1], int(sys.argv[2])
OLD_HOOK = os.environ.get("OLD_HOOK")  # extra: a python file defining old_setup()/new_setup()
compiled, args, seen = compile_capturing(name)
hook = {}
if OLD_HOOK:
    exec(open(OLD_HOOK).read(), hook)
saved = dict(W._BINDERS)
if not os.environ.get("KEEP_BINDER"): W._BINDERS.pop(attention.HEADS_LAST, None)
if "old_setup" in hook: hook["old_setup"]()
olds = []
for module, graph, interp, w in seen:
    wo = W.generate(module, graph, interp)
    ns = wo.call.__globals__
    for k, v in list(ns.items()):
        if v is attention._forward_run:
            ns[k] = old_forward_run
    olds.append(P.instrument(wo.source, ns))
if "new_setup" in hook: hook["new_setup"]()
W._BINDERS.update(saved)
news, impls = [], []
for module, graph, interp, w in seen:
    wn = W.generate(module, graph, interp)
    news.append(P.instrument(wn.source, wn.call.__globals__))
    impl = [None]
    g = {"_impl": impl}
    exec("def call(inputs):\n    return _impl[0](inputs)\n", g)
    w.call.__code__ = g["call"].__code__
    w.call.__globals__["_impl"] = impl
    impls.append(impl)
CLOCK = time.thread_time_ns if THREADS == 1 else time.perf_counter_ns
ov = P.clock_overhead(CLOCK)
for g, _ in olds + news:
    g["_tt"] = CLOCK
def use(gs):
    for impl, (g, _) in zip(impls, gs):
        impl[0] = g["call"]
samples = {"old": [[[] for _ in s] for _, s in olds], "new": [[[] for _ in s] for _, s in news]}
with torch.no_grad():
    for r in range(reps + 2):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            gs = olds if which == "old" else news
            for g, _ in gs:
                g["_acc"][:] = [0] * len(g["_acc"])
            use(gs)
            compiled(*args)
            if r >= 2:
                for gi, (g, _) in enumerate(gs):
                    for k, v in enumerate(g["_acc"]):
                        samples[which][gi][k].append(v)
def kinds(gs, smp):
    out = collections.Counter(); n = collections.Counter()
    for gi, (g, stmts) in enumerate(gs):
        kernels = {}
        for k, s in enumerate(stmts):
            kind, nm = P.classify(s, g, {})
            if "_ic.check" in s or "_ic.each" in s: kind, nm = "wrapper", "inputcheck"
            if "ember_k_" in nm or (".data_ptr()" in s and kind != "extern"): kind, nm = "kernel", "kernel call"
            if "_forward_run" in nm or "forward_heads_last" in str(g.get(re.match(r"^\s*[\w, ]+= (_c\d+)", s).group(1)) if re.match(r"^\s*[\w, ]+= (_c\d+)", s) else ""):
                nm = "attention"
            key = (kind, nm if kind != "wrapper" else nm)
            out[key] += max(0.0, statistics.median(smp[gi][k]) - ov); n[key] += 1
    return out, n
ko, no = kinds(olds, samples["old"]); kn, nn = kinds(news, samples["new"])
print(f"{name}: per line kind, sum of per-line medians (us), old -> new; {reps} interleaved calls each, {THREADS} threads, clock {CLOCK.__name__}")
for key in sorted(set(ko) | set(kn), key=lambda k: -(ko[k] + kn[k])):
    print(f"   {key[0]:8s} {key[1][:40]:40s} n {no[key]:4d} -> {nn[key]:4d}  {ko[key]/1e3:9.1f} -> {kn[key]/1e3:9.1f}")
print(f"   total lines {sum(ko.values())/1e6:.3f} -> {sum(kn.values())/1e6:.3f} ms")
PY
for th in 1 16; do
  for m in timm/levit_128s hf/bert timm/deit_tiny_patch16_224; do
    AB_THREADS=$th OMP_NUM_THREADS=$th OLD_HOOK="$T/hook_tramp.py" $PY "$T/ab_lines.py" $m 40 2>&1 | tail -16
  done
done > "$OUT/s12h1-ab.txt" 2>&1
cat "$OUT/s12h1-ab.txt"
OMP_WAIT_POLICY=PASSIVE $PY benchmarks/parallelism.py --models timm/levit_128s --target 16 --measure --reps 15 --out "$OUT" --tag 16core-s12h1-passive
$PY benchmarks/parallelism.py --models timm/levit_128s --target 16 --measure --reps 15 --out "$OUT" --tag 16core-s12h1-active
