#!/bin/bash
# s12h4 (issue 18): the packed convolution adding into its dying residual in place
# (plan-buffers' INTO_FORMS + packed.py's into_residual=true: oneDNN's
# _convolution_pointwise_.binary, TorchInductor's under freezing), on the 16-core CPU machine,
# from the repository root of ember at or after the commit "packed convolution: a residual
# that dies there is added into in place", with the zoo libraries importable (torchvision;
# HF offline). ~1-2 minutes.
# benchmarks/conv_inplace.py compiles each model twice in ONE process: "old" with the in-place
# form unregistered while it compiles (every residual convolution allocates a fresh output, as
# before), "new" as shipped; checks both against eager; counts allocations >= 1 MB per call
# (1 thread at the 2-core box: resnet50 26 -> 13, 16 in-place convolutions); then times the
# calls interleaved (order rotated every rep), wall clock, 16 threads, eager in the rotation.
# Expect at 16 threads: resnet50 new < old (census: the residual conv layer1.2.conv3 7.4 ms vs
# 1.2-1.9 for its twins, and the `del` of its fresh 6.4 MB output 1.96 ms, both from fresh
# mmap'd pages); mobilenet_v2 ~unchanged (its residual outputs are < 1 MB).
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
export OMP_NUM_THREADS=16
$PY benchmarks/conv_inplace.py --models tv/resnet50,tv/mobilenet_v2 --threads 16 --clock wall \
    --reps 40 --eager
# the same at 1 thread, thread CPU time (no regression there)
OMP_NUM_THREADS=1 $PY benchmarks/conv_inplace.py --models tv/resnet50 --threads 1 --reps 6
