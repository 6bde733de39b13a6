#!/bin/bash
# s11h1 (issue 18): on the 16-core CPU machine, from the repository root of ember at or after
# the commits "CPU packed weights cached per thread count" and "benchmarks/parallelism.py
# --measure: timed at --target threads on packed weights made at that count", with the zoo
# libraries importable (torchvision, timm, transformers; HF offline):
# 1) which conv/linear weight layouts oneDNN picks at 1 vs 16 threads on THIS CPU (the 2-core
#    Xeon: 3 of resnet50's 23 conv shapes differ, no linear), and whether a 1-thread pack is
#    reordered per call at 16 threads (run-reorders > 0) -> $OUT/s11h1-layouts.txt;
# 2) the census again on resnet50 (and the linear-heavy bert, gpt2): its 16-thread measurement
#    now on packs made at 16 threads (the report says "all made at 16 threads"). Compare with
#    parallelism-2026-12-03-16t-16core-measured.md: resnet50 measured 67.3 ms, packed.bind
#    159 -> 63 ms; the zoo's ember resnet50 at 16 threads was 36 ms.
. "$(dirname "$0")/common.sh"  # (set -x, PYTHONPATH, HF offline, $OUT, $PY, $T)
cat > "$T/sweep.py" <<'PY'
"""Pack each resnet50 conv at thread count A, run at B: does oneDNN reorder per call?"""
import os, sys, torch
A, B = int(sys.argv[1]), int(sys.argv[2])
# (C, O, H, k, stride)
L = [(3,64,224,7,2),(64,64,56,1,1),(64,64,56,3,1),(64,256,56,1,1),(256,64,56,1,1),
     (256,128,56,1,1),(128,128,56,3,2),(128,512,28,1,1),(512,128,28,1,1),(128,128,28,3,1),(256,512,56,1,2),
     (512,256,28,1,1),(256,256,28,3,2),(256,1024,14,1,1),(1024,256,14,1,1),(256,256,14,3,1),(512,1024,28,1,2),
     (1024,512,14,1,1),(512,512,14,3,2),(512,2048,7,1,1),(2048,512,7,1,1),(512,512,7,3,1),(1024,2048,14,1,2)]
LIN = [(2,2048,1000),(64,768,768),(6272,96,384),(128,768,3072)]
for C,O,H,k,s in L:
    x = torch.randn(2, C, H, H).to(memory_format=torch.channels_last)
    w = torch.randn(O, C, k, k); pad=[k//2]*2
    torch.set_num_threads(A)
    print(f"### conv {C}->{O} {k}x{k} s{s} @{H}", flush=True)
    print("PACK", flush=True)
    pw = torch.ops.mkldnn._reorder_convolution_weight(w, pad, [s,s], [1,1], 1, list(x.shape))
    torch.set_num_threads(B)
    print("RUN", flush=True)
    for i in range(2):
        torch.ops.mkldnn._convolution_pointwise(x, pw, None, pad, [s,s], [1,1], 1, "none", [], "")
    sys.stdout.flush()
for M,K,N in LIN:
    x = torch.randn(M, K); w = torch.randn(N, K)
    torch.set_num_threads(A)
    print(f"### linear {M}x{K}x{N}", flush=True)
    print("PACK", flush=True)
    pw = torch.ops.mkldnn._reorder_linear_weight(w, None)
    torch.set_num_threads(B)
    print("RUN", flush=True)
    for i in range(2):
        torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")
    sys.stdout.flush()
PY
cat > "$T/summ.py" <<'PY'
import sys, re
cur=None; phase=None; res={}
for line in sys.stdin:
    line=line.rstrip()
    if line.startswith("###"): cur=line[4:]; res[cur]={"pack":[], "run":[]}; continue
    if line in ("PACK","RUN"): phase=line.lower(); continue
    if not line.startswith("onednn_verbose,v1,primitive,exec") or cur is None: continue
    f=line.split(",")
    kind, impl, md = f[5], f[6], f[8]
    res[cur][phase].append((kind, impl, md))
for k,v in res.items():
    packdst = [re.search(r"dst:f32:[^:]*:blocked:([^:]+)", m).group(1) for kd,i,m in v["pack"] if kd=="reorder"]
    runre = [kd for kd,i,m in v["run"] if kd=="reorder"]
    impls = sorted({i for kd,i,m in v["run"] if kd!="reorder"})
    wei = sorted({re.search(r"wei:f32:[^:]*:blocked:([^:]+)", m).group(1) for kd,i,m in v["run"] if kd!="reorder"})
    print(f"{k:32s} pack->{packdst} run-reorders={len(runre)} impl={impls} wei={wei}")
PY
for ab in "1 1" "16 16" "1 16" "16 1" "1 8" "8 8"; do
    echo "== pack at ${ab% *} threads, run at ${ab#* }"
    ONEDNN_VERBOSE=1 OMP_NUM_THREADS=16 $PY "$T/sweep.py" $ab 2>&1 | $PY "$T/summ.py"
done > "$OUT/s11h1-layouts.txt" 2>&1
cat "$OUT/s11h1-layouts.txt"
$PY benchmarks/parallelism.py --models tv/resnet50,hf/bert,hf/gpt2 --target 16 --measure \
    --reps 15 --out "$OUT" --tag 16core-measured-repacked
