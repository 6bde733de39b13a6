"""The CUDA target's launch path past Triton's JIT, and the parallel compile of a module's kernels.

A Triton kernel called through its JIT (`kernel[grid](...)`, the block's `launch()`) pays, on
every call, Triton's dispatch in Python: argument binding, specialization of every argument
(dtype, 16-byte alignment, ints equal to 1 or divisible by 16), the cache key, hooks, a check
of the globals it read, then its launcher. ember's kernels are called with fixed argument types
(the IR's), so that work can be done once: at load, each kernel is compiled (`warmup()`, Triton's
own specialization of aligned buffers of the call's dtypes; size arguments are `tl.int64` and not
specialized, so one binary serves every size) and its binary's C launcher is then called
directly (`bind()`, rendered into the block by `bind_source`) with the grid, the binary's
function handle and metadata, and the current stream: what TorchInductor's CachingAutotuner does.

Per call the bound path reads each buffer's address once (passed to the launcher as an int) and
checks that all of them are 16-byte aligned and that the current device is the one the binary
was loaded on; otherwise (a misaligned view, another device) it calls `launch()`, whose JIT
compiles and caches the specialization that call needs. Kernels are compiled at load in a
thread pool: Triton's LLVM passes, its LLVM-to-PTX step and ptxas run without the GIL; Triton's
on-disk cache is used as ever (a warm cache loads the binaries).

The bound path is used only where the launcher's calling convention is the one it was written
for (triton 3.x's nvidia driver with `_BASE_ARGS_FORMAT == "iiiKKppOOOOOO"`: grid, stream,
function, cooperative and PDL flags, two scratch buffers, metadata, launch metadata and the two
launch hooks), no launch hook is set (a profiler's), and the binary needs no scratch memory;
anywhere else, in Triton's interpreter, and with EMBER_TRITON_LAUNCH=jit (to measure or rule out
this path), kernels launch through the JIT as before, with the reason kept in `LoadReport`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

# the launcher's leading arguments this path passes (triton 3.x, nvidia: see the docstring)
BASE_ARGS_FORMAT = "iiiKKppOOOOOO"
ALIGN = 16  # Triton's `tt.divisibility` of a buffer argument (its "D" specialization)


def bind_source(sym: str, bufs: Sequence[str], sizes: Sequence[str], grid: list[str],
                xblock: int, warps: int) -> str:
    """The block's `warmup()` and `bind()` (see the module docstring). `grid`: the launch's
    grid lines (a static grid is one `grid = N` line; a symbolic one computes it from the
    sizes and returns early when it is empty). Names are `in<k>`/`out<k>`/`s<k>` only."""
    args = ", ".join([*bufs, *sizes])
    ptrs = [f"p{k}" for k in range(len(bufs))]
    lines = [
        "",
        "def warmup(*args):",
        "    # the binary for these arguments (torch dtypes for buffers, ints for sizes):",
        "    # Triton's own specialization, aligned buffers; compiled, not launched",
        f"    return {sym}.warmup(*args, grid=(1,), XBLOCK={xblock}, num_warps={warps})",
        "", "",
        "def bind(run, function, meta, flags, device, stream, current_device):",
        "    # launch() past the JIT: the binary's C launcher called directly (launcher.py)",
        "    coop, pdl = flags",
        "",
        f"    def fast({args}):",
    ]
    lines += [f"        {p} = {b}.data_ptr()" for p, b in zip(ptrs, bufs, strict=True)]
    aligned = " | ".join(ptrs) if ptrs else "0"
    lines += [f"        if ({aligned}) & {ALIGN - 1} or current_device() != device:",
              f"            return launch({args})  # a misaligned view, another device: the JIT"]
    lines += ["    " + g for g in grid]
    call = ", ".join([*ptrs, *sizes, str(xblock)])
    lines += [f"        run(grid, 1, 1, stream(device), function, coop, pdl, None, None, meta, "
              f"None, None, None, {call})",
              "        return None", "",
              "    return fast", ""]
    return "\n".join(lines)


@dataclass
class KernelLoad:
    """How one kernel launches, and what compiling it cost."""

    fast: bool
    why: str = ""  # why not, where not
    compile_s: float = 0.0  # this kernel's warmup (compile, or a disk-cache load)


@dataclass
class LoadReport:
    """A module's Triton kernels at load: which launch past the JIT, and the compile time."""

    kernels: dict[str, KernelLoad] = field(default_factory=dict)
    compile_wall_s: float = 0.0  # the parallel compile, wall clock
    workers: int = 0
    shared: int = 0  # kernels that took an equal kernel's module (a repeated block's)

    def summary(self) -> dict[str, Any]:
        ks = self.kernels.values()
        whys = sorted({k.why for k in ks if not k.fast})
        return {"kernels": len(self.kernels), "fast": sum(k.fast for k in ks),
                "compile_wall_s": round(self.compile_wall_s, 3), "workers": self.workers,
                "compile_sum_s": round(sum(k.compile_s for k in ks), 3), "shared": self.shared,
                "not_fast": whys[:4]}


def unavailable(interpreting: bool) -> str | None:
    """Why the bound path cannot be used in this process (None: it can)."""
    if interpreting:
        return "Triton's interpreter"
    if os.environ.get("EMBER_TRITON_LAUNCH") == "jit":  # to measure or rule out this path
        return "EMBER_TRITON_LAUNCH=jit"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        from triton import knobs
        from triton.backends.nvidia import driver as nv
    except ImportError as e:
        return f"triton without the nvidia driver module ({e})"
    if getattr(nv, "_BASE_ARGS_FORMAT", None) != BASE_ARGS_FORMAT:
        return "this triton's launcher takes other arguments"
    hooks = getattr(knobs, "runtime", None)
    for name in ("launch_enter_hook", "launch_exit_hook"):
        if _hook_set(getattr(hooks, name, None)):
            return "a Triton launch hook is set"
    return None


def _hook_set(hook: Any) -> bool:
    """Whether a launch hook is set: triton 3.6's hooks are HookChains, set when not empty
    (the JIT calls them on every launch; a profiler adds one)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if isinstance(calls, list) else True


def _raw_stream() -> Callable[[int], int]:
    f = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if callable(f):
        return f  # type: ignore[no-any-return]
    return lambda d: int(torch.cuda.current_stream(d).cuda_stream)


def _current_device() -> Callable[[], int]:
    f = getattr(torch._C, "_cuda_getDevice", None)
    return f if callable(f) else torch.cuda.current_device


@dataclass
class Job:
    """One kernel to compile and bind: its module (warmup/bind/launch), warmup arguments (torch
    dtypes of its buffers, then one int per size argument) and the device index."""

    name: str
    module: Any
    args: tuple[Any, ...]
    device: int
    nargs: int  # buffers + sizes: the launcher then takes XBLOCK


def _compile(job: Job, device: Callable[[int], AbstractContextManager[Any]]
             ) -> tuple[Any, float]:
    t0 = time.perf_counter()
    with device(job.device):  # the compile's target and the thread's device
        binary = job.module.warmup(*job.args)
        if binary is not None and not hasattr(binary, "result"):
            # load it on the device and build its C launcher (gcc, once per signature, into
            # Triton's cache): in the pool too
            binary.run  # noqa: B018
    return binary, time.perf_counter() - t0


def _bind(job: Job, binary: Any, device: Callable[[int], AbstractContextManager[Any]]
          ) -> Callable[..., Any]:
    """The job's fast launch over its compiled binary; ValueError where it does not fit."""
    if binary is None or hasattr(binary, "result"):  # a compile hook took it / async mode
        raise ValueError("Triton returned no compiled kernel")
    with device(job.device):
        launcher = binary.run  # loaded by _compile (its handles, once)
    sig = getattr(getattr(binary, "src", None), "signature", None)
    if not isinstance(sig, dict) or len(sig) != job.nargs + 1:
        raise ValueError("the binary's signature is not the block's (buffers, sizes, XBLOCK)")
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if getattr(launcher, attr, 0):
            raise ValueError("the kernel needs scratch memory")
    run = getattr(launcher, "launch", None)
    if not callable(run) or getattr(launcher, "num_ctas", 1) != 1:
        raise ValueError("the binary's launcher is not the expected one")
    flags = (bool(launcher.launch_cooperative_grid), bool(launcher.launch_pdl))
    fn = job.module.bind(run, binary.function, binary.packed_metadata, flags, job.device,
                         _raw_stream(), _current_device())
    return fn  # type: ignore[no-any-return]


def _init_driver() -> None:
    from triton.runtime import driver
    driver.active.get_current_target()  # Triton's driver initialised once, before the threads


def compile_and_bind(jobs: list[Job], report: LoadReport, workers: int | None = None, *,
                     device: Callable[[int], AbstractContextManager[Any]] = torch.cuda.device,
                     init: Callable[[], None] = _init_driver) -> dict[str, Callable[..., Any]]:
    """Compile every job's kernel (a thread pool of `workers`, default EMBER_COMPILE_JOBS or
    the CPU count, at most 32) and bind its fast launch; a kernel that fails either keeps the
    JIT path, the reason in `report` (a compile error then surfaces at its first call, as
    before). Jobs of one block module (other argument types) compile one after another: the
    JIT's caches are per function. `device` and `init` are the CUDA device context and the
    driver's initialisation (tests replace them)."""
    out: dict[str, Callable[..., Any]] = {}
    if not jobs:
        return out
    init()
    if workers is None:
        from ember.inductor.targets.cpu.cache import jobs as compile_jobs
        workers = min(32, compile_jobs())
    groups: dict[int, list[Job]] = {}
    for job in jobs:
        groups.setdefault(id(job.module), []).append(job)
    n = max(1, min(len(groups), workers))
    t0 = time.perf_counter()
    results: dict[str, tuple[Any, float] | BaseException] = {}

    def compile_group(group: list[Job]) -> None:
        for job in group:
            try:
                results[job.name] = _compile(job, device)
            except Exception as e:  # noqa: BLE001  (kept: the JIT path reports it at the call)
                results[job.name] = e
    if n == 1:
        for group in groups.values():
            compile_group(group)
    else:
        with ThreadPoolExecutor(n, thread_name_prefix="ember-triton-compile") as pool:
            for fut in [pool.submit(compile_group, g) for g in groups.values()]:
                fut.result()
    report.compile_wall_s += time.perf_counter() - t0
    report.workers = max(report.workers, n)
    for job in jobs:
        r = results[job.name]
        if isinstance(r, BaseException):
            report.kernels[job.name] = KernelLoad(False, f"compile: {type(r).__name__}: "
                                                         f"{str(r)[:200]}")
            continue
        binary, secs = r
        try:
            out[job.name] = _bind(job, binary, device)
            report.kernels[job.name] = KernelLoad(True, "", secs)
        except Exception as e:  # noqa: BLE001  (an unexpected binary: the JIT path)
            report.kernels[job.name] = KernelLoad(False, f"{type(e).__name__}: {str(e)[:200]}",
                                                  secs)
    return out


__all__ = ["ALIGN", "BASE_ARGS_FORMAT", "Job", "KernelLoad", "LoadReport", "bind_source",
           "compile_and_bind", "unavailable"]
