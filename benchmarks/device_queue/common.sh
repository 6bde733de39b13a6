# Sourced by the device scripts here (`. "$(dirname "$0")/common.sh"`), each run from ember's
# repository root on the lent 16-core host (see README.md): ember's sources, the repository
# root (benchmarks/) and .devlibs (the `bytecode` package) importable ahead of the host's own
# PYTHONPATH, Hugging Face offline (no network there), results under $OUT (the device call's
# folder, else benchmarks/results), a scratch folder $T (exported: the scripts' Python reads it),
# the interpreter $PY (python unless set), and each command echoed (set -x).
# Their Python shares benchmarks/device_queue/dq.py (a zoo model compiled with its generated
# wrappers captured; the interleaved A/B timing loop).
set -x
export HF_HUB_OFFLINE=1
PYTHONPATH=$(ls -d "$PWD"/packages/*/src | tr '\n' :)$PWD:$PWD/.devlibs${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
OUT=${OUT:-benchmarks/results}
PY=${PY:-python}
mkdir -p "$OUT"
T=$(mktemp -d)
export T
