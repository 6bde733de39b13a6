"""ember's CPU attention kernel (targets/cpu/flash.py), old vs new source, at T threads.

Both kernels are built from their C++ source through the compile cache and called directly
(ctypes, the arguments flash.forward passes), alternating old/new every rep in one process;
the outputs are checked bit-identical first. The old source is a file (--old-source: e.g.
`git show c462def:packages/inductor/src/ember/inductor/targets/cpu/flash.py > old.py`, the
SOURCE string read out of it) or, without one, the new source with the shared packing turned
off (EMBER_ATTN_SHARED_FLOATS = -1): the split rule before it (each part of a head packs the
head's keys and values, parts of >= 4 blocks) except at one thread.

Clocks: `thread` (thread CPU time of the calling thread: meaningful at 1 thread only) or
`wall`; --realtime runs the timed calls under SCHED_FIFO (benchmarks/realtime.py), which is
what makes wall time at 2 threads mean anything on a shared machine.

    python benchmarks/attention_threads.py --threads 1 --clock thread
    python benchmarks/attention_threads.py --threads 2 --clock wall --realtime --shapes one,one_causal
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realtime import realtime  # noqa: E402

from ember.inductor.targets.cpu import cache, flash  # noqa: E402
from ember.inductor.targets.cpu.cpp import PRELUDE  # noqa: E402

# name: (B, H, L, E, mask shape or None, causal); q read as a head split of [B, L, H, E] rows
SHAPES: dict[str, tuple[int, int, int, int, tuple[int, ...] | None, bool]] = {
    "bert": (2, 4, 128, 64, (2, 1, 1, 128), False),
    "deit": (2, 3, 197, 64, None, False),
    "gpt2": (2, 4, 128, 64, None, True),  # (the zoo's hf/gpt2: 4 layers x 4 heads)
    "gpt2_12h": (2, 12, 128, 64, None, True),
    "one": (1, 1, 128, 64, None, False),
    "one_causal": (1, 1, 256, 64, None, True),
    "long": (1, 4, 1024, 64, None, False),
    "swin": (128, 3, 49, 32, (1, 3, 49, 49), False),
}


def _old_source(path: str | None) -> str:
    if path is None:
        new = flash.SOURCE
        line = "static const int64_t EMBER_ATTN_SHARED_FLOATS = (int64_t)1 << 24;"
        assert line in new
        return new.replace(line, "static const int64_t EMBER_ATTN_SHARED_FLOATS = -1;")
    tree = ast.parse(Path(path).read_text())
    for node in tree.body:  # (the module's SOURCE string, read as a literal: nothing runs)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SOURCE"
                                                for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, str)
            return value
    raise SystemExit(f"{path}: no SOURCE")


def _entry(source: str) -> Any:
    # (a function object of its own: the library's attribute is flash.py's, with its argtypes)
    fn = cache.load(PRELUDE + source)["ember_attention_f32"]
    p = ctypes.c_void_p
    fn.argtypes = [p, p, p, p, p, p, ctypes.POINTER(ctypes.c_int64),
                   ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.c_int]
    return fn


def _call(shape: tuple[int, int, int, int, tuple[int, ...] | None, bool]
          ) -> tuple[Callable[[Any], None], tuple[torch.Tensor, torch.Tensor]]:
    b, h, n, e, mshape, causal = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, h, e, generator=g).transpose(1, 2) for _ in range(3))
    mask = torch.randn(mshape, generator=g) if mshape is not None else None
    out = torch.empty((b, n, h, e)).transpose(1, 2)
    lse = torch.empty((b, n, h)).transpose(1, 2)
    ms: tuple[int, ...] = (0, 0, 0, 0)
    if mask is not None:
        ms = tuple(0 if mask.shape[i] == 1 else mask.stride(i) for i in range(4))
    dims = (ctypes.c_int64 * 6)(b, h, n, n, e, e)
    strides = (ctypes.c_int64 * 23)(*q.stride(), *k.stride(), *v.stride(), *ms, *out.stride(),
                                    *lse.stride())
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(),
            mask.data_ptr() if mask is not None else None, out.data_ptr(), lse.data_ptr())

    keep = (q, k, v, mask, out, lse)  # (the pointers' tensors, alive as long as run)

    def run(fn: Any) -> None:
        assert keep
        fn(*ptrs, dims, strides, e ** -0.5, int(causal))
    return run, (out, lse)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread")
    ap.add_argument("--realtime", action="store_true")
    ap.add_argument("--old-source")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    old, new = _entry(_old_source(a.old_source)), _entry(flash.SOURCE)
    clock = time.thread_time_ns if a.clock == "thread" else time.perf_counter_ns
    print(f"{a.threads} threads, clock {a.clock}, realtime {a.realtime}, {a.reps} reps, "
          f"old {'source ' + a.old_source if a.old_source else 'new with shared packing off'}")
    for name in a.shapes.split(","):
        run, (out, lse) = _call(SHAPES[name])
        run(old)
        want = out.clone(), lse.clone()
        run(new)
        same = torch.equal(out, want[0]) and torch.equal(lse, want[1])
        b, h, n, e, _, _ = SHAPES[name]
        tasks = flash.tasks(b, h, n, n, e, a.threads)
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(10):
            run(old)
            run(new)
        with realtime(a.realtime) as why:
            for rep in range(a.reps):  # (which goes first alternates: the second finds
                # the first's caches)
                pair = (("old", old), ("new", new))
                for key, fn in pair if rep % 2 else pair[::-1]:
                    t0 = clock()
                    run(fn)
                    times[key].append((clock() - t0) / 1e3)
        mo, mn = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"{name:11s} B{b} H{h} L{n} E{e}: old {mo:8.1f} us  new {mn:8.1f} us  "
              f"new/old {mn / mo:.3f}  (new tasks {tasks[0]}, shared packing {tasks[1]}; "
              f"bit-identical {same}{'; realtime: ' + why if why else ''})", flush=True)


if __name__ == "__main__":
    main()
