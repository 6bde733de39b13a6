"""Host Python per Triton kernel launch, measured without a GPU: Triton's JIT dispatch (a kernel
block's `launch()`) against ember's bound launch (its `bind()`, targets/cuda/launcher.py).

The kernel is compiled for real (Triton 3.6's compile and ptxas, sm_90) through a stand-in for
Triton's driver (test_cuda_launch.FakeDriver); the binary's C launcher, which needs a GPU, is
replaced by a no-op in both paths, so what is timed is the Python each path runs per launch.
Interleaved repetitions; medians. Run from the repository root:

    python3 benchmarks/triton_dispatch_cpu.py [--reps 7] [--calls 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["EMBER_TEST_REAL_COMPILE"] = "1"  # test_cuda_launch: no interpreter in this process
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def noop(*args: Any) -> None:
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    import triton
    import triton.compiler.compiler as triton_compiler
    from triton.runtime import driver

    import packages.inductor.tests.test_cuda_launch as t
    from ember.inductor.targets.cuda import codegen, launcher

    class Driver(t.FakeDriver):
        def launcher_cls(self, src: Any, md: Any) -> Any:  # callable (the JIT calls it)
            class NoopLauncher:
                launch = staticmethod(noop)
                num_ctas, launch_pdl = 1, False
                global_scratch_size = md.global_scratch_size
                profile_scratch_size = md.profile_scratch_size
                launch_cooperative_grid = md.launch_cooperative_grid

                def __call__(self, *args: Any) -> None:
                    return None
            return NoopLauncher()

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-dispatch-")
    setattr(triton_compiler, "max_shared_mem", lambda dev: 232448)  # noqa: B010
    driver.set_active(Driver())  # type: ignore[arg-type,unused-ignore]

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x * 2.0 + y) - y.abs()
    x, y, out = torch.randn(64, 64), torch.randn(64, 64), torch.empty(64, 64)
    m = t.gpu_module(f, x, y)
    (k,) = m.kernels.values()
    mod = t.block_module(k)
    sig = codegen._signatures(m)[k.name]
    assert not isinstance(sig, str), sig
    args, dev = sig
    report = launcher.LoadReport()
    launcher.compile_and_bind([launcher.Job(k.name, mod, args, dev, len(args))], report,
                              workers=1, device=lambda d: contextlib.nullcontext(),
                              init=lambda: None)
    binary = mod.warmup(*args)
    fast = mod.bind(noop, binary.function, binary.packed_metadata, (False, False), 0,
                    lambda d: 0, lambda: 0)
    mod.launch(x, y, out)  # the JIT's first call (its cache holds the warmup's binary)

    def per_call(fn: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn(x, y, out)
        return (time.perf_counter() - t0) / a.calls * 1e6
    jit: list[float] = []
    bound: list[float] = []
    for _ in range(a.reps):
        jit.append(per_call(mod.launch))
        bound.append(per_call(fast))
    print(json.dumps({"triton": triton.__version__, "torch": torch.__version__,
                      "cpus": os.cpu_count(), "compile": report.summary(),
                      "jit_us": [round(v, 2) for v in jit],
                      "bound_us": [round(v, 2) for v in bound],
                      "jit_median_us": round(statistics.median(jit), 2),
                      "bound_median_us": round(statistics.median(bound), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
