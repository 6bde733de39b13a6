#!/bin/bash
# s13h4 (issue 18): the param cache's hit tests hoisted to the top of the wrapper (commit
# 2cd3366 "inductor wrapper: the param cache's hit tests ... run together before the first
# node's lines"), A/B at 16 threads in ONE process, from the repository root of ember at or
# after 2cd3366. Per model: compiled once; "old" = the generated wrapper source turned back to
# the pre-2cd3366 form (each hit test at its kernel call; verified byte-identical on levit),
# "new" = as generated; both exec'd from source the same way and swapped into the compiled
# function's code per call; order shuffled per round, gc off while timed; wall time
# (perf_counter) per call, 150 rounds after 5 warm-up; prints medians, median of paired
# differences (new - old), minima. At 1 thread on the 2-core box (thread time): levit_128s
# -1.1..-1.4 ms of ~36 ms whole call (before c2c5fcf's C value test); with c2c5fcf in both,
# the kept-call lines alone (per-line timers, 25 rounds): levit 866 -> 469 us, mobilenet_v2
# 1277 -> 687, resnet50 2040 -> 864. Expect at 16 threads (serial host work): levit,
# mobilenet_v2 -0.2..-0.5 ms, resnet50 -0.3..-1 ms. ~3 minutes (compiles included).
export PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' :)$PWD:$PWD/.devlibs HF_HUB_OFFLINE=1
export OMP_NUM_THREADS=16
PY=${PY:-python3}
mkdir -p "${OUT:-/tmp/s13h4-out}"
$PY - "${MODELS:-timm/levit_128s,tv/mobilenet_v2,tv/resnet50}" "${THREADS:-16}" "${ROUNDS:-150}" <<'EOF' 2>&1 | tee "${OUT:-/tmp/s13h4-out}/s13h4.txt"
import gc, random, re, statistics, sys, time
sys.path.insert(0, "benchmarks")
import torch
from zoo_models import BY_NAME, FULL
import ember.inductor.backend as backend
from ember.runtime.compile import compile as ember_compile
models, threads, rounds = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)

def unhoist(src):
    """The wrapper with hit tests at the top back to each test at its kernel call."""
    tops, out = {}, []
    for l in src.splitlines():
        m = re.match(r"    (_e\d+) = (_c\d+)\[0\]$", l)
        if m:
            tops[m.group(1)] = [m.group(2), None]; continue
        m = re.match(r"    _h(\d+) = (.*)$", l)
        if m:
            tops["_e" + m.group(1)][1] = m.group(2); continue
        m = re.match(r"    if _h(\d+):$", l)
        if m:
            e = "_e" + m.group(1); slot, cond = tops[e]
            out += [f"    _e = {slot}[0]", "    if " + cond.replace(f"{e}[", "_e[") + ":"]
            continue
        if re.match(r"        del _e\d+$", l):
            continue
        out.append(re.sub(r"\b_e\d+\b", "_e", l))
    return "\n".join(out) + "\n"

def flat(x):
    if isinstance(x, torch.Tensor): return [x]
    if isinstance(x, dict) or hasattr(x, "values"): return [t for v in x.values() for t in flat(v)]
    if isinstance(x, (list, tuple)): return [t for v in x for t in flat(v)]
    return []

print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {rounds}")
for name in models:
    seen = []
    orig = backend.generate
    def gen(module, graph=None, interp=None):
        w = orig(module, graph, interp); seen.append(w); return w
    backend.generate = gen
    try:
        torch.manual_seed(0)
        fn, args = BY_NAME[name].build(FULL)
        with torch.no_grad():
            c = ember_compile(fn)
            for _ in range(3): c(*args)
    finally:
        backend.generate = orig
    tests = sum(w.source.count("_same(") for w in seen)
    codes = {}
    for tag, t in (("old", unhoist), ("new", lambda s: s)):
        cs = []
        for w in seen:
            g = dict(w.call.__globals__)
            exec(compile(t(w.source), f"<{tag}>", "exec"), g)
            cs.append(g["call"].__code__)
        codes[tag] = cs
    outs = {}
    with torch.no_grad():
        for tag, cs in codes.items():
            for w, code in zip(seen, cs): w.call.__code__ = code
            outs[tag] = [t.clone() for t in flat(c(*args))]
    same = all(torch.equal(a, b) for a, b in zip(outs["old"], outs["new"]))
    ts = {k: [] for k in codes}
    rnd = random.Random(0)
    order = list(codes)
    with torch.no_grad():
        for r in range(rounds + 5):
            rnd.shuffle(order)
            gc.collect(); gc.disable()
            for tag in order:
                for w, code in zip(seen, codes[tag]): w.call.__code__ = code
                t0 = time.perf_counter_ns()
                c(*args)
                dt = (time.perf_counter_ns() - t0) / 1e3
                if r >= 5: ts[tag].append(dt)
            gc.enable()
    mo, mn = statistics.median(ts["old"]), statistics.median(ts["new"])
    pd = statistics.median([b - a for a, b in zip(ts["old"], ts["new"])])
    print(f"{name}: kept-call tests {tests}, outputs equal {same}; wall us/call median old {mo:.1f} "
          f"new {mn:.1f} ({mn - mo:+.1f}, {100 * (mn - mo) / mo:+.1f}%), paired median {pd:+.1f}, "
          f"min old {min(ts['old']):.1f} new {min(ts['new']):.1f}", flush=True)
EOF
