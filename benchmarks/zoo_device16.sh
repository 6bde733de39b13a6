#!/bin/bash
# benchmarks/zoo_device16.sh (issue 18): the 54-model zoo at 16 threads on the device's
# 16-core CPU, in one device window (~25 min), with zoo.py --per-process (one worker process
# runs many models, so imports and torch.compile's per-process setup, ~10 s + ~50-60 s there,
# are paid once a process).
#   pass 1: check-only, both compilers, torch threads 16, 4 processes side by side (unpinned,
#           --share-cores) pulling models from one queue, filling --cache-dir;
#   pass 2: all models timed at 16 threads (reps 10) in one process (a new one only after a
#           crash or timeout), with those caches: compile columns are "cached compile".
# Needs ember at or after the commit adding zoo.py --per-process, the zoo libraries on the
# device (torchvision, timm, transformers) and `bytecode` in .devlibs (benchmarks/README.md).
#
# Run it from the repository root (carry [".devlibs"]); SHA = `git rev-parse --short HEAD`
# here. Three calls, back to back (the machine is given back 30 s after a call: the detached
# job dies with it), each ~9.5 minutes:
#   1) bash benchmarks/zoo_device16.sh start SHA      (starts the detached job, then polls)
#   2) bash benchmarks/zoo_device16.sh poll
#   3) bash benchmarks/zoo_device16.sh poll           (returns as soon as the job is done)
# Each call leaves $OUT/zoo16.tgz (reports so far, pass logs, progress); after the last:
#   tar xzf zoo16.tgz; the reports are p1/zoo-*-p1.{json,md} and p2/zoo-*-cpu-16core-16t.{json,md}
#   (cp p2's into benchmarks/results). Budgets: P1 (default 600 s), P2 (default 540 s).
# (MODELS=a,b EXTRA="--tiny --compilers ember" THREADS=1 OUT=DIR: a smoke run elsewhere;
#  JOBS=6 CT=3: pass 1's processes and each one's compile threads, default 4 and 4.)
set -u
W=/tmp/z16pp
mode=${1:-poll}

poll() {  # until the job is done or ~9 minutes have passed; then the results into $OUT
  local t0=$SECONDS
  while (( SECONDS - t0 < ${POLL_S:-530} )); do
    grep -q "all done" $W/out/progress.txt 2>/dev/null && break
    sleep 10
  done
  cat $W/out/progress.txt 2>/dev/null
  grep -h "^\[zoo\]" $W/out/p1.log $W/out/p2.log 2>/dev/null | tail -70
  tail -3 $W/out/p2.log 2>/dev/null
  tar czf "$OUT/zoo16.tgz" -C $W out 2>/dev/null
  ls -l "$OUT"
}

case $mode in
start)
  SHA=${2:?usage: zoo_device16.sh start SHA}
  rm -rf $W; mkdir -p $W/out $W/tree
  # a copy of the tree: later calls re-send the working tree under the running job
  cp -a packages benchmarks pyproject.toml .devlibs $W/tree/ 2>/dev/null
  cp "$0" $W/job.sh
  setsid nohup bash $W/job.sh job "$SHA" > $W/out/job.log 2>&1 < /dev/null &
  sleep 5
  poll ;;
job)
  SHA=$2
  cd $W/tree
  export PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' :)$PWD:$PWD/.devlibs
  export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
  date -u +"%F %T start" > $W/out/progress.txt
  nproc >> $W/out/progress.txt
  # pass 1: compile-only; each process's g++ fan-out cut to 4 (4 processes × 4 = the cores)
  OMP_WAIT_POLICY=passive TORCHINDUCTOR_COMPILE_THREADS=${CT:-4} EMBER_COMPILE_JOBS=${CT:-4} \
    python3 benchmarks/zoo.py --models ${MODELS:-all} ${EXTRA:-} --threads ${THREADS:-16} \
      --check-only --jobs ${JOBS:-4} --share-cores --per-process 0 --cache-dir $W/cache --timeout 300 \
      --budget ${P1:-600} --out $W/out/p1 --tag p1 --commit "$SHA" > $W/out/p1.log 2>&1
  date -u +"%F %T pass 1 done" >> $W/out/progress.txt
  # pass 2: timed, one process, the whole machine
  python3 benchmarks/zoo.py --models ${MODELS:-all} ${EXTRA:-} --threads ${THREADS:-16} \
    --reps 10 --no-warm --per-process 0 --cache-dir $W/cache --timeout 150 --budget ${P2:-540} \
    --out $W/out/p2 --tag cpu-16core-16t --commit "$SHA" > $W/out/p2.log 2>&1
  date -u +"%F %T pass 2 done" >> $W/out/progress.txt
  date -u +"%F %T all done" >> $W/out/progress.txt ;;
poll)
  poll ;;
esac
