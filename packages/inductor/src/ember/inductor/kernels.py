"""The `kernels` dialect: a compiled module's graph of buffers, kernel calls and externs.

    %y = kernels.call(@f_k0, %x, %b, out_dtypes=[f32], out_shapes=[[4, 8]]) : f32[4, 8]{8, 1}

runs kernel block `@f_k0` (`kernel @f_k0 cpp` block, built by the loader of its language,
launch.py) on buffers with row-major strides (inputs are made contiguous before the call,
outputs allocated on the call's device). A kernel over symbolic sizes also takes the values of
`sizes=[s0, ...]` (symbols bound from the graph's inputs) after its buffers. Its declared ABI, checked by the type rule: every
tensor operand is on `device=` (default "cpu", printed only otherwise), the kernel's language has
a loader for that device kind, and `launch=[ints]` (grid sizes) appears only where that loader
takes launch attributes. `kernels.extern` calls an op's own implementation (matmul, sort, ...) on
buffers; `kernels.view` is a strided view of a buffer. Code generation (a target's pass, e.g. the
CPU target's `codegen-cpp`) writes these; the backend is backend.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from ember.inductor import launch
from ember.inductor.indexing import affine_view, parse_index, row_major_strides
from ember.ir import (
    Arg,
    DType,
    InferContext,
    Interpreter,
    Kernel,
    OpDef,
    OpRegistry,
    OpTypeError,
    Ref,
    TensorType,
    Type,
    Value,
)
from ember.ir.expr import as_sympy, simplify_dim
from ember.ir.types import device_text


def buffer_type(t: TensorType) -> TensorType:
    return TensorType(t.dtype, t.shape, tuple(row_major_strides(t.shape)), t.device)


def _call_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    if not args or not isinstance(args[0], Ref):
        raise OpTypeError("kernels.call takes @kernel as its first argument")
    k = ctx.module.items.get(args[0].name) if ctx.module is not None else None
    if ctx.module is not None and not isinstance(k, Kernel):
        raise OpTypeError(f"kernels.call: @{args[0].name} is not a kernel of this module")
    dts, shapes = kw.get("out_dtypes"), kw.get("out_shapes")
    if not isinstance(dts, list) or not isinstance(shapes, list) or len(dts) != len(shapes) \
            or not all(isinstance(d, DType) for d in dts) \
            or not all(isinstance(s, list) for s in shapes):
        raise OpTypeError("kernels.call needs out_dtypes=[dtype, ...] and out_shapes=[[...], ...]")
    device = _call_abi(k if isinstance(k, Kernel) else None, args, kw)
    sizes = kw.get("sizes")
    if sizes is not None and (not isinstance(sizes, list) or not all(
            isinstance(s, sympy.Expr) and s.is_Symbol for s in sizes)):
        raise OpTypeError("kernels.call: sizes= must be a list of size symbols")
    return [buffer_type(TensorType(d, tuple(s), None, device))
            for d, s in zip(dts, shapes, strict=True)]


def _call_abi(k: Kernel | None, args: Sequence[Arg], kw: Mapping[str, Arg]) -> str:
    """kernels.call's declared ABI (module docstring): its device, its operands' devices, the
    kernel language's loader and the launch attributes it takes. Returns the device."""
    dev = kw.get("device", "cpu")
    try:
        device = device_text(dev) if isinstance(dev, str) else None
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None:
        raise OpTypeError(f"kernels.call: device= must be a torch device string, got {dev!r}")
    for a in args[1:]:
        if not isinstance(a, Value) or not isinstance(a.type, TensorType):
            raise OpTypeError("kernels.call takes buffers (tensor values) after the kernel")
        if a.type.device != device:
            raise OpTypeError(f"kernels.call: %{a.name} is on {a.type.device}, the call runs "
                              f"on {device}")
    extra = kw.get("launch")
    if extra is not None and (not isinstance(extra, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in extra)):
        raise OpTypeError("kernels.call: launch= must be a list of positive integers")
    if k is not None:
        ld = launch.loaders().get(k.lang)
        if ld is None:
            raise OpTypeError(f"kernels.call: @{k.name} is a {k.lang!r} kernel and no loader is "
                              f"registered for {k.lang!r} (registered: "
                              f"{', '.join(sorted(launch.loaders())) or 'none'})")
        kind = device.split(":", 1)[0]
        if kind not in ld.devices:
            raise OpTypeError(f"kernels.call: {k.lang!r} kernels run on "
                              f"{', '.join(ld.devices)}, not {device}")
        if extra is not None and not ld.launch_attrs:
            raise OpTypeError(f"kernels.call: {k.lang!r} kernels take no launch= attributes")
    return device


def _call_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    ref = args[0]
    assert isinstance(ref, Ref)
    k = launch.kernel(launch.table_for(interp), ref.name)
    device = kw.get("device", "cpu")
    ins = [a.contiguous() for a in args[1:]]
    reuse = list(kw.get("reuse") or [])
    outs = [launch.out_buffer([int(x) for x in s], d.torch, device,
                              reuse[j] if j < len(reuse) else None)
            for j, (d, s) in enumerate(zip(kw["out_dtypes"], kw["out_shapes"], strict=True))]
    k.launch(ins, outs, [int(s) for s in kw.get("sizes") or []])
    return outs[0] if len(outs) == 1 else tuple(outs)


def _extern_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    name = kw.get("op")
    target = ctx.registry.lookup(name) if ctx.registry and isinstance(name, str) else None
    if target is None:
        raise OpTypeError(f"kernels.extern: op= must name a registered op, got {name!r}")
    # (reuse=[%dead]: plan-buffers' out= buffer for an op with an out form, not an attribute)
    if "reuse" in kw and not (isinstance(kw["reuse"], list) and all(
            isinstance(v, Value) and isinstance(v.type, TensorType) for v in kw["reuse"])):
        raise OpTypeError("kernels.extern: reuse= must be a list of buffers")
    types = target.infer(ctx, args, {k: v for k, v in kw.items() if k not in ("op", "reuse")})
    return [buffer_type(t) if isinstance(t, TensorType) else t for t in types]


# extern ops whose result is a view of their operand (kernels.view: no copy is made); a
# prims.reshape is one only of a buffer (contiguous): lowering emits it for nothing else, and
# torch's reshape of a strided graph input copies where no view exists
VIEW_EXTERNS = ("prims.permute", "loop.view", "prims.reshape")


def _view_infer(ctx: InferContext, args: Sequence[Arg], kw: Mapping[str, Arg]) -> list[Type]:
    name = kw.get("op")
    if name not in VIEW_EXTERNS or len(args) != 1 or not isinstance(args[0], Value) \
            or not isinstance(args[0].type, TensorType):
        raise OpTypeError(f"kernels.view: op= must be one of {', '.join(VIEW_EXTERNS)}, on "
                          f"one buffer")
    target = ctx.registry.lookup(name) if ctx.registry else None
    assert target is not None
    t = target.infer(ctx, args, {k: v for k, v in kw.items() if k != "op"})[0]
    assert isinstance(t, TensorType)
    src = row_major_strides(args[0].type.shape)  # of a buffer (graph inputs may differ)
    if name == "loop.view":
        aff = affine_view([parse_index(s) for s in kw["index"]], t.rank)  # type: ignore
        assert aff is not None
        strides = [simplify_dim(sum(as_sympy(c[k]) * as_sympy(s)
                                    for c, s in zip(aff[1], src, strict=True)))
                   for k in range(t.rank)]
        return [TensorType(t.dtype, t.shape, tuple(strides), t.device)]
    if name == "prims.reshape":
        return [TensorType(t.dtype, t.shape, tuple(row_major_strides(t.shape)), t.device)]
    dims = [int(d) for d in kw["dims"]]  # type: ignore[union-attr,arg-type]
    return [TensorType(t.dtype, t.shape, tuple(src[d] for d in dims), t.device)]


def _view_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["op"])
    assert target is not None
    return target.reference(interp, args, {k: v for k, v in kw.items() if k != "op"})


def _extern_run(interp: Interpreter, args: list[Any], kw: dict[str, Any]) -> Any:
    target = interp.registry.lookup(kw["op"])
    assert target is not None
    # (reuse=: the wrapper's out= buffer; here the op allocates its result, which is as good)
    out = target.reference(interp, args, {k: v for k, v in kw.items() if k not in ("op", "reuse")})
    if isinstance(out, (list, tuple)):
        return tuple(x.contiguous() if isinstance(x, torch.Tensor) else x for x in out)
    return out.contiguous() if isinstance(out, torch.Tensor) else out


# aliasing= (a trait, see ember.ir.registry): a kernel writes new buffers (a reused one is dead,
# never one it reads); an extern's results are its op's (plan-buffers asks that op's record).
KERNEL_OPS = (
    OpDef("kernels.call", "run a compiled kernel of the module on buffers; returns new buffers",
          _call_infer, _call_run, aliasing="fresh"),
    OpDef("kernels.extern", "call an op's own implementation on buffers (matmul, sort, ...)",
          _extern_infer, _extern_run, aliasing="alias"),
    OpDef("kernels.view", "a strided view of a buffer (op=\"prims.permute\", \"loop.view\" or "
          "\"prims.reshape\"), no copy",
          _view_infer, _view_run, aliasing="alias"),
)


def register_kernel_ops(registry: OpRegistry) -> None:
    registry.register_missing(KERNEL_OPS)


# Names that lived here before the split (kernels dialect / backend.py / targets/cpu/): kept
# importable, resolved on first use (importing them here would make an import cycle).
_MOVED = {
    "compile_module": "ember.inductor.backend", "compiled_runner": "ember.inductor.backend",
    "summary": "ember.inductor.backend", "register_backend": "ember.inductor.backend",
    "DEFAULT_PIPELINE": "ember.inductor.targets.cpu", "INDUCTOR_CPU": "ember.inductor.targets.cpu",
    "PRELUDE_NAME": "ember.inductor.targets.cpu.codegen",
    "module_source": "ember.inductor.targets.cpu.codegen",
    "module_units": "ember.inductor.targets.cpu.codegen",
    "codegen_cpp": "ember.inductor.targets.cpu.codegen",
    "load_module": "ember.inductor.launch",
}


def __getattr__(name: str) -> Any:
    import importlib
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
