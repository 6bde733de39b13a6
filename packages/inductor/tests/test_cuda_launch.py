"""The CUDA target's launch path past Triton's JIT and its parallel compile (launcher.py).

Without a GPU: the GPU form of kernel blocks (code generation only, `inductor-cuda` on graphs
typed @cuda:0) is imported in Triton's interpreter and its `bind()` driven with a recording
launcher: an aligned call reaches the launcher with the grid, stream, the binary's handles and
the buffers' addresses (never Triton's JIT); a misaligned view or another current device goes
through `launch()` (the JIT; here the interpreter, checked against eager). `compile_and_bind`
runs with fake compiled binaries. With CUDA (the device): the loaded kernels are the bound
launch, and results, misaligned inputs included, match eager.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="the Triton target's tests need the triton package")

import ember.inductor  # noqa: F401
from ember.capture import capture
from ember.inductor.targets.cuda import codegen, launcher
from ember.ir import Kernel, Module, parse
from ember.ir.passes import run_pipeline
from ember.testing.triton_mode import INTERPRETER_ONLY, NEEDS_CUDA


def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2.0 + y) - y.abs()


def captured(f: Any, *args: torch.Tensor) -> Module:
    c = capture(f, args, {})
    m = getattr(c, "module", None)
    assert isinstance(m, Module), c
    return m


def gpu_module(f: Any, *args: torch.Tensor) -> Module:
    """The GPU form of f's compiled module (code generation only: graphs typed @cuda:0)."""
    text = str(captured(f, *args))
    retyped = re.sub(r"((?:f32|f16|i64|b8)\[[^\]]*\])(?!@)", r"\1@cuda:0", text)
    return run_pipeline(parse(retyped), "decompose,cse,dce,inductor-cuda")


def block_module(k: Kernel) -> Any:
    digest = codegen.hashlib.sha256(f"gpu-form\0{k.source}".encode()).hexdigest()[:32]
    codegen._import(k, digest)
    return sys.modules[f"ember_triton_{digest}"]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


def bound(k: Kernel, device: int = 0, current: int = 0) -> tuple[Any, Recorder]:
    run = Recorder()
    fast = block_module(k).bind(run, "FUNCTION", "META", (False, True), device,
                                lambda d: 1000 + d, lambda: current)
    return fast, run


@INTERPRETER_ONLY
def test_aligned_call_goes_to_the_launcher_not_the_jit() -> None:
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    (k,) = gpu_module(fn, x, y).kernels.values()
    assert "def bind(" in k.source and "def warmup(" in k.source
    fast, run = bound(k)
    out = torch.full((8, 16), 7.0)
    assert fast(x, y, out) is None
    (call,) = run.calls
    sched = k.source.split("SCHEDULE = ")[1].splitlines()[0]
    xblock = int(re.search(r"'XBLOCK': (\d+)", sched).group(1))  # type: ignore[union-attr]
    assert call == (1, 1, 1, 1000, "FUNCTION", False, True, None, None, "META", None, None,
                    None, x.data_ptr(), y.data_ptr(), out.data_ptr(), xblock)
    assert bool((out == 7.0).all())  # nothing ran but the (recording) launcher


@INTERPRETER_ONLY
@pytest.mark.parametrize("why", ["misaligned", "device"])
def test_misaligned_view_or_other_device_runs_the_jit(why: str) -> None:
    base = torch.randn(8 * 16 + 1)
    x = base[1:].view(8, 16) if why == "misaligned" else base[:-1].view(8, 16)
    y = torch.randn(8, 16)
    assert (x.data_ptr() % 16 != 0) == (why == "misaligned")
    (k,) = gpu_module(fn, x.clone(), y).kernels.values()
    fast, run = bound(k, current=0 if why == "misaligned" else 1)
    out = torch.empty(8, 16)
    fast(x, y, out)  # launch(): Triton's JIT, here its interpreter
    assert not run.calls
    torch.testing.assert_close(out, fn(x, y))


@INTERPRETER_ONLY
def test_symbolic_sizes_are_int64_unspecialized_and_set_the_grid() -> None:
    from packages.inductor.tests.test_symbolic_kernels import GRAPHS, SYMS
    text = "ember.ir 1.0\n\n" + SYMS.format(h0=8, h1=16) + GRAPHS["pointwise"] + "\n"
    retyped = re.sub(r"((?:f32|i64)\[[^\]]*\])(?!@)", r"\1@cuda:0", text)
    m = run_pipeline(parse(retyped), "decompose,cse,dce,inductor-cuda")
    ks = [k for k in m.kernels.values() if "grid = ((" in k.source]
    assert ks
    k = ks[0]
    sizes = re.findall(r"\bs\d+: tl\.int64", k.source)
    assert sizes and "do_not_specialize=(" in k.source
    sig = codegen._signatures(m)[k.name]
    assert isinstance(sig, tuple) and sig[1] == 0
    assert sig[0][-len(sizes):] == (2,) * len(sizes)
    nbuf = len(sig[0]) - len(sizes)
    fast, run = bound(k)
    bufs = [torch.empty(0) for _ in range(nbuf)]
    assert fast(*bufs, *[0] * len(sizes)) is None and not run.calls  # no elements
    fast(*[torch.empty(4) for _ in range(nbuf)], *[3] * len(sizes))
    (call,) = run.calls
    assert call[0] >= 1 and call[-1 - len(sizes):-1] == (3,) * len(sizes)


def fake_binary(nargs: int, scratch: int = 0) -> Any:
    launch = SimpleNamespace(launch=Recorder(), global_scratch_size=scratch,
                             profile_scratch_size=0, num_ctas=1,
                             launch_cooperative_grid=False, launch_pdl=False)
    return SimpleNamespace(run=launch, function=5, packed_metadata=(4, 1, 0),
                           src=SimpleNamespace(signature={i: "x" for i in range(nargs + 1)}))


@INTERPRETER_ONLY
def test_compile_and_bind_compiles_in_parallel_and_keeps_failures_on_the_jit() -> None:
    def module(binary: Any) -> Any:
        def warmup(*args: Any) -> Any:
            if isinstance(binary, Exception):
                raise binary
            return binary

        def bind(run: Any, function: Any, meta: Any, *rest: Any) -> Any:
            return ("bound", run, function, meta)
        return SimpleNamespace(warmup=warmup, bind=bind)

    jobs = [launcher.Job("ok", module(fake_binary(3)), (torch.float32,) * 3, 0, 3),
            launcher.Job("bad", module(ValueError("boom")), (torch.float32,), 0, 1),
            launcher.Job("scratch", module(fake_binary(2, scratch=64)), (torch.float32,) * 2,
                         0, 2),
            launcher.Job("arity", module(fake_binary(1)), (torch.float32,) * 2, 0, 2)]
    report = launcher.LoadReport()
    out = launcher.compile_and_bind(jobs, report, workers=4,
                                    device=lambda d: contextlib.nullcontext(), init=lambda: None)
    got: Any = out.get("ok")
    assert set(out) == {"ok"} and got[0] == "bound" and got[2] == 5
    ks = report.kernels
    assert ks["ok"].fast and not ks["bad"].fast and "boom" in ks["bad"].why
    assert "scratch" in ks["scratch"].why and "signature" in ks["arity"].why
    s = report.summary()
    assert s["kernels"] == 4 and s["fast"] == 1 and s["workers"] == 4


class Block(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 16)  # an extern: the blocks' kernels stay apart
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.softmax(self.proj(self.norm(x)) * self.scale, -1)


@INTERPRETER_ONLY
def test_repeated_blocks_share_one_kernel_module() -> None:
    """Kernels equal but for their names (a repeated block's) load one module (one import,
    one compile on the GPU); a kernel that differs in a constant does not; results match."""
    model = torch.nn.Sequential(Block(0.5), Block(0.5), Block(0.25)).eval()
    x = torch.randn(4, 16)
    c: Any = capture(model, (x,), {})
    m = run_pipeline(c.module, "decompose,cse,dce,inductor-cuda-interpret")
    ks = [k for k in m.kernels.values() if k.lang == "triton"]
    assert len({k.source for k in ks}) == len(ks)  # every block's source differs by names
    canon = [codegen._canonical(k.source) for k in ks]
    assert len(set(canon)) < len(ks)
    table = codegen.load_triton(m, ks)
    report = codegen.load_report(m)
    assert report is not None and report.shared == len(ks) - len(set(canon)) > 0
    for cn in set(canon):  # one launch per canonical kernel
        assert len({id(table[k.name].fn) for k, c2 in zip(ks, canon, strict=True)
                    if c2 == cn}) == 1
    assert len({id(t.fn) for t in table.values()}) == len(set(canon))
    from ember.inductor.backend import compiled_runner
    with torch.no_grad():
        got = compiled_runner(m)(None, list(c.input_examples)).outputs[0]
        torch.testing.assert_close(got, model(x))


def test_canonical_form_keeps_what_computes() -> None:
    a = codegen._canonical("# @a\ndef ember_k_a(in0):\n    # %x = prims.mul\n"
                           "    v1_x = in0 * 2.0\n    return v1_x\n")
    b = codegen._canonical("# @b\ndef ember_k_b(in0):\n    # %y = prims.mul (f.py:3)\n"
                           "    v1_y = in0 * 2.0\n    return v1_y\n")
    c = codegen._canonical("# @c\ndef ember_k_c(in0):\n    v1_y = in0 * 3.0\n"
                           "    return v1_y\n")
    d = codegen._canonical("def ember_k_d(in0):\n    v1_x = in0 * 2.0\n    v2_y = v1_x\n"
                           "    return v1_x\n")
    assert a == b and len({a, c, d}) == 3


def test_jobs_of_one_module_compile_one_after_another() -> None:
    import threading
    import time
    busy = threading.Lock()
    calls: list[tuple[Any, ...]] = []

    def warmup(*args: Any) -> Any:
        assert busy.acquire(blocking=False), "two warmups of one module at once"
        try:
            time.sleep(0.05)
            calls.append(args)
            return fake_binary(1)
        finally:
            busy.release()
    mod = SimpleNamespace(warmup=warmup, bind=lambda *a: ("bound",))
    jobs = [launcher.Job(f"k{i}", mod, (dt,), 0, 1)
            for i, dt in enumerate((torch.float32, torch.float16, torch.bfloat16))]
    report = launcher.LoadReport()
    out = launcher.compile_and_bind(jobs, report, workers=3,
                                    device=lambda d: contextlib.nullcontext(), init=lambda: None)
    assert set(out) == {"k0", "k1", "k2"} and len(calls) == 3


def test_launch_hooks_and_the_jit_knob_rule_the_bound_path_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """triton 3.6's hooks are HookChains: an empty one (the default) is no hook, one with a
    call (a profiler's) is; EMBER_TRITON_LAUNCH=jit rules the path out."""
    chain = pytest.importorskip("triton.knobs").HookChain
    assert not launcher._hook_set(None) and not launcher._hook_set(chain())
    hooked = chain()
    hooked.add(print)
    assert launcher._hook_set(hooked) and launcher._hook_set(print)
    monkeypatch.setenv("EMBER_TRITON_LAUNCH", "jit")
    assert launcher.unavailable(False) == "EMBER_TRITON_LAUNCH=jit"


@INTERPRETER_ONLY
def test_interpreter_loads_keep_the_jit_with_the_reason(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    import logging
    assert launcher.unavailable(True) == "Triton's interpreter"
    x = torch.randn(4, 8)
    m = run_pipeline(captured(lambda a: torch.relu(a) * 2, x),
                     "decompose,cse,dce,inductor-cuda-interpret")
    with caplog.at_level(logging.INFO, logger="ember.kernels"):
        table = codegen.load_triton(m, list(m.kernels.values()))
    assert "0 launch past Triton's JIT" in caplog.text and "Triton's interpreter" in caplog.text
    report = codegen.load_report(m)
    assert report is not None and report.kernels
    assert all(not k.fast and k.why == "Triton's interpreter" for k in report.kernels.values())
    for k in table.values():
        assert k.fn.__name__ == "launch"


class FakeDriver:
    """Triton's active driver without a GPU: an sm_90 target, a binary "loaded" as handle 4242
    and a launcher that records; Triton's compile itself (and ptxas) runs for real."""

    def __init__(self) -> None:
        self.utils = SimpleNamespace(
            load_binary=lambda name, kernel, shared, dev: (1, 4242, 20, 0, 1024),
            get_device_properties=lambda d: {"max_shared_mem": 232448})

    def launcher_cls(self, src: Any, md: Any) -> Any:
        return SimpleNamespace(launch=Recorder(), num_ctas=1, launch_pdl=False,
                               global_scratch_size=md.global_scratch_size,
                               profile_scratch_size=md.profile_scratch_size,
                               launch_cooperative_grid=md.launch_cooperative_grid)

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0


def real_compile_check() -> None:
    """Triton's own warmup of the GPU form (a multi-output softmax kernel and one over symbolic
    sizes) compiled for sm_90 (Triton's compile and ptxas for real, a FakeDriver for the rest)
    in the thread pool: every buffer specialized 16-byte aligned, sizes i64 and unspecialized,
    and the bound launch passes exactly the binary's signature (buffers, sizes, XBLOCK) after
    the launcher's 13 leading arguments. Runs in a process where Triton never interpreted
    (test_real_triton_compile_fits_the_bound_launch starts it)."""
    import tempfile

    import triton.compiler.compiler as triton_compiler
    from triton.runtime import driver

    from packages.inductor.tests.test_symbolic_kernels import GRAPHS, SYMS
    assert os.environ.get("TRITON_INTERPRET", "0") != "1"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-test-triton-")
    x, y = torch.randn(8, 300), torch.randn(8, 300)
    m1 = gpu_module(lambda a, b: (torch.softmax(a * b, -1), (a > 0) & (b < 1)), x, y)
    text = "ember.ir 1.0\n\n" + SYMS.format(h0=8, h1=16) + GRAPHS["softmax_norm"] + "\n"
    m2 = run_pipeline(parse(re.sub(r"((?:f32|i64)\[[^\]]*\])(?!@)", r"\1@cuda:0", text)),
                      "decompose,cse,dce,inductor-cuda")
    setattr(triton_compiler, "max_shared_mem", lambda dev: 232448)  # noqa: B010
    driver.set_active(FakeDriver())  # type: ignore[arg-type,unused-ignore]
    jobs = []
    for m in (m1, m2):
        sigs = codegen._signatures(m)
        for k in m.kernels.values():
            want = sigs[k.name]
            assert not isinstance(want, str), want
            args, dev = want
            jobs.append(launcher.Job(k.name, block_module(k), args, dev, len(args)))
    report = launcher.LoadReport()
    out = launcher.compile_and_bind(jobs, report, workers=2,
                                    device=lambda d: contextlib.nullcontext(), init=lambda: None)
    assert report.summary()["fast"] == len(jobs) >= 2, report.kernels
    for job in jobs:
        binary = job.module.warmup(*job.args)  # the JIT's cache: the same binary
        sig = list(binary.src.signature.values())
        nbuf = sum(isinstance(a, torch.dtype) for a in job.args)
        assert sig[nbuf:] == ["i64"] * (len(job.args) - nbuf) + ["constexpr"], sig
        attrs = binary.src.attrs  # triton 3.9 also lists the sizes, with no attribute
        aligned = {k for k, v in attrs.items() if v} if isinstance(attrs, dict) else set(attrs)
        assert aligned == {(i,) for i in range(nbuf)}  # all buffers aligned, no size
        run = Recorder()
        fast = job.module.bind(run, 4242, binary.packed_metadata, (False, False), 0,
                               lambda d: 7, lambda: 0)
        assert fast.__code__.co_argcount == len(job.args)
        fast(*[torch.empty(64, dtype=a) if isinstance(a, torch.dtype) else 5 for a in job.args])
        (call,) = run.calls
        assert len(call) == 13 + len(sig) and call[3:5] == (7, 4242), call
        assert out[job.name].__code__ is fast.__code__
    print("real compile check: ok", report.summary())


@INTERPRETER_ONLY
def test_real_triton_compile_fits_the_bound_launch() -> None:
    """real_compile_check in a fresh process (Triton cannot compile for real in a process
    that imported it interpreting)."""
    import subprocess
    from pathlib import Path
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        if not os.path.exists(get_ptxas(90).path):
            pytest.skip("triton without its ptxas")
    except Exception as e:
        pytest.skip(f"triton without its nvidia backend ({e})")
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # (ember.testing.triton_mode: no interpreter)
    code = ("from packages.inductor.tests.test_cuda_launch import real_compile_check; "
            "real_compile_check()")
    p = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and "real compile check: ok" in p.stdout, p.stderr[-3000:]


@NEEDS_CUDA
def test_cuda_kernels_launch_past_the_jit_and_match_eager() -> None:
    from ember.inductor.backend import compiled_runner
    from ember.inductor.launch import load_module
    assert launcher.unavailable(False) is None
    x, y = torch.randn(64, 300, device="cuda"), torch.randn(64, 300, device="cuda")

    def g(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fn(a, b), torch.softmax(a * b, -1)
    m = run_pipeline(captured(g, x, y), "decompose,cse,dce,inductor-cuda")
    table = load_module(m)
    report = codegen.load_report(m)
    assert report is not None and report.kernels
    assert all(k.fast for k in report.kernels.values()), report.summary()
    assert all(k.fn.__name__ == "fast" for k in table.values())
    run = compiled_runner(m)
    for a in (x, torch.randn(64 * 300 + 1, device="cuda")[1:].view(64, 300)):  # misaligned
        got = run(None, [a, y]).outputs
        for o, w in zip(got, g(a, y), strict=True):
            torch.testing.assert_close(o, w)
