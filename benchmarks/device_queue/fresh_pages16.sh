#!/bin/bash
# s13h3 (issue 18): do ember's warm calls fault in fresh pages at 16 threads, and what would
# removing every fresh page gain? On the 16-core CPU machine, from the repository root of ember
# at or after the commit adding benchmarks/fresh_pages.py, zoo libraries importable
# (torchvision/timm; HF offline). ~2-3 minutes (5 models compiled once).
# benchmarks/fresh_pages.py, ONE process, 16 threads, wall time: per model eager and ember
# called round robin (order rotated every rep), each call's minor page faults (getrusage, all
# threads) and ms; ember's >= 1 MB new storages a call by op, and its wrapper lines by faults
# a call (--lines: eager called before each ember call, as in the rotation); then glibc told
# to keep freed memory (mallopt: mmap threshold 32 MB, trim threshold 1 GB: process-global,
# eager gains too) and every model timed again: the bound on what any allocation change
# (a cross-call buffer pool, oneDNN outputs into given buffers) could gain there.
# On the 2-core box (1 thread, thread CPU time, 12 reps round robin): ember faults 0-1300
# pages a call (history-dependent: 0 alone; after eager's frees trimmed the heap top), on
# oneDNN convolution lines; at 2 threads resnest14d also 522 a call on a kernel writing a fresh
# 3.2 MB buffer of ember's own; eager 3000-16000. The session 12
# census's 6.4 MB fresh residual output (7.4 ms, its del 1.96 ms) is gone since a236d15 (the
# residual convolution adds into its dying residual in place).
# Read: "default" ember faults/call; the ember lines that fault (a page faults where first
# written: convolution lines = oneDNN's outputs, kernel call lines `_cNNN(v.data_ptr(), ...)` =
# ember's own `_empty` buffers: only those a pool could serve); "keep" vs
# "default" ember ms (and eager's, the control: the phases run one after the other).
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
OMP_NUM_THREADS=16 timeout 230 $PY benchmarks/fresh_pages.py \
    --models tv/resnet50,tv/mobilenet_v2,timm/resnest14d,timm/efficientformer_l1,tv/densenet121 \
    --threads 16 --clock wall --reps 20 --malloc both --lines 6 \
    --json "$OUT/fresh_pages16.json" 2>&1 | grep -v Warning | tee "$OUT/fresh_pages16.txt"
