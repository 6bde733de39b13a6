#!/bin/bash
# s13h1 (issue 18): the CPU schedule's thread-count rules and memory-order reductions, A/B on
# the 16-core CPU machine, from the repository root of ember at or after the commit adding
# benchmarks/thread_plans.py, zoo libraries importable (timm; HF offline). ~2-4 minutes.
# benchmarks/thread_plans.py compiles each model three times in ONE process at 16 threads:
# "old" (the rules before: no row split, static threshold 32768, reduced loops in their own
# order: the private decisions replaced while it compiles), "mem" (only the memory-order
# reductions), "new" (as shipped); checks they agree; calls them round robin (order rotated),
# wall time, prints medians, paired differences to old, minima, kernels split / parallel.
# At 1 thread on the 2-core box (thread time, 40 reps, old vs new): poolformer_s12 153.7 ->
# 145.1 ms (paired -6.2 ms: its GroupNorms' sums over channels-last conv outputs now read one
# contiguous run), levit_128s 33.06 -> 33.13 ms (neutral).
# Expect at 16 threads: poolformer new < mem < old (the row split: 25 GroupNorm calls a forward
# on 16 threads instead of 2; census estimate ~-25%), levit new < mem (51 more kernel calls on
# threads: ~0.3-0.5 ms). Then 2 threads (poolformer, old vs new: only memory order differs).
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
OMP_NUM_THREADS=16 $PY benchmarks/thread_plans.py --models timm/poolformer_s12,timm/levit_128s \
    --threads 16 --clock wall --reps 40 2>&1 | tee "$OUT/thread_plans16.txt"
OMP_NUM_THREADS=2 timeout 90 $PY benchmarks/thread_plans.py --models timm/poolformer_s12 \
    --variants old,new --threads 2 --clock wall --reps 20 2>&1 | tee "$OUT/thread_plans2.txt"
