"""The CUDA target's code generation and loading: `codegen-triton` and the `triton` loader.

`codegen-triton` turns each loop kernel into a `kernel @name triton` block (a Python module of
Triton source, render.py) and its node into `kernels.call(@name, bufs..., out_dtypes=,
out_shapes=, device=)`; `loop.extern` becomes `kernels.extern` (torch's own kernels on the
device: matmul, convolution, attention, ...). A kernel the tables cannot express keeps its loop
node and body (run by the reference interpreter, vectorised torch on the device) with the
reason in `attrs(triton_fallback=...)`.

It generates code for graphs on cuda; `codegen-triton{interpret=true}` also takes CPU graphs,
whose kernels then run in Triton's interpreter (TRITON_INTERPRET=1): that is how the target is
tested on machines without a GPU (pipeline `inductor-cuda-interpret`).

The `triton` loader writes each block's source to `<kernel cache>/triton/<sha256>.py` (the
private cache directory, cache.py) and imports it: `triton.jit` needs a source file. Like the
`cpp` loader compiling a block with g++, it runs the block's code: blocks come from
`codegen-triton` or, in an IR file, only with `--allow-kernels`. Its kernels take the tensors
(ABI "tensor") and launch with the grid and warps written in the block. On cuda it compiles the
module's kernels at load, in parallel, and hands out each block's bound launch past Triton's
JIT (launcher.py); `load_report(module)` says which kernels got it and the compile seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

from ember.inductor import buffers as _buffers  # noqa: F401  (registers plan-buffers)
from ember.inductor.body import body_names
from ember.inductor.codegen import (
    assemble,
    call_node,
    extern_node,
    keep_on_reference,
    kernel_body,
    kernel_name,
    lower_graphs,
    retyped,
)
from ember.inductor.launch import LoadedKernel, LoadError
from ember.inductor.targets import TargetError, device_kind, graph_devices
from ember.inductor.targets.cuda.launcher import (
    Job,
    KernelLoad,
    LoadReport,
    compile_and_bind,
    unavailable,
)
from ember.inductor.targets.cuda.lowp import LOWP_DEFAULT, LOWP_MODES, bf16_results, has_lowp_values
from ember.inductor.targets.cuda.matmul_template import Pair, fused_externs, render_matmul
from ember.inductor.targets.cuda.prelude import GPU_LIBDEVICE, INTERP_LIBDEVICE
from ember.inductor.targets.cuda.render import RMAX, CodegenError, render
from ember.ir import (
    Arg,
    Graph,
    Kernel,
    Module,
    Node,
    Ref,
    TensorType,
    Value,
)
from ember.ir.passes import register_pass

LANG = "triton"


@register_pass("codegen-triton", "loop IR -> kernels.* graph with Triton kernel blocks (CUDA; "
               "interpret=true also takes CPU graphs, run by Triton's interpreter)")
def codegen_triton(module: Module, *, interpret: bool = False) -> Module:
    src = module.clone()
    bodies = body_names(src)
    kinds = ("cuda", "cpu") if interpret else ("cuda",)
    for g in src.graphs.values():
        other = sorted(d for d in graph_devices(g) if device_kind(d) not in kinds)
        if g.name not in bodies and other:
            raise TargetError(f"codegen-triton: graph @{g.name} is on {', '.join(other)}; "
                              f"codegen-triton generates cuda code only (cpu with "
                              f"interpret=true)")
    kernels: list[Kernel] = []
    fallback: list[Graph] = []

    def lower(g: Graph) -> list[Node]:
        # max-autotune's matmul template: the extern's product is computed in its epilogue
        fused = fused_externs(g)
        return [_lower_node(src, g, n, kernels, fallback, interpret, fused.get(n))
                for n in g.nodes if n not in fused.values()]

    return assemble(src, kernels, lower_graphs(src, lower), fallback)


def _on_device(n: Node) -> dict[str, Arg]:
    """kernels.call's device= for `n`'s results (none for the CPU: the interpreter's)."""
    devs = sorted({r.type.device for r in n.results if isinstance(r.type, TensorType)})
    return {"device": devs[0]} if devs and devs[0] != "cpu" else {}


def _lower_node(m: Module, g: Graph, n: Node, kernels: list[Kernel], fallback: list[Graph],
                interpret: bool, mm: Node | None = None) -> Node:
    ext = extern_node(m, n)
    if ext is not None:
        return ext
    body = kernel_body(m, n)
    if body is None:
        return n
    name = kernel_name(body, kernels)
    if mm is not None:  # the matmul template with this kernel as its epilogue
        pos = next(k for k, x in enumerate(n.args[1:]) if mm.results and x is mm.results[0])
        rendered = render_matmul(name, Pair(mm, n, pos), m.items, interpret)
        kernels.append(Kernel(name, LANG, rendered.source))
        args = [*mm.args, *(x for k, x in enumerate(n.args[1:]) if k != pos)]
        for a in mm.args:
            if isinstance(a, Value):
                retyped(a)
        return call_node(n, name, args, extra=_on_device(n))
    try:
        rendered = render(name, n, body, m.items, interpret)
    except CodegenError as e:
        body.attrs["triton_fallback"] = str(e)
        keep_on_reference(m, body, fallback)
        return n
    kernels.append(Kernel(name, LANG, rendered.source))
    return call_node(n, name, n.args[1:], rendered.sizes, _on_device(n))


@register_pass("schedule-cuda", "write each loop kernel's Triton schedule as attributes "
               "(cuda_xblock, cuda_warps, cuda_persistent, cuda_rblock; cuda_lowp on kernels "
               "of f16/bf16 values: lowp=f32 computes them in f32, lowp=per-op rounds each "
               "op's result as eager; cuda_math=bf16 on kernels of bf16 results only: "
               "cheaper 1 + erf and gelu): they dump, can be edited, and codegen-triton renders "
               "them")
def schedule_cuda(module: Module, *, lowp: str = LOWP_DEFAULT) -> Module:
    """The default schedule of every loop kernel, as its node's cuda_* attributes; a node that
    already has them (an edited dump) keeps them. A kernel the tables cannot express gets
    none (codegen-triton leaves it to the reference). `lowp`: the cuda_lowp mode written on
    kernels that hold f16/bf16 values (render.py)."""
    if lowp not in LOWP_MODES:
        raise TargetError(f"schedule-cuda: lowp={lowp!r} is not one of {', '.join(LOWP_MODES)}")
    out = module.clone()
    bodies = body_names(out)
    for g in out.graphs.values():
        if g.name in bodies:
            continue
        for n in g.nodes:
            ref = n.args[0] if n.args else None
            if n.op not in ("loop.pointwise", "loop.reduction") or not isinstance(ref, Ref):
                continue
            body = out.items.get(ref.name)
            if not isinstance(body, Graph):
                continue
            try:
                sched = render(ref.name, n, body, out.items).schedule
            except CodegenError:
                continue
            kw: dict[str, Arg] = {"cuda_xblock": sched["XBLOCK"],
                                  "cuda_warps": sched["num_warps"]}
            if has_lowp_values(n, body, out.items):
                kw["cuda_lowp"] = lowp
                if lowp == "f32" and bf16_results(n):  # bf16 stores only: cheaper 1 + erf
                    kw["cuda_math"] = "bf16"
            if "persistent" in sched:  # a rows kernel
                kw["cuda_persistent"] = sched["persistent"]
                if not sched["persistent"]:
                    kw["cuda_rblock"] = RMAX // 4
            for k, v in kw.items():
                n.kwargs.setdefault(k, v)
    return out


# ---- the loader ------------------------------------------------------------------------------

_LOADED: dict[str, Any] = {}  # source digest -> its module's launch function
# (source digest, warmup arguments, device) -> the bound launch past the JIT (launcher.py)
_BOUND: dict[tuple[Any, ...], Any] = {}
_LOG = logging.getLogger("ember.kernels")  # the runtime's `kernels` log channel
_CANON: dict[str, str] = {}  # canonical digest (_canonical) -> the first such block's digest
_REPORTS: dict[int, tuple[weakref.ref[Module], LoadReport]] = {}  # id(module) -> its last load


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _on_cpu(m: Module) -> set[str]:
    """The kernels that a call runs on cpu tensors (one pass over the module)."""
    return {n.args[0].name for g in m.graphs.values() for n in g.nodes
            if n.op == "kernels.call" and isinstance(n.args[0], Ref)
            and device_kind(str(n.kwargs.get("device", "cpu"))) == "cpu"}


def _module_dir() -> Path:
    from ember.inductor.targets.cpu.cache import cache_dir
    d = cache_dir() / "triton"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _write(source: str, digest: str) -> Path:
    path = _module_dir() / f"k_{digest}.py"
    try:
        if path.read_text() == source:
            return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or this one
    return path


def _signatures(m: Module) -> dict[str, tuple[tuple[Any, ...], int] | str]:
    """Per kernel, the warmup arguments of its calls (torch dtypes of its buffers, then one int
    per size argument) and their cuda device index; or why it has none (no call, calls on cpu
    or with different types: those keep the JIT path)."""
    out: dict[str, tuple[tuple[Any, ...], int] | str] = {}
    for g in m.graphs.values():
        for n in g.nodes:
            if n.op != "kernels.call" or not isinstance(n.args[0], Ref):
                continue
            dev = str(n.kwargs.get("device", "cpu"))
            types = [a.type for a in n.args[1:] if isinstance(a, Value)] + \
                [r.type for r in n.results]
            sizes = n.kwargs.get("sizes")
            sig: tuple[tuple[Any, ...], int] | str
            if device_kind(dev) != "cuda":
                sig = f"a call on {dev}"
            elif len(types) != len(n.args) - 1 + len(n.results) or \
                    not all(isinstance(t, TensorType) for t in types):
                sig = "a call with a non-tensor argument"
            else:
                idx = dev.partition(":")[2]
                sig = (tuple(t.dtype.torch for t in types)  # type: ignore[union-attr]
                       + (2,) * (len(sizes) if isinstance(sizes, list) else 0),
                       int(idx) if idx.isdigit() else -1)
            have = out.setdefault(n.args[0].name, sig)
            if have != sig:
                out[n.args[0].name] = "calls with different types or devices"
    return out


def load_triton(m: Module, blocks: list[Kernel]) -> dict[str, LoadedKernel]:
    """The `triton` loader: kernel name -> its launch(in..., out...) (ABI "tensor"): on cuda
    the block's bound launch past Triton's JIT, its kernel compiled here (launcher.py; the
    module's kernels in parallel), else its `launch()`."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise LoadError(f"triton kernels need the triton package ({e})") from None
    table: dict[str, LoadedKernel] = {}
    on_cpu = _on_cpu(m) if not _interpreting() else set()
    report = LoadReport()
    why_not = unavailable(_interpreting())
    sigs = _signatures(m) if why_not is None else {}
    jobs: dict[tuple[Any, ...], Job] = {}  # one compile per (module, arguments, device)
    waiting: dict[tuple[Any, ...], list[str]] = {}
    for k in blocks:
        if k.name in on_cpu:
            raise LoadError(f"kernel @{k.name}: triton kernels run on cpu tensors only in "
                            f"Triton's interpreter (set TRITON_INTERPRET=1 before starting)")
        digest = hashlib.sha256(f"{_interpreting()}\0{k.source}".encode()).hexdigest()[:32]
        # a kernel equal to one loaded before but for its names (a repeated block's) takes
        # that one's module: one import, one compile
        canon = _CANON.setdefault(_canonical(k.source), digest)
        if canon != digest and canon in _LOADED:
            digest = canon
            report.shared += 1
        fn = _import(k, digest)
        sig = sigs.get(k.name, why_not or "no call of it")
        mod = sys.modules.get(f"ember_triton_{digest}")
        if isinstance(sig, str) or mod is None or not callable(getattr(mod, "bind", None)):
            report.kernels[k.name] = KernelLoad(False, sig if isinstance(sig, str)
                                                else "its block has no bind()")
        else:
            args, dev = sig
            dev = torch.cuda.current_device() if dev < 0 else dev
            key = (digest, args, dev)
            bound = _BOUND.get(key)
            if bound is not None:
                fn = bound
                report.kernels[k.name] = KernelLoad(True, "", 0.0)
            else:
                jobs.setdefault(key, Job(k.name, mod, args, dev, len(args)))
                waiting.setdefault(key, []).append(k.name)
        table[k.name] = LoadedKernel(fn, "tensor")
    done = compile_and_bind(list(jobs.values()), report)
    for key, job in jobs.items():
        fast = done.get(job.name)
        if fast is not None:
            _BOUND[key] = fast
        first = report.kernels[job.name]
        for name in waiting[key]:
            if fast is not None:
                table[name] = LoadedKernel(fast, "tensor")
            if name != job.name:  # compiled once: its time counted once
                report.kernels[name] = KernelLoad(first.fast, first.why, 0.0)
    if _LOG.isEnabledFor(logging.INFO) and report.kernels:
        su = report.summary()
        _LOG.info("triton: %d kernel(s), %d sharing an equal kernel's module; %d launch past "
                  "Triton's JIT; compiled in %.2f s (wall, %d worker(s))%s", su["kernels"],
                  su["shared"], su["fast"], su["compile_wall_s"], su["workers"],
                  f"; the JIT: {'; '.join(su['not_fast'])}" if su["not_fast"] else "")
    for dead in [i for i, (ref, _) in _REPORTS.items() if ref() is None]:
        del _REPORTS[dead]
    _REPORTS[id(m)] = (weakref.ref(m), report)
    return table


_LOCAL = re.compile(r"\bv\d+_\w+")  # render.py's value locals: v<render>_<IR value name>
_SYMBOL = re.compile(r"\bember_k_\w+")  # the kernel's symbol (sanitize.kernel_symbol)


def _canonical(source: str) -> str:
    """The block's source without what only names it: comment lines (IR names, locations)
    dropped, the kernel symbol and value locals renamed in order of first use (a consistent
    renaming: blocks with equal canonical text compute the same)."""
    names: dict[str, str] = {}
    text = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    text = _LOCAL.sub(lambda mt: names.setdefault(mt.group(0), f"t{len(names)}"), text)
    text = _SYMBOL.sub("KSYM", text)
    return hashlib.sha256(f"{_interpreting()}\0{text}".encode()).hexdigest()


def load_report(m: Module) -> LoadReport | None:
    """How the module's Triton kernels were loaded (its last load in this process): which
    launch past the JIT, and the compile time."""
    got = _REPORTS.get(id(m))
    return got[1] if got is not None and got[0]() is m else None


def _import(k: Kernel, digest: str) -> Any:
    """The block's launch() (its module imported once per source)."""
    source = k.source
    if _interpreting() and GPU_LIBDEVICE in source:
        # a GPU-form block under Triton's interpreter (the JIT's fallback launch, in tests):
        # its libdevice calls (fast_expf, fast_dividef, ...) on numpy, as an interpreted block's
        source = source.replace(GPU_LIBDEVICE, INTERP_LIBDEVICE, 1)
    fn = _LOADED.get(digest)
    if fn is None:
        path = _write(source, digest)
        modname = f"ember_triton_{digest}"
        spec = importlib.util.spec_from_file_location(modname, path)
        if spec is None or spec.loader is None:
            raise LoadError(f"kernel @{k.name}: cannot import {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod  # triton.jit looks its function's module up
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            sys.modules.pop(modname, None)
            raise LoadError(f"kernel @{k.name}: {type(e).__name__}: {e}") from None
        fn = getattr(mod, "launch", None)
        if not callable(fn):
            raise LoadError(f"kernel @{k.name}: its source defines no launch()")
        _LOADED[digest] = fn
    return fn


__all__ = ["LANG", "codegen_triton", "load_report", "load_triton", "schedule_cuda"]
