#!/bin/bash
# s12h3 (issue 18): the guard check before each compiled call, on the 16-core CPU machine, from
# the repository root of ember at or after 7c0001e (7a784d4: identity tests for immutable
# values in the fast check, prefetch of the lines the last check read (guardvm.py), the tensor
# check's prefetch pipeline (tensorcheck.py)), zoo libraries importable, HF offline.
# A/B in one process: the hot entry's guard program as built by 5c74e44's guardvm.py and
# tensorcheck.py (loaded under other module names; fast check without identity tests) and by
# the tree's, swapped in per call, interleaved; thread CPU time of the guard and of the whole
# call less the generated wrapper ("outside"), median of 40 calls, at 1 and 16 threads.
# On the 2-core machine at 1 thread (guard / outside us): bert 267->183 / 399->324,
# mobilenet_v2 417->288 / 517->390, levit_128s 435->282 / 535->378.
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
git show 5c74e44:packages/runtime/src/ember/runtime/guardvm.py \
  | sed 's/^MODULE = "ember_guardvm"/MODULE = "ember_guardvm_old"/' > "$T/guardvm_old.py" || exit 1
git show 5c74e44:packages/runtime/src/ember/runtime/tensorcheck.py \
  | sed 's/^MODULE = "ember_tensorcheck"/MODULE = "ember_tensorcheck_old"/; s/^register_checker(checker)//' \
  > "$T/tensorcheck_old.py" || exit 1
cat > "$T/ab.py" <<'PY'
import os, sys, time, statistics, importlib.util
threads = int(sys.argv[2])
os.environ["OMP_NUM_THREADS"] = str(threads)
sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]
import torch
torch.set_num_threads(threads)
from dq import compile_capturing
from ember.runtime.compile import compiled_function_of
from ember.runtime import fastguards, guardvm, tensorcheck
from parallelism import instrument_whole
tt = time.thread_time_ns
T = os.environ["T"]
def load(name):
    spec = importlib.util.spec_from_file_location(name, f"{T}/{name}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
gold, told = load("guardvm_old"), load("tensorcheck_old")
name = sys.argv[1]
compiled, args, seen = compile_capturing(name)
cf = compiled_function_of(compiled)
e = cf._hot; S = cf.self_obj
torch.set_grad_enabled(False)
expected = e.code.full(S, args, {})
cap = {}
orig_prog = guardvm.program
def prog(source, values, full):
    cap["values"] = values; return orig_prog(source, values, full)
guardvm.program = prog
_, new_src = fastguards.fast_check(e.code.guards, e.code.inputs, e.code.full, S, args, {}, expected)
new_ns = cap["values"]
anchor = fastguards._Builder._frozen_anchor
fastguards._Builder._frozen_anchor = lambda self, g: None
_, old_src = fastguards.fast_check(e.code.guards, e.code.inputs, e.code.full, S, args, {}, expected)
old_ns = dict(cap["values"])
fastguards._Builder._frozen_anchor = anchor
guardvm.program = orig_prog
newcheck, oldcheck = tensorcheck.checker().check, told.checker().check
old_ns = {k: (oldcheck if v is newcheck else v) for k, v in old_ns.items()}
progs = {"base": gold.program(old_src, old_ns, e.code.full),
         "new": orig_prog(new_src, new_ns, e.code.full)}
for k, p in progs.items():
    assert p is not None and type(p(S, args, {})) is list, k
acc = [0]
def timed(f):
    def g(*a):
        t = tt(); r = f(*a); acc[0] += tt() - t; return r
    return g
fns = {k: timed(p) for k, p in progs.items()}
accw = [0]
for *_, w in seen:
    g = instrument_whole(w.source, w.call.__globals__)
    w.call.__code__ = g["call"].__code__
    w.call.__globals__.update({"_tt": tt, "_accw": accw})
res = {k: {"guard": [], "outside": [], "call": []} for k in fns}
for r in range(42):
    for k, f in fns.items():
        e.code.guard = f
        acc[0] = 0; accw[0] = 0
        t = tt(); compiled(*args); whole = tt() - t
        if r >= 2:
            res[k]["guard"].append(acc[0]); res[k]["outside"].append(whole - accw[0])
            res[k]["call"].append(whole)
for k in fns:
    print(f"{name} {threads}t {k:5s}", " ".join(f"{m} {statistics.median(v)/1e3:.1f} us"
                                             for m, v in res[k].items()), flush=True)
PY
for t in 1 16; do
  for m in hf/bert tv/mobilenet_v2 timm/levit_128s; do
    $PY "$T/ab.py" "$m" "$t" 2>&1 | grep -E "us$|Error|error" | tee -a "$OUT/s12h3-guards-16core.txt"
  done
done
