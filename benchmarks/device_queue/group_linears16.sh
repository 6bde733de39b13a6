#!/bin/bash
# s13h2 (issue 18): `group-linears` (targets/cpu/group_linear.py: the linears of one input by
# parameter weights as one product by the concatenated weights, one loop.linear_grouped call,
# the results sliced), A/B on the 16-core CPU machine, from the repository root of ember at or
# after the s13h2 commit. ~3-4 min. Writes $OUT/group_linears16.txt.
# benchmarks/group_linears.py compiles each model two or three times in ONE process (16
# threads at compile: the pass groups every candidate there): "off" without the pass, "on" as
# shipped (q/k/v, gate/up grouped), "kernels" (bert, t5) grouping only linears a kernel reads
# (none in bert and t5: what ships at 1-2 threads, i.e. = off there); checks they agree; calls
# them round robin (order rotated each round), wall clock, median, minimum, ratio and paired
# difference vs off.
# At 1 thread on the 2-core box (thread time, 150 reps, on vs off): see the commit message;
# at 1 thread q/k/v read straight by the attention as slices of one [M, 3N] result cost the
# attention ~10% (strided rows), more than the one product saved, hence "kernels" there.
# Expect at 16 threads: on faster than off by ~2 fork/join + oneDNN setups per group
# (~20-50 us a group: bert 4 groups, llama/qwen2/gemma 8); deit (timm: one qkv Linear
# already) unchanged.
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
export OMP_NUM_THREADS=16
# bert and t5-encoder (q/k/v straight into the attention / bmm) with the kernels-only
# variant too; then the llama family (q/k/v and gate/up grouped at any thread count) and deit
# (timm: one qkv Linear already: on = off, an A/A line)
timeout 120 $PY benchmarks/group_linears.py --models hf/bert,hf/t5-encoder \
    --threads 16 --clock wall --reps 30 --variants off,on,kernels | tee "$OUT/group_linears16.txt"
timeout 110 $PY benchmarks/group_linears.py \
    --models hf/llama,hf/qwen2,hf/gemma,timm/deit_tiny_patch16_224 \
    --threads 16 --clock wall --reps 30 --variants off,on | tee -a "$OUT/group_linears16.txt"
