#!/bin/bash
# s13h6 (issue 18): graphs with random ops (philox seed/offset parameters) through the
# generated wrapper instead of the reference interpreter (commit fb45cf2 "inductor wrapper:
# graphs with random ops ..."). On the device, transformers 5.17's Wav2Vec2Encoder draws
# `torch.rand([])` per layer even in eval (dead there: dce drops the draw, the graph keeps its
# seed/offset parameters), so hf/wav2vec2 ran its whole graph on the interpreter before:
# ember 22.9 ms vs eager 19.6 (0.86x), torch.compile 17.5 (zoo-2026-12-03-...-all54-merged).
# Run from the repository root at or after that commit. ~2-3 minutes.
#  1. the zoo on hf/wav2vec2 and hf/bert (bert: a control without random ops);
#  2. one process, hf/wav2vec2's compiled graph: the generated call (new) vs the interpreter
#     (old path), same inputs, interleaved rotated rounds, wall clock at 16 threads.
# Expect: (1) wav2vec2's ember time near or below eager, no "interpreter" fallback note;
# (2) new < old by the interpreter's per-node overhead (1 thread here: 161.3 vs 171.1 ms).
set -x
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=16
export PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' :)$PWD:$PWD/.devlibs${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
$PY -c "import transformers; print('transformers', transformers.__version__)"
timeout 230 $PY benchmarks/zoo.py --models hf/wav2vec2,hf/bert --threads 16 --reps 10 --no-warm \
    --per-process 0 --timeout 200 --out $OUT --tag s13h6
timeout 120 $PY - <<'PY' 2>&1 | tee $OUT/s13h6-ab.txt
import importlib, statistics, sys, time
sys.path[:0] = ["benchmarks", "benchmarks/device_queue"]
import torch
torch.set_num_threads(16)
import dq
from ember.prims.decomp.random import draws, philox_params
from ember.runtime.fallbacks import interpreter_reason
rc = importlib.import_module("ember.runtime.compile")
got = []
orig = rc.compiled_runner
def hook(compiled, source=None):
    run = orig(compiled, source)
    def rec(graph, inputs):
        got.append((compiled, source, graph, list(inputs)))
        return run(graph, inputs)
    return rec
rc.compiled_runner = hook
compiled, args, _ = dq.compile_capturing("hf/wav2vec2", warm=1)
rc.compiled_runner = orig
cm, src, graph, inputs = got[0]
g = cm.graph(graph)
print("graph", g.name, "philox", philox_params(g), "draws", draws(g), "nodes", len(g.nodes))
print("interpreter_reason:", interpreter_reason(cm, g.name))
new, old = orig(cm, src), orig(cm, src)
old.calls[graph] = None  # the interpreter path, as random graphs ran before
with torch.no_grad():
    for x, y in zip(new(graph, inputs).outputs, old(graph, inputs).outputs):
        torch.testing.assert_close(x, y)
    print("wrapper used:", new.calls[graph] is not None)
    res = dq.interleaved({"new (wrapper)": lambda: new(graph, inputs),
                          "old (interpreter)": lambda: old(graph, inputs)}, 40, warm=5,
                         clock=time.perf_counter_ns)
for k, v in res.items():
    print(f"{k:20s} median {statistics.median(v)/1e6:8.3f} ms  min {min(v)/1e6:.3f}  n={len(v)}")
d = [b - a for a, b in zip(res["new (wrapper)"], res["old (interpreter)"])]
print(f"median paired (old - new) {statistics.median(d)/1e6:.3f} ms")
PY
