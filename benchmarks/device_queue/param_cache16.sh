#!/bin/bash
# s12h5 (issue 18): kernel calls on parameters alone kept between calls (inductor/paramcache.py,
# commit af28200 "inductor: kernel calls on graph inputs alone ... run only where those inputs
# changed"), A/B on the 16-core CPU machine, from the repository root of ember at or after
# af28200, with the zoo libraries importable (torchvision/timm; HF offline). ~2-3 minutes.
# benchmarks/param_cache.py compiles each model twice in ONE process: "off" with
# EMBER_PARAM_CACHE=0 while its wrappers are generated (every BN scale/shift kernel runs each
# call, as before), "on" as shipped; checks on == off; alternates the two calls every rep
# (order flipped each rep), prints medians, the median of paired differences (off - on),
# minima, and kernel calls a forward (resnet50 56 -> 2, mobilenet_v2 54 -> 1, levit 298 -> 187).
# At 1 thread on the 2-core box (thread time, 300 reps): levit -614 us, mobilenet_v2 -737 us.
# Expect at 16 threads: levit and mobilenet_v2 on < off by ~0.2-0.5 ms (census at 16t: those
# kernel lines 0.17 ms levit, 0.30 ms mobilenet_v2, 0.71 ms resnet50, plus 2 allocations each).
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
export OMP_NUM_THREADS=16
$PY benchmarks/param_cache.py --models timm/levit_128s,tv/mobilenet_v2,tv/resnet50 \
    --threads 16 --clock wall --reps 60
