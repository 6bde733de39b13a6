"""How many kernels the CUDA target makes of a model, without a GPU (issue 16).

Captures each model on the CPU (bf16, random weights, as benchmarks/gpu_cuda_suite.py builds
them), moves the captured graph's tensors to cuda:0 in the IR, and runs the CUDA target's
pipeline (`FRONT`, then `inductor-cuda` up to `schedule-cuda`): the loop kernels left are the
Triton kernels `codegen-triton` renders, one each. Prints per model the count of Triton kernels
and externs (matmul, convolution, attention, index_select, ...; views excluded) and, with
--kernels, one line per kernel: its domain, its schedule and the ops fused into it. With
--cpu the same graph (on cpu) also goes through the CPU target's `inductor` pipeline, for
comparison.

    python3 benchmarks/cuda_kernel_census.py --models hf/gpt2,timm/deit_tiny_patch16_224 --kernels

`--decode-gemv group|nogroup` adds decode-gemv before lower-loops, as compile() does under
mode="reduce-overhead" (with or without its grouping of the GEMVs and their epilogues).

`--decode N` takes instead the decode step of the dolly-v2-3b-shaped GPT-NeoX of
generate_gpu.py with N layers (bf16, static cache; issue 20): a greedy generate() of 3 tokens
runs eagerly, its last decode step is captured, and the runtime's backend module of it (its
`replaced_inputs`: the caches the CUDA target writes in place) goes through the pipeline. With
--kernels every kernel and extern is listed in launch order with the bytes its operands and
results span (an upper bound of what it moves: a gather reads a row, not its table).

Capture on the CPU records the CPU's form of a few ops (scaled dot-product attention's CPU
kernel); the device records its CUDA form. The retyping rewrites the CPU attention node into the
form sdpa dispatches to on the GPU (targets/cuda/attention.py, cuda_form_of_cpu_attention):
without a mask the flash kernel's `_scaled_dot_product_flash_attention`, with one the
memory-efficient kernel's `_scaled_dot_product_efficient_attention` on the mask expanded to
[B, H, L, S] (as sdpa expands it), which the CUDA front end keeps whole as one extern. --cpu-attention leaves the CPU form,
which the CUDA front end decomposes (GEMMs + a softmax kernel: the count before attention
became an extern). On a GPU machine --on-device captures on cuda:0 instead (no
retyping, no rewrite) and names the attention ops the capture recorded: whether the model's
sdpa reached the CUDA target as one of the kept forms.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

MODELS = ("timm/deit_tiny_patch16_224", "hf/vit", "hf/gpt2", "hf/bert", "hf/llama")
KERNELS = ("loop.pointwise", "loop.reduction")
VIEWS = ("prims.reshape", "loop.view")


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import zoo_models
    by = {m.name: m for m in zoo_models.ZOO}
    if name not in by:
        raise SystemExit(f"cuda_kernel_census: no model {name!r} in benchmarks/zoo_models.py")
    model, args = by[name].build(zoo_models.FULL)
    model = model.eval().to(torch.bfloat16)
    return model, tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in args)


def to_cuda(module: Any) -> Any:
    """The module with every tensor of its graphs on cuda:0 (the IR only: no data moves)."""
    from ember.ir import TensorType
    for g in module.graphs.values():
        for v in [*g.params, *(r for n in g.nodes for r in n.results)]:
            if isinstance(v.type, TensorType):
                v.type = dataclasses.replace(v.type, device="cuda:0")
        for n in g.nodes:
            if n.kwargs.get("device") == "cpu":
                n.kwargs["device"] = "cuda:0"
        g.result_types = [o.type for o in g.outputs]
    return module


def body_ops(m: Any, body: Any, ops: collections.Counter[str]) -> None:
    """The computing ops of a kernel body, also those of the reductions it holds."""
    from ember.ir import Ref
    for n in body.nodes:
        if n.op == "loop.reduce":
            ops[f"reduce:{n.kwargs.get('reduction')}"] += 1
            sub = m.items.get(n.args[0].name) if isinstance(n.args[0], Ref) else None
            if sub is not None:
                body_ops(m, sub, ops)
        elif n.op != "loop.load":
            ops[n.op.split(".", 1)[-1]] += 1


def kernel_line(m: Any, n: Any) -> str:
    from ember.ir import Ref
    body = m.items[n.args[0].name] if isinstance(n.args[0], Ref) else None
    ops: collections.Counter[str] = collections.Counter()
    if body is not None:
        body_ops(m, body, ops)
    sched = ",".join(f"{k[5:]}={v}" for k, v in n.kwargs.items() if k.startswith("cuda_"))
    outs = ",".join(f"%{r.name}" for r in n.results)
    reads = sum(1 for a in n.args[1:] if hasattr(a, "type"))
    text = " ".join(f"{op}x{c}" if c > 1 else op for op, c in sorted(ops.items()))
    return (f"  {outs} = {n.op.split('.')[1]} {n.kwargs.get('ranges')} "
            f"[{sched}] reads {reads}: {text}")


def nbytes(v: Any) -> int:
    from ember.ir import TensorType
    t = getattr(v, "type", None)
    if not isinstance(t, TensorType) or not all(isinstance(d, int) for d in t.shape):
        return 0
    n = 1
    for d in t.shape:
        n *= int(d)
    return n * t.dtype.itemsize


def moved(n: Any) -> str:
    """The bytes a kernel or extern node's tensor operands and results span."""
    r = sum(nbytes(a) for a in n.args if hasattr(a, "type"))
    w = sum(nbytes(x) for x in n.results)
    return f"reads {r / 1e3:10.1f} kB, writes {w / 1e3:8.1f} kB"


def extern_line(n: Any) -> str:
    outs = ",".join(f"%{r.name}" for r in n.results)
    shapes = " ".join(str(list(a.type.shape)) for a in n.args if hasattr(a, "type")
                      and hasattr(a.type, "shape"))
    return f"  {outs} = extern {n.kwargs.get('op')} on {shapes}"


def decode_step(layers: int, on_device: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(forward, args, kwargs) of a decode step of the dolly-shaped model (generate_gpu.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generate_gpu import build_model, generate
    model = build_model(layers, "cuda" if on_device else "cpu")
    ids = torch.randint(2, 50000, (1, 8), generator=torch.Generator().manual_seed(1))
    steps: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    real = model.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        steps.append((args, dict(kwargs)))
        return real(*args, **kwargs)
    model.forward = spy
    generate(model, ids.to(next(model.parameters()).device), 3, "static")
    del model.forward
    args, kwargs = steps[-1]
    cache = kwargs.get("past_key_values", kwargs.get("cache"))  # (the name by version)
    for layer in cache.layers:  # the last step again: its slot, not one past the end
        layer.cumulative_length.sub_(1)
    return model.forward, args, kwargs


def census(module: Any, pipeline: str) -> tuple[Any, list[Any], list[Any]]:
    from ember.inductor.targets import top_graphs
    from ember.ir.passes import run_pipeline
    out = run_pipeline(module, pipeline)
    nodes = [n for g in top_graphs(out) for n in g.nodes]
    kernels = [n for n in nodes if n.op in KERNELS]
    externs = [n for n in nodes if n.op == "loop.extern" and n.kwargs.get("op") not in VIEWS]
    return out, kernels, externs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--kernels", action="store_true", help="one line per kernel")
    ap.add_argument("--cpu", action="store_true", help="also the CPU target's kernel count")
    ap.add_argument("--cpu-attention", action="store_true", help="leave attention in the CPU "
                    "form (decomposed by the CUDA front end) instead of the CUDA form")
    ap.add_argument("--on-device", action="store_true", help="capture on cuda:0 (a GPU machine): "
                    "the graph holds the CUDA attention form sdpa really dispatched to; each "
                    "model's line also names its attention ops as captured")
    ap.add_argument("--decode", type=int, default=0, help="N: the decode step of the "
                    "dolly-shaped GPT-NeoX with N layers (static cache) instead of --models")
    ap.add_argument("--decode-gemv", default="", choices=["", "group", "nogroup"],
                    help="add decode-gemv before lower-loops as mode='reduce-overhead' does "
                    "(group: one-row GEMVs with their epilogues two to a launch; nogroup: one "
                    "GEMV per launch)")
    ap.add_argument("--dump", default="", help="a directory: each model's scheduled loop IR")
    ap.add_argument("--passes", default="", help="the CUDA passes after the front end, in place "
                    "of inductor-cuda's up to schedule-cuda (e.g. the pipeline before "
                    "matmul-lowp and fuse-shared: lower-loops,fuse,schedule-cuda)")
    a = ap.parse_args()
    import ember.inductor  # noqa: F401
    from ember.capture import capture
    from ember.inductor.targets import top_graphs
    from ember.inductor.targets.cpu import FRONT as CPU_FRONT
    from ember.inductor.targets.cpu import INDUCTOR_CPU
    from ember.inductor.targets.cuda import FRONT, register_cuda_target
    register_cuda_target()
    cuda_pl = f"{FRONT},{a.passes or cuda_pipeline_upto_schedule()}"
    if a.decode_gemv:
        cuda_pl = cuda_pl.replace(
            "lower-loops", f"decode-gemv{{group={str(a.decode_gemv == 'group').lower()}}},"
            "lower-loops", 1)
    for name in [f"dolly-decode-{a.decode}-layers"] if a.decode else a.models.split(","):
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {}
        if a.decode:
            model, args, kwargs = decode_step(a.decode, a.on_device)
        else:
            try:
                model, args = build(name)
            except ImportError as e:  # timm is not installed everywhere (this CPU machine)
                print(f"{name}: skipped ({e})")
                continue
            if a.on_device:
                model = model.to("cuda:0")
                args = tuple(x.to("cuda:0") for x in args)
        with torch.no_grad():
            c = capture(model, args, kwargs)
        module = getattr(c, "module", None)
        if module is None:
            print(f"{name}: not captured whole ({type(c).__name__})")
            continue
        if a.decode:
            from ember.runtime.writeback import backend_module
            module = backend_module(c)  # as compile() hands it to the backend
        cpu_module = module.clone()
        captured = sorted({n.op for g in module.graphs.values() for n in g.nodes
                           if "attention" in n.op})
        on_cuda = module if a.on_device else to_cuda(module)
        if not a.cpu_attention and not a.on_device:
            from ember.inductor.targets.cuda.attention import cuda_form_of_cpu_attention
            on_cuda = cuda_form_of_cpu_attention(on_cuda)
        out, kernels, externs = census(on_cuda, cuda_pl)
        ex = collections.Counter(str(n.kwargs.get("op")) for n in externs)
        line = (f"{name}: cuda {len(kernels)} Triton kernels, {len(externs)} externs "
                f"({', '.join(f'{k} {v}' for k, v in ex.most_common())})")
        if a.on_device:
            line += f"; captured attention ops: {', '.join(captured) or 'none'}"
        if a.cpu and not a.on_device:
            cpl = f"{CPU_FRONT},{INDUCTOR_CPU.replace(',codegen-cpp,plan-buffers', '')}"
            _, ck, cx = census(cpu_module, cpl)
            line += f"; cpu {len(ck)} C++ kernels, {len(cx)} externs"
        print(f"{line}  [{time.perf_counter() - t0:.1f} s]", flush=True)
        if a.kernels:
            listed = {id(n) for n in [*kernels, *externs]}
            for g in top_graphs(out):
                for n in g.nodes:
                    if id(n) in listed:
                        line = kernel_line(out, n) if n.op in KERNELS else extern_line(n)
                        print(f"{line[:150]:150s} {moved(n)}" if a.decode else line)
        if a.dump:
            Path(a.dump).mkdir(parents=True, exist_ok=True)
            (Path(a.dump) / f"{name.replace('/', '_')}.ir").write_text(str(out))
    return 0


def cuda_pipeline_upto_schedule() -> str:
    """The registered inductor-cuda pipeline's passes up to and including schedule-cuda."""
    from ember.ir.passes import default_pass_registry
    text = default_pass_registry().pipelines()["inductor-cuda"].text
    passes = re.split(r",(?![^{]*})", text)  # commas outside a pass's {options}
    passes = [p.strip() for p in passes]
    end = next(i for i, p in enumerate(passes) if p.startswith("schedule-cuda"))
    return ",".join(passes[:end + 1])


if __name__ == "__main__":
    raise SystemExit(main())
