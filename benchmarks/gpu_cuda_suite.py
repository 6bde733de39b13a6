"""The CUDA target on the H200 in one call (issue 16): kernel bandwidth, schedule variants, the
op database's Triton column with real launches and bf16, and a small bf16 model suite (eager vs
torch.compile vs ember).

Run from the repository root on a machine with CUDA and triton, without installing ember:

    PYTHONPATH=.:$(ls -d packages/*/src | tr '\\n' :).devlibs python3 benchmarks/gpu_cuda_suite.py

Sections, in this order (each writes its rows to OUT/suite.jsonl as it finishes, so a run cut
short still reports what it did; `--budget S` stops starting new work after S seconds):

1. **copy**: the device-to-device copy bandwidth (1 GiB read + 1 GiB written), the ceiling.
2. **kernels**: memory-bound cases (softmax, layernorm+gelu, a pointwise chain, a row sum;
   16384 x 4096 and each at its 1 GiB-class anchor size, ANCHOR_SHAPES; bf16 and f32):
   eager, torch.compile and ember, each checked against eager
   and timed by triton.testing.do_bench (CUDA events, median); ember's kernel alone too (its
   loaded launch() on preallocated outputs); bytes = each input read once, each output
   written once; TB/s and % of copy.
3. **variants**: ember's softmax and layernorm kernels re-launched with other XBLOCK/num_warps
   (the schedule is in the kernel block: the launch line is rewritten), to choose the default.
4. **models**: bf16, batch 2, random weights: an MLP, a conv net and the 30 models of
   `--models zoo30` (benchmarks/zoo_models.py's CUDA30: torchvision and timm nets, HF decoders,
   encoders and an encoder-decoder, with the zoo's builders, cast to bf16 on cuda). Correctness
   (relative error of ember's and torch.compile's outputs against eager's), cold compile
   seconds, median ms, and what ember ran (graphs, Triton kernels, externs, kernels left to the
   reference, fallbacks). Each model has a `--model-timeout` (SIGALRM: a timed-out model's row
   keeps its finished steps). `--check-builders` builds each model and runs it once in f32 on
   the CPU, no GPU needed.
5. **launch**: the per-call cost of the launch path on tiny models (host-bound: a few
   microseconds of GPU work per call): eager vs torch.compile vs ember, host wall time per call
   over many calls (synchronized at the end) and do_bench's median; and per Triton kernel, the
   host cost of one launch through ember's bound launcher (targets/cuda/launcher.py) vs through
   Triton's JIT (the block's launch()) vs one eager torch op.
6. **opdb**: the op database's "triton kernel" check (packages/inductor/tests/
   opdb_triton_check.py) on cuda: every family in a process pool, EXAMPLES draws each, plus a
   bf16 pass (each drawn sample's f32 tensors cast to bf16).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

START = time.perf_counter()
ROWS, COLS = 16384, 4096
OUT = Path(os.environ.get("OUT", "/tmp/gpu_cuda_suite"))


def elapsed() -> float:
    return time.perf_counter() - START


def emit(row: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "suite.jsonl").open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k not in ("trace", "sources")},
                     default=str)[:600], flush=True)


def bench(fn: Callable[[], Any], warmup: int = 25, rep: int = 100) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def kbench(fn: Callable[[], Any]) -> float:
    """The kernels section's timing: a shorter do_bench (16 cases share a 1-minute device
    slot; the median of 40 ms of calls is still 50+ calls at the 1 GiB sizes)."""
    return bench(fn, warmup=10, rep=40)


# ---- 1. copy ---------------------------------------------------------------------------------

def copy_bandwidth() -> float:
    x = torch.randn(1 << 28, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    tbs = 2 * x.numel() * 4 / (ms * 1e-3) / 1e12
    emit({"section": "copy", "bytes": 2 * x.numel() * 4, "ms": ms, "TBps": round(tbs, 3)})
    return tbs


def same_size_copy(nbytes: int) -> float:
    """TB/s of a copy moving `nbytes` in all: the ceiling at a kernel's own size (a 134 MB bf16
    row sum is a 40 us kernel, whose fixed costs a 2 GiB copy does not show)."""
    x = torch.empty(nbytes // 8, device="cuda")
    y = torch.empty_like(x)
    ms = kbench(lambda: y.copy_(x))
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e12


# ---- 2. kernels ------------------------------------------------------------------------------

def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def layernorm_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def pointwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2.0 + y).sin() * x - y.abs()


def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1)


KERNEL_CASES: dict[str, Callable[..., torch.Tensor]] = {
    "softmax": softmax, "layernorm_gelu": layernorm_gelu, "pointwise": pointwise,
    "row_sum": row_sum}
# issue 16's anchors are 1 GiB-class inputs (torch.compile's softmax 16384x16384 f32 at 78% of
# copy, layernorm+gelu 32768x8192 f32 at 80%): each case also runs at this size
ANCHOR_SHAPES: dict[str, tuple[int, int]] = {
    "softmax": (16384, 16384), "layernorm_gelu": (32768, 8192), "pointwise": (16384, 16384),
    "row_sum": (16384, 16384)}


def kernel_inputs(case: str, dtype: torch.dtype, shape: tuple[int, int] = (ROWS, COLS)
                  ) -> tuple[torch.Tensor, ...]:
    rows, cols = shape

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype)
    if case == "layernorm_gelu":
        return r(rows, cols), r(cols), r(cols)
    if case == "pointwise":
        return r(rows, cols), r(rows, cols)
    return (r(rows, cols),)


def moved_bytes(args: tuple[torch.Tensor, ...], out: torch.Tensor) -> int:
    return sum(a.numel() * a.element_size() for a in args) + out.numel() * out.element_size()


def compiled_module(cf: Any) -> Any:
    cf = getattr(cf, "compiled", cf)
    return getattr(cf, "_last_compiled", None)


def what_ran(cf: Any) -> dict[str, Any]:
    from ember.ir import Graph
    inner = getattr(cf, "compiled", cf)
    m = compiled_module(cf)
    body = getattr(cf, "__dict__", {}).get("_ember_body")  # a module with hooks: its forward
    if m is None and body is not None:
        m = getattr(body, "_last_compiled", None)
    hist = getattr(inner, "history", None)
    out: dict[str, Any] = {
        "fallbacks": [f"{f.kind}: {f.reason}" for f in hist.fallbacks] if hist else [],
        "notes": list(hist.notes)[:6] if hist else [], "hooked": body is not None,
        # (past the first six too: a runtime fallback's note comes late)
        "eager_notes": [n[:200] for n in hist.notes if "eager" in n.lower()
                        and "compiled it" not in n][:8] if hist else [],
        "history": repr(hist)[:300]}
    if hist is not None:  # an eager path must show: graph breaks, graphs no backend compiled
        out["graphs"] = len(hist.graphs)
        out["graph_breaks"] = [b.reason[:160] for b in hist.breaks]
        by_inductor = sum(1 for n in hist.notes if "the inductor backend compiled it" in n)
        out["compiled"] = (bool(hist.graphs) and by_inductor >= len(hist.graphs)
                           and not hist.fallbacks and not hist.breaks)
    if m is None:
        out["compiled"] = False
        return out
    out["triton_kernels"] = sum(1 for k in m.kernels.values() if k.lang == "triton")
    out["externs"] = sorted({str(n.kwargs.get("op")) for g in m.graphs.values()
                             for n in g.nodes if n.op == "kernels.extern"})
    out["on_reference"] = {name: str(g.attrs["triton_fallback"])[:160]
                           for name, g in m.items.items()
                           if isinstance(g, Graph) and "triton_fallback" in g.attrs}
    from ember.inductor.targets.cuda.codegen import load_report
    report = load_report(m)
    if report is not None:  # how the kernels launch (past the JIT or not), compile seconds
        out["launch"] = report.summary()
    return out


def kernel_only(cf: Any, args: tuple[torch.Tensor, ...], out: torch.Tensor
                ) -> tuple[float | None, str]:
    """ms of ember's single Triton kernel launched alone (preallocated output), its source."""
    from ember.inductor.launch import load_module
    from ember.ir import Ref
    m = compiled_module(cf)
    if m is None or len(m.kernels) != 1:
        return None, ""
    (name, k), = m.kernels.items()
    g = next(iter(m.graphs.values()))
    calls = [n for n in g.nodes if n.op == "kernels.call" and isinstance(n.args[0], Ref)]
    if len(calls) != 1 or any(a not in g.params for a in calls[0].args[1:]):
        return None, k.source  # the kernel reads something other than the inputs as given
    ins = [args[g.params.index(a)] for a in calls[0].args[1:]]  # type: ignore[arg-type]
    fn = load_module(m)[name].fn
    dst = torch.empty_like(out)
    return kbench(lambda: fn(*ins, dst)), k.source


def run_kernel_case(case: str, dtype: torch.dtype, copy_tbs: float,
                    shape: tuple[int, int] = (ROWS, COLS)) -> dict[str, Any]:
    import ember.runtime
    fn = KERNEL_CASES[case]
    args = kernel_inputs(case, dtype, shape)
    row: dict[str, Any] = {"section": "kernels", "case": case,
                           "dtype": str(dtype).replace("torch.", ""), "shape": list(shape)}
    with torch.no_grad():
        want = fn(*args)
        nbytes = moved_bytes(args, want)
        row["bytes"] = nbytes
        cf = ember.runtime.compile(fn, dynamic=False)
        t0 = time.perf_counter()
        got = cf(*args)
        torch.cuda.synchronize()
        row["ember_compile_s"] = round(time.perf_counter() - t0, 2)
        row.update(what_ran(cf))
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        try:
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            row["ok"] = True
        except AssertionError as e:
            row["ok"], row["error"] = False, str(e).splitlines()[:3]
        tc = fresh_torch_compile(fn, dynamic=False)  # static at each size, as ember's
        t0 = time.perf_counter()
        tc(*args)
        torch.cuda.synchronize()
        row["tc_compile_s"] = round(time.perf_counter() - t0, 2)
        row["eager_ms"] = kbench(lambda: fn(*args))
        row["tc_ms"] = kbench(lambda: tc(*args))
        row["ember_ms"] = kbench(lambda: cf(*args))
        kms, src = kernel_only(cf, args, want)
        row["ember_kernel_ms"] = kms
        row["sources"] = {case: src}
    same = same_size_copy(nbytes)
    row["same_size_copy_pct_copy"] = round(100 * same / copy_tbs, 1)
    for who in ("eager", "tc", "ember", "ember_kernel"):
        ms = row.get(f"{who}_ms")
        if ms:
            tbs = nbytes / (ms * 1e-3) / 1e12
            row[f"{who}_TBps"] = round(tbs, 3)
            row[f"{who}_pct_copy"] = round(100 * tbs / copy_tbs, 1)
            row[f"{who}_pct_same_size_copy"] = round(100 * tbs / same, 1)
    return row


# ---- 3. schedule variants --------------------------------------------------------------------

def relaunch(source: str, xblock: int, warps: int) -> str:
    """The kernel block with its launch line rewritten for XBLOCK/num_warps (grid to match)."""
    sched = ast.literal_eval(re.search(r"^SCHEDULE = (\{.*\})$", source, re.M).group(1))  # type: ignore[union-attr]
    xn = sched["grid"] * sched["XBLOCK"]
    grid = math.ceil(xn / xblock)
    return re.sub(r"\[\(\d+,\)\]\((.*), XBLOCK=\d+, num_warps=\d+\)",
                  lambda mt: f"[({grid},)]({mt.group(1)}, XBLOCK={xblock}, num_warps={warps})",
                  source)


# XBLOCK x num_warps re-launches per case: rows kernels (rows per program), pointwise (elements
# per program; 16-byte loads need 8 bf16 / 4 f32 elements per thread)
VARIANTS: dict[str, tuple[tuple[int, int], ...]] = {
    "rows": ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16)),
    "row_sum": ((1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 8), (8, 8), (8, 16)),
    "pointwise": ((512, 4), (1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 8),
                  (4096, 16), (8192, 16)),
}


def run_variants(case: str, dtype: torch.dtype, source: str, copy_tbs: float
                 ) -> list[dict[str, Any]]:
    from ember.inductor.targets.cuda.codegen import load_triton
    from ember.ir import Kernel, Module
    args = kernel_inputs(case, dtype)
    want = KERNEL_CASES[case](*args)
    nbytes = moved_bytes(args, want)
    rows = []
    for xblock, warps in VARIANTS.get(case, VARIANTS["rows"]):
        src = relaunch(source, xblock, warps)
        k = Kernel("variant", "triton", src)
        row: dict[str, Any] = {"section": "variants", "case": case,
                               "dtype": str(dtype).replace("torch.", ""), "XBLOCK": xblock,
                               "num_warps": warps}
        try:
            fn = load_triton(Module(), [k])["variant"].fn
            dst = torch.empty_like(want)
            fn(*args, dst)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            row["ok"] = bool(torch.allclose(dst.float(), want.float(), atol=tol, rtol=tol))
            ms = bench(lambda: fn(*args, dst))  # noqa: B023
            row["ms"] = ms
            row["pct_copy"] = round(100 * nbytes / (ms * 1e-3) / 1e12 / copy_tbs, 1)
        except Exception as e:  # noqa: BLE001  (a variant that does not compile is a result)
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        emit(row)
        rows.append(row)
    return rows


# ---- 4. models -------------------------------------------------------------------------------

class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for width in (32, 64, 128):
            layers += [nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                       nn.Conv2d(width, width, 3, stride=2, padding=1), nn.BatchNorm2d(width),
                       nn.ReLU()]
            c = width
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(c, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


Builder = Callable[[], tuple[Any, tuple[Any, ...]]]


def _mlp() -> tuple[Any, tuple[Any, ...]]:
    m = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024))
    return m, (torch.randn(64, 1024),)


def _convnet() -> tuple[Any, tuple[Any, ...]]:
    return ConvNet(), (torch.randn(2, 3, 64, 64),)


def _zoo_models() -> Any:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import zoo_models
    return zoo_models


# Named sets for --models (the zoo's ones come from benchmarks/zoo_models.py): "base" is the
# suite's first 12 (its earlier results), "zoo30" the 30-model set of issue 16 item 6.
DEFAULT_MODELS = "mlp,convnet,zoo30"


def model_sets() -> dict[str, list[str]]:
    zoo = _zoo_models()
    return {"zoo30": list(zoo.CUDA30), "base": ["mlp", "convnet", *zoo.CUDA30[:10]],
            "zoo": [m.name for m in zoo.ZOO]}


def model_names(spec: str, exclude: str = "") -> list[str]:
    """The models of a --models spec: names and set names ("zoo30", "base", "zoo"), in order,
    each once, less those of --exclude (names or sets too)."""
    sets = model_sets()

    def expand(text: str) -> list[str]:
        out: list[str] = []
        for tok in filter(None, (t.strip() for t in text.split(","))):
            for name in sets.get(tok, [tok]):
                if name not in out:
                    out.append(name)
        return out
    dropped = set(expand(exclude))
    return [n for n in expand(spec) if n not in dropped]


def model_list(spec: str = DEFAULT_MODELS, exclude: str = "") -> list[tuple[str, Builder]]:
    """(name, builder) for the models of `spec`: the zoo's builders (FULL sizes, f32 on the CPU;
    run_model casts to bf16 on cuda); an unknown name's builder raises (a skipped row)."""
    zoo = _zoo_models()
    own: dict[str, Builder] = {"mlp": _mlp, "convnet": _convnet}
    out: list[tuple[str, Builder]] = []
    for name in model_names(spec, exclude):
        zm = zoo.BY_NAME.get(name)
        if name in own:
            out.append((name, own[name]))
        elif zm is not None:
            out.append((name, lambda zm=zm: zm.build(zoo.FULL)))  # type: ignore[misc]
        else:
            def unknown(name: str = name) -> tuple[Any, tuple[Any, ...]]:
                raise KeyError(f"no model {name!r} (benchmarks/zoo.py --list)")
            out.append((name, unknown))
    return out


class ModelTimeout(BaseException):
    """A model past its --model-timeout: a BaseException, so that no compiler's own
    `except Exception` (a fallback to eager, say) swallows it."""


def with_timeout(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn() in the main thread, interrupted by SIGALRM after `seconds` (ModelTimeout)."""
    import signal

    def on_alarm(signum: int, frame: Any) -> None:
        raise ModelTimeout(f"timed out after {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_builders(spec: str, exclude: str = "", timeout: float = 120.0) -> list[dict[str, Any]]:
    """Without a GPU: each model of `spec` built (seed 0) and called once by eager in f32 on the
    CPU, so the set can be checked before a device call is spent on it."""
    rows = []
    for name, build in model_list(spec, exclude):
        row: dict[str, Any] = {"section": "builders", "model": name}
        t0 = time.perf_counter()
        try:
            def one(build: Builder = build) -> Any:
                torch.manual_seed(0)
                model, args = build()
                with torch.no_grad():
                    return model(*args)
            out = with_timeout(timeout, one)
            t = out.logits if hasattr(out, "logits") else getattr(out, "last_hidden_state", out)
            t = t[0] if isinstance(t, (tuple, list)) else t
            row["ok"] = bool(isinstance(t, torch.Tensor) and torch.isfinite(t).all())
            row["shape"] = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        except (Exception, ModelTimeout) as e:  # noqa: BLE001  (a failing builder is a result)
            row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:200]}"
        row["s"] = round(time.perf_counter() - t0, 2)
        emit(row)
        rows.append(row)
    return rows


def to_device(v: Any, dtype: torch.dtype) -> Any:
    if isinstance(v, torch.Tensor):
        return v.to("cuda", dtype) if v.is_floating_point() else v.to("cuda")
    return v


def rel_err(a: Any, b: Any) -> float:
    fa = [x for x in (a if isinstance(a, (tuple, list)) else [a]) if isinstance(x, torch.Tensor)]
    fb = [x for x in (b if isinstance(b, (tuple, list)) else [b]) if isinstance(x, torch.Tensor)]
    if hasattr(a, "logits"):
        fa, fb = [a.logits], [b.logits]
    elif hasattr(a, "last_hidden_state"):
        fa, fb = [a.last_hidden_state], [b.last_hidden_state]
    num = sum(float((x.float() - y.float()).norm()) ** 2 for x, y in zip(fa, fb, strict=True))
    den = sum(float(y.float().norm()) ** 2 for y in fb)
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


# A compiler's bf16 output is right when it is as close to the f32 model as eager's bf16 is (up
# to twice as far, plus 0.5%: other fusions round at other places), or, with no f32 reference,
# within 3% of eager's (relative L2 error over the model's output tensors).
NEAR_EAGER = 0.03


def correct(vs_eager: float | None, vs_f32: float | None, eager_vs_f32: float | None) -> bool:
    if vs_eager is None or not math.isfinite(vs_eager):
        return False
    if vs_eager <= NEAR_EAGER:
        return True
    return vs_f32 is not None and eager_vs_f32 is not None and math.isfinite(vs_f32) \
        and vs_f32 <= 2 * eager_vs_f32 + 0.005


def eager_notes(r: dict[str, Any]) -> list[str]:
    """What of a model ran outside ember's compiled code: fallbacks, graph breaks, graphs not
    compiled, notes that say the eager backend or the reference interpreter ran something."""
    out = [*r.get("fallbacks", []), *(f"graph break: {b}" for b in r.get("graph_breaks", []))]
    out += r.get("eager_notes", [])
    out += [f"on the reference: {k}" for k in r.get("on_reference", {})]
    if r.get("compiled") is False:  # said even next to the breaks that caused it
        out.append("NOT COMPILED")
    return out


def dynamo_graphs() -> int:
    """The graphs torch.compile (TorchDynamo) has compiled in this process so far (its own
    counter; `torch._dynamo.reset()` leaves it alone, so a difference counts one model's)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def fresh_torch_compile(fn: Any, **kwargs: Any) -> Any:
    """torch.compile of `fn` as in a fresh process. Dynamo keeps its cache entries and
    recompile counts per code object for the whole process, and transformers' models share
    forward code: in the one-process zoo30 run of 2026-12-02 it stopped compiling hf/bloom,
    gemma, bart and deberta-v2 after the earlier HF models (first calls of 0.00-0.02 s, outputs
    bit-equal to eager) and ran them eagerly. Reset before each case, both compilers compile
    every case cold (ember keeps no state across `ember.runtime.compile` calls: each is a new
    CompiledFunction; both keep their on-disk kernel caches, as a second process would)."""
    torch._dynamo.reset()
    return torch.compile(fn, **kwargs)


def recorded_graphs(cf: Any) -> list[Any]:
    """The CUDA-graph records (runtime history) of ember's graphs that were recorded."""
    out = []
    for c in (getattr(cf, "compiled", cf), getattr(cf, "__dict__", {}).get("_ember_body")):
        hist = getattr(c, "history", None)
        out += [r for r in getattr(hist, "cuda_graphs", []) if r.recordings and r not in out]
    return out


def run_model(name: str, build: Callable[[], tuple[Any, tuple[Any, ...]]], jit: bool = False,
              row: dict[str, Any] | None = None) -> dict[str, Any]:
    """One model: eager, torch.compile and ember (`jit`: also ember with its Triton kernels
    launched through Triton's JIT, EMBER_TRITON_LAUNCH=jit). Results go into `row` as they
    come, so a model cut short by its timeout still reports its finished steps."""
    import ember.runtime
    dtype = torch.bfloat16
    row = {} if row is None else row
    row.update({"section": "models", "model": name, "dtype": "bfloat16"})
    torch.manual_seed(0)
    try:
        model, args = build()
    except Exception as e:  # noqa: BLE001  (a library missing on the device: reported)
        row["skipped"] = f"{type(e).__name__}: {str(e)[:160]}"
        return row
    model = model.to("cuda", dtype).eval() if isinstance(model, nn.Module) else model
    args = tuple(to_device(a, dtype) for a in args)
    with torch.no_grad():
        want = model(*args)
        ref32 = None
        try:  # the f32 model as the reference for both compilers' errors
            m32 = model.float()
            ref32 = m32(*(to_device(a, torch.float32) for a in args))
            model.to(dtype)
        except Exception:  # noqa: BLE001
            model.to(dtype)
        cf = ember.runtime.compile(model, dynamic=False)
        t0 = time.perf_counter()
        try:
            got = cf(*args)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            row["ember_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            # the innermost frames, where it was raised (limit=6 kept the outermost six: the
            # 2026-12-02 IndexError of deberta-v2 showed only `_miss` calling something)
            row["trace"] = traceback.format_exc(limit=-12)
            got = None
        row["ember_compile_s"] = round(time.perf_counter() - t0, 2)
        if got is not None:  # the second call: where the default mode records a CUDA graph
            t0 = time.perf_counter()
            cf(*args)
            torch.cuda.synchronize()
            row["ember_second_call_s"] = round(time.perf_counter() - t0, 3)
        row.update(what_ran(cf))
        tc = fresh_torch_compile(model)
        graphs0 = dynamo_graphs()
        t0 = time.perf_counter()
        tgot = tc(*args)
        torch.cuda.synchronize()
        row["tc_compile_s"] = round(time.perf_counter() - t0, 2)
        # no graph compiled: torch.compile ran it eagerly (its row must not count as tc's)
        row["tc_graphs"] = dynamo_graphs() - graphs0
        row["tc_compiled"] = row["tc_graphs"] > 0
        row["eager_vs_f32"] = rel_err(want, ref32) if ref32 is not None else None
        row["tc_vs_eager"] = rel_err(tgot, want)
        row["tc_vs_f32"] = rel_err(tgot, ref32) if ref32 is not None else None
        row["tc_correct"] = correct(row["tc_vs_eager"], row["tc_vs_f32"], row["eager_vs_f32"])
        if got is not None:
            row["ember_vs_eager"] = rel_err(got, want)
            row["ember_vs_f32"] = rel_err(got, ref32) if ref32 is not None else None
            row["ember_correct"] = correct(row["ember_vs_eager"], row["ember_vs_f32"],
                                           row["eager_vs_f32"])
        row["eager_ms"] = bench(lambda: model(*args))
        row["tc_ms"] = bench(lambda: tc(*args))
        if got is not None:
            row["ember_ms"] = bench(lambda: cf(*args))
            row["ember_speedup"] = round(row["eager_ms"] / row["ember_ms"], 3)
            graphs = recorded_graphs(cf)
            row["cuda_graphs"] = len(graphs)
            # the outputs of a call as timed (a replay, where ember recorded): right too
            timed = cf(*args)
            again = rel_err(timed, want)
            row["ember_timed_vs_eager"] = again
            row["ember_correct"] = row.get("ember_correct", False) and correct(
                again, rel_err(timed, ref32) if ref32 is not None else None,
                row.get("eager_vs_f32"))
            if graphs:  # the same compiled code launched kernel by kernel, for comparison
                for rec in graphs:
                    rec.skipped = "timed without its recording (gpu_cuda_suite)"
                try:
                    row["ember_launched_ms"] = bench(lambda: cf(*args))
                finally:
                    for rec in graphs:
                        rec.skipped = None
            if jit:
                jcf, row["jit_launch"] = jit_compiled(model, args)
                row["ember_jit_ms"] = bench(lambda: jcf(*args))
        row["tc_speedup"] = round(row["eager_ms"] / row["tc_ms"], 3)
    return row


# ---- 5. launch overhead ----------------------------------------------------------------------

def host_us(fn: Callable[[], Any], n: int = 2000) -> float:
    """Host wall time per call over n calls, synchronized once at the end (for calls whose GPU
    work is shorter than their launch cost, this is the launch path's cost)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def tiny_one(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2.0 + 1.0)


def tiny_chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    for _ in range(8):  # 8 matmuls (externs) and 8 pointwise kernels
        x = torch.tanh(x @ w) * 0.5 + x
    return x


def launch_cases() -> list[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]]:
    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda")
    return [("one_kernel", tiny_one, (r(64, 64),)),
            ("chain8", tiny_chain, (r(16, 64), r(64, 64) / 8)),
            ("softmax_small", softmax, (r(32, 128),))]


def jit_compiled(fn: Any, args: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
    """fn compiled by ember again with EMBER_TRITON_LAUNCH=jit (its Triton kernels launched
    through Triton's JIT, as before the bound launcher), called once; how its kernels load."""
    import ember.runtime
    os.environ["EMBER_TRITON_LAUNCH"] = "jit"
    try:
        cf = ember.runtime.compile(fn, dynamic=False)
        cf(*args)
        torch.cuda.synchronize()
    finally:
        os.environ.pop("EMBER_TRITON_LAUNCH", None)
    return cf, what_ran(cf).get("launch", {})


def run_launch() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case, fn, args in launch_cases():
        row: dict[str, Any] = {"section": "launch", "case": case}
        try:
            row.update(launch_case(case, fn, args))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["trace"] = traceback.format_exc(limit=-12)
        emit(row)
        rows.append(row)
    return rows


def launch_case(case: str, fn: Callable[..., Any], args: tuple[torch.Tensor, ...]
                ) -> dict[str, Any]:
    import ember.runtime
    row: dict[str, Any] = {}
    with torch.no_grad():
        want = fn(*args)
        cf = ember.runtime.compile(fn, dynamic=False)
        got = cf(*args)
        tc = fresh_torch_compile(fn)
        tgot = tc(*args)
        torch.cuda.synchronize()
        row["ok"] = bool(torch.allclose(got, want, atol=1e-4, rtol=1e-4)) and \
            bool(torch.allclose(tgot, want, atol=1e-4, rtol=1e-4))
        row.update(what_ran(cf))
        jcf, row["jit_launch"] = jit_compiled(fn, args)
        for who, f in (("eager", fn), ("tc", tc), ("ember", cf), ("ember_jit", jcf)):
            row[f"{who}_host_us"] = round(host_us(lambda f=f, a=args: f(*a)), 2)  # type: ignore[misc]
            row[f"{who}_ms"] = bench(lambda f=f, a=args: f(*a))  # type: ignore[misc]
        m = compiled_module(cf)
        if case == "one_kernel" and m is not None and len(m.kernels) == 1:
            row.update(kernel_launch_costs(m, args[0], want))
    return row


def kernel_launch_costs(m: Any, x: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    """One Triton kernel launched alone: through the bound launcher (the loaded kernel), through
    Triton's JIT (the block's launch()), and one eager op of the same size, in host us."""
    from ember.inductor.launch import load_module
    (name,) = m.kernels
    fast = load_module(m)[name].fn
    jit = getattr(sys.modules.get(getattr(fast, "__module__", "")), "launch", None)
    out = torch.empty_like(want)
    res: dict[str, Any] = {"kernel_fn": getattr(fast, "__name__", "?")}
    res["bound_launch_us"] = round(host_us(lambda: fast(x, out), 5000), 2)
    res["bound_ok"] = bool(torch.allclose(out, want))
    if callable(jit) and jit is not fast:
        out.zero_()
        res["jit_launch_us"] = round(host_us(lambda: jit(x, out), 5000), 2)
        res["jit_ok"] = bool(torch.allclose(out, want))
    res["eager_op_us"] = round(host_us(lambda: torch.mul(x, 2.0, out=out), 5000), 2)
    return res


# ---- 6. the op database's Triton column on cuda ----------------------------------------------

def _bf16(s: Any) -> Any:
    from ember.testing.opdb import Sample

    def cast(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.dtype == torch.float32:
            return v.to(torch.bfloat16)
        if isinstance(v, (list, tuple)):
            return type(v)(cast(x) for x in v)
        return v
    return Sample(cast(s.args), {k: cast(v) for k, v in s.kwargs.items()})


def opdb_family(family: str, examples: int) -> dict[str, Any]:
    """One family on cuda: `examples` drawn samples per op, each also cast to bf16."""
    import warnings

    from hypothesis import strategies as st

    warnings.filterwarnings("ignore")
    from packages.inductor.tests.opdb_triton_check import check_family, family_entries
    t0 = time.perf_counter()
    entries = family_entries(family)
    strategy = st.fixed_dictionaries({e.op: e.samples() for e in entries})
    found: dict[str, str] = {}
    runs = 0
    for _ in range(examples):
        drawn = strategy.example()
        for samples in (drawn, {op: _bf16(s) for op, s in drawn.items()}):
            try:
                fails = check_family(entries, samples, "cuda")
            except Exception as e:  # noqa: BLE001
                fails = {"<module>": f"{type(e).__name__}: {str(e)[:300]}"}
            runs += 1
            for op, why in fails.items():
                found.setdefault(op, why[:400])
    return {"section": "opdb", "family": family, "ops": len(entries), "runs": runs,
            "failures": found, "s": round(time.perf_counter() - t0, 1)}


def run_opdb(examples: int, workers: int, budget: float) -> list[dict[str, Any]]:
    import multiprocessing as mp

    from packages.inductor.tests.opdb_triton_check import SCOPE
    rows = []
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    futs = {pool.submit(opdb_family, f, examples): f for f in sorted(SCOPE.families)}
    done: set[str] = set()
    try:
        for fut in as_completed(futs, timeout=max(10.0, budget - elapsed())):
            try:
                row = fut.result()
            except Exception as e:  # noqa: BLE001
                row = {"section": "opdb", "family": futs[fut],
                       "error": f"{type(e).__name__}: {str(e)[:300]}"}
            done.add(futs[fut])
            emit(row)
            rows.append(row)
    except TimeoutError:
        for fam in sorted(set(futs.values()) - done):
            row = {"section": "opdb", "family": fam, "error": "out of time"}
            emit(row)
            rows.append(row)
    pool.shutdown(wait=False, cancel_futures=True)
    return rows


# ---- report ----------------------------------------------------------------------------------

def markdown(rows: list[dict[str, Any]], env: dict[str, str], copy_tbs: float) -> str:
    lines = ["# ember's CUDA target on the H200 (benchmarks/gpu_cuda_suite.py)", "",
             ", ".join(f"{k} {v}" for k, v in env.items()), "",
             f"Copy bandwidth (1 GiB read + 1 GiB written, do_bench median): {copy_tbs:.2f} TB/s.",
             "Times: triton.testing.do_bench medians (CUDA events), ms.", ""]
    ks = [r for r in rows if r["section"] == "kernels"]
    if ks:
        lines += ["## Memory-bound kernels (bytes: inputs read once, output written once)", "",
                  "| case | shape | dtype | ok | eager % copy | torch.compile % copy | ember % copy | "
                  "ember kernel alone % copy | ember ms | tc ms | Triton kernels | "
                  "same-size copy % copy | ember % same-size copy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ks:
            shape = "x".join(str(d) for d in r.get("shape", []))
            lines.append(f"| {r['case']} | {shape} | {r['dtype']} | {r.get('ok')} | "
                         f"{r.get('eager_pct_copy')} | {r.get('tc_pct_copy')} | "
                         f"{r.get('ember_pct_copy')} | {r.get('ember_kernel_pct_copy')} | "
                         f"{r.get('ember_ms', 0):.4f} | {r.get('tc_ms', 0):.4f} | "
                         f"{r.get('triton_kernels')} | {r.get('same_size_copy_pct_copy')} | "
                         f"{r.get('ember_pct_same_size_copy')} |")
    vs = [r for r in rows if r["section"] == "variants"]
    if vs:
        lines += ["", "## Schedule variants (ember's kernel re-launched)", "",
                  "| case | dtype | XBLOCK | num_warps | ok | ms | % copy |",
                  "|---|---|---|---|---|---|---|"]
        for r in vs:
            lines.append(f"| {r['case']} | {r['dtype']} | {r['XBLOCK']} | {r['num_warps']} | "
                         f"{r.get('ok')} | {r.get('ms', r.get('error'))} | "
                         f"{r.get('pct_copy')} |")
    ms_ = [r for r in rows if r["section"] == "models"]
    if ms_:
        lines += ["", "## Models (bf16, random weights, inference)", "",
                  "correct: the compiler's output is as close to the f32 model as eager's bf16 "
                  "(at most 2x its relative error + 0.005) or within 3% of eager's. eager "
                  "notes: fallbacks, graph breaks, kernels on the reference interpreter, "
                  "notes of the eager backend running something, NOT COMPILED. tc NOT "
                  "COMPILED: torch.compile compiled no graph of the model (each model's "
                  "torch.compile starts after torch._dynamo.reset()).", "",
                  "| model | correct (ember / tc) | ember rel err vs eager | tc rel err vs eager "
                  "| ember / eager bf16 rel err vs f32 | eager ms | tc ms | ember ms | "
                  "tc speedup | ember speedup | ember ms, kernels launched one by one | "
                  "tc compile s | ember compile s | Triton kernels | eager notes |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        jit_rows: list[str] = []
        for r in ms_:
            if "skipped" in r:
                lines.append(f"| {r['model']} | skipped: {r['skipped']} |" + " |" * 13)
                continue
            if "error" in r and "eager_ms" not in r:  # failed or timed out before timing
                lines.append(f"| {r['model']} | error: {r['error'][:160]} |" + " |" * 13)
                continue

            def f(k: str, fmt: str = "{:.3g}", r: dict[str, Any] = r) -> str:
                v = r.get(k)
                return fmt.format(v) if isinstance(v, (int, float)) else str(v or "")
            if "ember_jit_ms" in r:
                jit_rows.append(f"| {r['model']} | {f('ember_ms')} | {f('ember_jit_ms')} | "
                                f"{r.get('launch', {}).get('fast')} / "
                                f"{r.get('jit_launch', {}).get('fast')} |")
            notes = eager_notes(r)
            if "ember_error" in r:
                notes.append(r["ember_error"][:120])
            if "error" in r:
                notes.append(r["error"][:120])
            lines.append(
                f"| {r['model']} | {'yes' if r.get('ember_correct') else 'NO'} / "
                f"{tc_state(r)} | {f('ember_vs_eager')} | "
                f"{f('tc_vs_eager')} | {f('ember_vs_f32')} / {f('eager_vs_f32')} | "
                f"{f('eager_ms')} | {f('tc_ms')} | {f('ember_ms')} | {f('tc_speedup')} | "
                f"{f('ember_speedup')} | {f('ember_launched_ms') or 'same (no CUDA graph)'} | "
                f"{f('tc_compile_s')} | {f('ember_compile_s')} | "
                f"{r.get('triton_kernels', '')} | "
                f"{'; '.join(n.replace('|', '/')[:160] for n in notes) or 'none'} |")
        if jit_rows:
            lines += ["", "ember with its kernels launched through Triton's JIT "
                      "(EMBER_TRITON_LAUNCH=jit, compiled again in the same process):", "",
                      "| model | ember ms | ember (JIT launch) ms | kernels past the JIT "
                      "(bound / JIT run) |", "|---|---|---|---|", *jit_rows]
        lines += summary_lines(ms_)
    ls = [r for r in rows if r["section"] == "launch"]
    if ls:
        lines += ["", "## Per-call cost on tiny models (host us per call, many calls, one "
                  "synchronize; do_bench ms)", "",
                  "| case | ok | Triton kernels | eager us | tc us | ember us | ember (JIT launch) "
                  "us | eager ms | tc ms | ember ms | ember (JIT launch) ms | kernels past the JIT "
                  "(bound / JIT run) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ls:
            if "error" in r:
                lines.append(f"| {r['case']} | error: {r['error'][:200]} |" + " |" * 10)
                continue
            la, lj = r.get("launch", {}), r.get("jit_launch", {})
            lines.append(f"| {r['case']} | {r.get('ok')} | {r.get('triton_kernels')} | "
                         f"{r.get('eager_host_us')} | {r.get('tc_host_us')} | "
                         f"{r.get('ember_host_us')} | {r.get('ember_jit_host_us')} | "
                         f"{r.get('eager_ms', 0):.4f} | {r.get('tc_ms', 0):.4f} | "
                         f"{r.get('ember_ms', 0):.4f} | {r.get('ember_jit_ms', 0):.4f} | "
                         f"{la.get('fast')}/{la.get('kernels')} / {lj.get('fast')} |")
        for r in ls:
            if "bound_launch_us" in r:
                lines += ["", f"One Triton kernel launched alone (host us per launch): ember's "
                              f"bound launcher {r['bound_launch_us']} (ok {r.get('bound_ok')}), "
                              f"Triton's JIT {r.get('jit_launch_us')} (ok {r.get('jit_ok')}), "
                              f"one eager torch op (torch.mul out=) {r.get('eager_op_us')}."]
    ops = [r for r in rows if r["section"] == "opdb"]
    if ops:
        lines += ["", "## The op database's Triton column on cuda (real launches; each drawn "
                  "sample also cast to bf16)", "",
                  "| family | ops | module runs | failing ops | s |", "|---|---|---|---|---|"]
        for r in ops:
            lines.append(f"| {r['family']} | {r.get('ops')} | {r.get('runs')} | "
                         f"{len(r.get('failures', {})) if 'failures' in r else r.get('error')} "
                         f"| {r.get('s')} |")
        fails = [(r["family"], op, why) for r in ops for op, why in r.get("failures", {}).items()]
        if fails:
            lines += ["", "Failures:", ""]
            lines += [f"- {fam} `{op}`: {why[:300]}" for fam, op, why in fails]
    return "\n".join(lines) + "\n"


def tc_state(r: dict[str, Any]) -> str:
    """torch.compile's "correct" cell: NOT COMPILED where it compiled no graph of the model."""
    if r.get("tc_compiled") is False:
        return "NOT COMPILED"
    return "yes" if r.get("tc_correct") else "NO"


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary_lines(ms_: list[dict[str, Any]]) -> list[str]:
    """The geomean speedups over the models both compilers ran and got right (the others
    named), ember's correct and eager-note-free count, and the cold compiles compared."""
    both = [r for r in ms_ if r.get("tc_speedup") and r.get("ember_speedup")
            and r.get("ember_correct") and r.get("tc_correct")
            and r.get("tc_compiled") is not False]
    left = [r["model"] for r in ms_ if r not in both]
    out = [""]
    if both:
        g_tc = geomean([r["tc_speedup"] for r in both])
        g_em = geomean([r["ember_speedup"] for r in both])
        out.append(f"Geomean speedup over eager ({len(both)} of {len(ms_)} models, those both "
                   f"compilers ran and got right): torch.compile {g_tc:.2f}x, ember "
                   f"{g_em:.2f}x." + (f" Left out: {', '.join(left)}." if left else ""))
    clean = [r["model"] for r in ms_ if r.get("ember_correct") and not eager_notes(r)
             and "error" not in r and "ember_error" not in r]
    out.append(f"ember correct with no eager note: {len(clean)} of {len(ms_)} models"
               + (f" (not: {', '.join(r['model'] for r in ms_ if r['model'] not in clean)})"
                  if len(clean) < len(ms_) else "") + ".")
    cc = [r for r in ms_ if r.get("tc_compile_s") is not None
          and r.get("ember_compile_s") is not None and r.get("tc_compiled") is not False]
    uncompiled = [r["model"] for r in ms_ if r.get("tc_compiled") is False]
    if uncompiled:
        out.append(f"torch.compile compiled no graph of: {', '.join(uncompiled)} (left out of "
                   f"the geomean and the cold compiles).")
    slower = [f"{r['model']} ({r['ember_compile_s']} vs {r['tc_compile_s']} s)" for r in cc
              if r["ember_compile_s"] > r["tc_compile_s"]]
    if cc:
        out.append(f"Cold compile (first call): ember at or below torch.compile on "
                   f"{len(cc) - len(slower)} of {len(cc)} models"
                   + (f"; above on {', '.join(slower)}" if slower else "") + "; total "
                   f"{sum(r['ember_compile_s'] for r in cc):.1f} s vs "
                   f"{sum(r['tc_compile_s'] for r in cc):.1f} s; ember's second calls "
                   f"(where its CUDA graphs are recorded) "
                   f"{sum(r.get('ember_second_call_s') or 0 for r in cc):.2f} s in all.")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; no new work after")
    ap.add_argument("--sections", default="copy,kernels,variants,launch,models,opdb")
    ap.add_argument("--kernel-sizes", default="suite,anchor",
                    help="kernels section sizes: suite (16384x4096), anchor (ANCHOR_SHAPES)")
    ap.add_argument("--examples", type=int, default=2, help="opdb draws per family")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help="comma-separated model names (benchmarks/zoo.py --list, mlp, convnet) "
                         "and sets: zoo30 (issue 16's 30 zoo models), base (the first 12), zoo "
                         f"(all); default {DEFAULT_MODELS}")
    ap.add_argument("--exclude", default="", help="models (names or sets) left out of --models")
    ap.add_argument("--model-timeout", type=float, default=150.0,
                    help="seconds per model (cut to the budget left + 15 s)")
    ap.add_argument("--check-builders", action="store_true",
                    help="no GPU needed: build each model of --models and run it once by eager "
                         "in f32 on the CPU, then exit")
    ap.add_argument("--warm-caches", action="store_true",
                    help="keep Triton's and TorchInductor's caches (default: fresh ones, so both "
                         "compilers' compile times are cold)")
    ap.add_argument("--jit-models", default="mlp,timm/deit_tiny_patch16_224",
                    help="models also timed with ember's kernels launched through Triton's JIT")
    a = ap.parse_args()
    if a.check_builders:
        rows = check_builders(a.models, a.exclude, a.model_timeout)
        bad = [r["model"] for r in rows if not r["ok"]]
        print(f"builders: {len(rows) - len(bad)}/{len(rows)} ok" + (f"; failing: {bad}" if bad
                                                                   else ""), flush=True)
        return 1 if bad else 0
    if not torch.cuda.is_available():
        print("gpu_cuda_suite: no CUDA device", file=sys.stderr)
        return 2
    if not a.warm_caches:  # read when each compiler first looks: fresh directories now
        import tempfile
        for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "EMBER_CACHE_DIR"):
            os.environ[var] = tempfile.mkdtemp(prefix=var.lower() + "-")
    import triton
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "ember commit": os.environ.get("EMBER_COMMIT", "?"),
           "cpus": str(os.cpu_count()),
           "caches": "warm (as found)" if a.warm_caches else "fresh (Triton, TorchInductor, ember)"}
    emit({"section": "env", **env})
    sections = a.sections.split(",")
    rows: list[dict[str, Any]] = []
    copy_tbs = copy_bandwidth() if "copy" in sections else 4.18
    sources: dict[tuple[str, torch.dtype], str] = {}
    if "kernels" in sections:
        for case in KERNEL_CASES:  # each at the suite's 16384x4096 and its 1 GiB anchor
            for dtype in (torch.bfloat16, torch.float32):
                for size in a.kernel_sizes.split(","):
                    shape = ANCHOR_SHAPES[case] if size == "anchor" else (ROWS, COLS)
                    if elapsed() > a.budget:
                        break
                    try:
                        row = run_kernel_case(case, dtype, copy_tbs, shape)
                    except Exception as e:  # noqa: BLE001
                        row = {"section": "kernels", "case": case, "dtype": str(dtype),
                               "shape": list(shape),
                               "error": f"{type(e).__name__}: {str(e)[:300]}",
                               "trace": traceback.format_exc(limit=-12)}
                    if size != "anchor":
                        sources[(case, dtype)] = row.get("sources", {}).get(case, "")
                    emit(row)
                    rows.append(row)
                    torch.cuda.empty_cache()
    if "variants" in sections:
        for case in ("softmax", "layernorm_gelu", "row_sum", "pointwise"):
            for dtype in (torch.float32, torch.bfloat16):
                src = sources.get((case, dtype))
                if src and elapsed() < a.budget:
                    rows += run_variants(case, dtype, src, copy_tbs)
    if "launch" in sections and elapsed() < a.budget:
        try:
            rows += run_launch()
        except Exception as e:  # noqa: BLE001
            row = {"section": "launch", "case": "?", "error": f"{type(e).__name__}: {e}"[:300],
                   "trace": traceback.format_exc(limit=-12)}
            emit(row)
    torch.cuda.empty_cache()
    pool_rows: list[dict[str, Any]] = []
    if "opdb" in sections:  # in the background while the models run (mostly CPU: compiles)
        import threading
        th = threading.Thread(target=lambda: pool_rows.extend(
            run_opdb(a.examples, a.workers, a.budget + 60)), daemon=True)
        th.start()
    if "models" in sections:
        for name, build in model_list(a.models, a.exclude):
            if elapsed() > a.budget:
                emit({"section": "models", "model": name, "skipped": "out of time"})
                continue
            # one slow model cannot eat the call: its own limit, cut to the budget left (plus
            # 15 s, so a model started near the end can still finish a quick step)
            limit = min(a.model_timeout, a.budget - elapsed() + 15.0)
            row = {"section": "models", "model": name}
            try:
                with_timeout(limit, lambda name=name, build=build, row=row: run_model(  # type: ignore[misc]
                    name, build, name in a.jit_models.split(","), row))
            except ModelTimeout as e:
                row["error"] = f"timeout: {e}"
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                row["trace"] = traceback.format_exc(limit=-12)
            emit(row)
            rows.append(row)
            torch.cuda.empty_cache()
    if "opdb" in sections:
        th.join(timeout=max(5.0, a.budget + 60 - elapsed()))
        rows += pool_rows
    md = markdown(rows, env, copy_tbs)
    (OUT / "suite.md").write_text(md)
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # the op pool's workers may still run: do not wait for them
