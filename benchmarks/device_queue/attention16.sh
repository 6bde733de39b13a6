#!/bin/bash
# s11h2 (issue 18): ember's CPU attention kernel (targets/cpu/flash.py) split over
# (batch, head, query block) with the heads' keys and values packed once (d4bb637) and keys
# packed 16 at a time (172e81a), vs the kernel before (c462def: split only while parts keep
# >= 4 blocks, each part repacking its head), on a 16-core CPU machine, from the repository
# root of ember at or after e18bbc7. Without git history here the "old" kernel is the new
# source with the shared packing off (the old split rule; the new key packing).
# Both kernels are called directly (ctypes), alternating old/new every rep in one process,
# outputs checked bit-identical. Expect at 16 threads: bert [2x4, 128x128x64] 64 tasks
# (old 32, each packing a head), deit [2x3, 197x197x64] 66 tasks (old 24), one head of 128
# rows 16 tasks (old 4), one causal head of 256 rows 32 tasks (old 8, in row order).
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
export OMP_NUM_THREADS=16
OLD=/tmp/s11h2_old_flash.py
if git show c462def:packages/inductor/src/ember/inductor/targets/cpu/flash.py > "$OLD" 2>/dev/null; then
  OLDARG="--old-source $OLD"
else  # (no history here: the new source with the shared packing off, the old split rule)
  OLDARG=""
fi
# 16 threads, wall clock (a quiet machine), the models' shapes and B*H < threads
$PY benchmarks/attention_threads.py --threads 16 --clock wall --reps 400 $OLDARG \
    --shapes bert,deit,gpt2,gpt2_12h,one,one_causal,swin
# the same under SCHED_FIFO where permitted (says why not otherwise)
$PY benchmarks/attention_threads.py --threads 16 --clock wall --realtime --reps 400 $OLDARG \
    --shapes bert,deit,gpt2,one,one_causal
# 8 threads (bert's 8 heads: one a thread before; deit 6 heads)
OMP_NUM_THREADS=8 $PY benchmarks/attention_threads.py --threads 8 --clock wall --reps 400 $OLDARG \
    --shapes bert,deit,gpt2,one_causal
# 1 thread, thread CPU time: no regression
OMP_NUM_THREADS=1 $PY benchmarks/attention_threads.py --threads 1 --clock thread --reps 200 $OLDARG \
    --shapes bert,deit,gpt2,swin
# the thread-count tests (1, 3, 7, 16 threads: same bits, the math's values)
$PY -m pytest -q packages/inductor/tests/test_cpu_flash_attention.py
