"""A/B of the packed convolution's in-place residual (plan-buffers' INTO_FORMS, packed.py's
into_residual=true) on zoo CNNs, in one process.

Each model is compiled twice by ember: "old" with the in-place form unregistered while it
compiles (every residual convolution allocates its output, as before), "new" as shipped.
Both are checked against eager, their large (>= 1 MB) new allocations per call are counted
(aten calls whose result storage is none of their operands'), then their calls are timed
interleaved (the order alternating every rep): thread CPU time at 1 thread, wall time with
--clock wall (a quiet many-core machine). Run with the zoo libraries importable:

    PYTHONPATH=/tmp/h5/libs HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/conv_inplace.py --models tv/resnet50,tv/mobilenet_v2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo_models import FULL, ZOO  # noqa: E402

import ember.inductor  # noqa: E402, F401  (registers the CPU target)
from ember.inductor import buffers  # noqa: E402
from ember.inductor.targets.cpu import packed  # noqa: E402
from ember.runtime.compile import compile as ember_compile  # noqa: E402

BIG = 1 << 20


class _Allocs(TorchDispatchMode):
    """Large new storages (results not stored in any operand) and in-place convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.big = 0
        self.into = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        ins = {_ptr(a) for a in [*args, *(kwargs or {}).values()]}
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (list, tuple)) else [out]:
            if _ptr(o) is not None and _ptr(o) not in ins \
                    and o.untyped_storage().nbytes() >= BIG:
                self.big += 1
        self.into += "_convolution_pointwise_" in str(func)
        return out


def _ptr(t: Any) -> int | None:
    """A strided tensor's storage address (oneDNN's packed weights have no storage)."""
    if not isinstance(t, torch.Tensor) or t.is_mkldnn or t.layout != torch.strided:
        return None
    return int(t.untyped_storage().data_ptr())


def _compiled(fn: Any, args: tuple[Any, ...], into: bool) -> Any:
    saved = buffers.INTO_FORMS.pop(packed.PACKED_OP, None) if not into else None
    try:
        f = ember_compile(fn)
        with torch.no_grad():
            f(*args)  # compiles now, under this setting
    finally:
        if saved is not None:
            buffers.INTO_FORMS[packed.PACKED_OP] = saved
    return f


def _clock(wall: bool) -> Any:
    return time.perf_counter_ns if wall else time.thread_time_ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tv/resnet50,tv/mobilenet_v2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread")
    ap.add_argument("--eager", action="store_true", help="time eager too, in the rotation")
    opts = ap.parse_args()
    torch.set_num_threads(opts.threads)
    zoo = {m.name: m for m in ZOO}
    clock = _clock(opts.clock == "wall")
    for name in opts.models.split(","):
        fn, args = zoo[name].build(FULL)
        if isinstance(fn, torch.nn.Module):
            fn.eval()
        fs: dict[str, Any] = {"old": _compiled(fn, args, False), "new": _compiled(fn, args, True)}
        with torch.no_grad():
            want = fn(*args)
            for k, f in fs.items():
                f(*args)
                torch.testing.assert_close(f(*args), want, rtol=1e-3, atol=1e-3)
                with _Allocs() as seen:
                    f(*args)
                print(f"{name} {k}: {seen.big} allocations >= 1 MB a call, "
                      f"{seen.into} in-place residual convolutions", flush=True)
            if opts.eager:
                fs["eager"] = fn
            times: dict[str, list[float]] = {k: [] for k in fs}
            keys = list(fs)
            for rep in range(opts.reps):
                order = keys[rep % len(keys):] + keys[:rep % len(keys)]  # rotated every rep
                for k in order:
                    t = clock()
                    fs[k](*args)
                    times[k].append((clock() - t) / 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name} ({opts.threads} threads, {opts.clock} time, median of {opts.reps}, "
              f"interleaved): " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items())
              + f"; new/old {med['new'] / med['old']:.3f}", flush=True)


if __name__ == "__main__":
    main()
