"""torch operators as IR ops: `aten.add.Tensor`, `mylib.foo.default`, ...

Types come from the operator's meta kernel at concrete sizes (symbols at their hints); the
reference calls the operator itself. Arguments are converted by the operator's schema: a DType
literal becomes a torch dtype, and a string becomes a device, layout or memory format where the
schema asks for one (`device="cuda:0"`, `layout="strided"`, `memory_format="channels_last"`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from ember.ir.dtypes import DType
from ember.ir.effects import classify, effects_allowed, guard_reference, refusal
from ember.ir.expr import ExprEvalError, evaluate
from ember.ir.graph import Arg, Ref, Value
from ember.ir.registry import InferContext, OpDef, OpTypeError
from ember.ir.types import BOOL, F64, I64, ScalarKind, TensorType, Type, device_text

# Torch operators whose results are new storage on every call: their records say
# aliasing="fresh" (registry.py). The others say "alias": a schema without alias annotations
# does not promise fresh results (einsum("ij->ji") and type_as return their operand's storage,
# _unsafe_view a view of it), and ember cannot see what a kernel returns.
FRESH_TORCH_OPS = frozenset({
    # the fused CPU attention kernel (the CPU target's attention choice) allocates both results
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    # the convolution gradients of training (ember.autograd's VJP rule)
    "aten.convolution_backward.default",
})


def resolve(name: str) -> torch._ops.OpOverload | None:
    """The torch OpOverload called `ns.op.overload`, or None."""
    parts = name.split(".")
    if len(parts) != 3:
        return None
    ns, op, overload = parts
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        ov = getattr(packet, overload)
    except Exception:  # torch raises AttributeError or RuntimeError for unknown names
        return None
    return ov if isinstance(ov, torch._ops.OpOverload) else None


def torch_opdef(name: str) -> OpDef | None:
    op = resolve(name)
    if op is None:
        return None
    schema = str(op._schema)
    effect = classify(op)
    if effect is not None:
        return _effect_opdef(name, op, effect)
    return OpDef(
        name=name,
        summary=schema,
        infer=lambda ctx, args, kwargs: infer_torch(op, ctx, args, kwargs),
        reference=lambda interp, args, kwargs: _as_declared(op, args, kwargs,
                                                            call_torch(op, args, kwargs)),
        has_side_effects=bool(op._schema.is_mutable),
        nondeterministic=torch.Tag.nondeterministic_seeded in op.tags,
        torch_op=op,
        aliasing="fresh" if name in FRESH_TORCH_OPS else "alias",
    )


def _effect_opdef(name: str, op: torch._ops.OpOverload, effect: str) -> OpDef:
    """An op that acts outside the graph (see effects.py). Typing it never calls torch: its
    meta kernel may be its real kernel (from_file's opens the file); the verifier takes the
    declared types when effects are allowed. Its reference runs only when they are allowed,
    whichever way it is reached (a node, kernels.extern, a loop body)."""

    def infer(ctx: InferContext, args: Sequence[Arg], kwargs: Mapping[str, Arg]) -> list[Type]:
        raise OpTypeError(refusal(name, effect) if not effects_allowed() else
                          f"{name} {effect}: ember never runs its kernels to find its types, so "
                          f"it can only be called directly, with its result types declared")

    reference = guard_reference(name, effect,
                                lambda interp, args, kwargs: call_torch(op, args, kwargs))
    return OpDef(name=name, summary=str(op._schema), infer=infer, reference=reference,
                 has_side_effects=True,
                 nondeterministic=torch.Tag.nondeterministic_seeded in op.tags,
                 torch_op=op, effect=effect,
                 aliasing="fresh" if name in FRESH_TORCH_OPS else "alias")


@functools.cache
def _schema_kinds(op: torch._ops.OpOverload) -> tuple[list[str], dict[str, str]]:
    """Each argument's schema type, positional and by name (cached: the interpreter asks on
    every call)."""
    pos: list[str] = []
    kw: dict[str, str] = {}
    for a in op._schema.arguments:
        kind = str(a.real_type)
        kw[a.name] = kind
        if not a.kwarg_only:
            pos.append(kind)
    return pos, kw


def _convert(v: Any, kind: str) -> Any:
    if isinstance(v, list):
        return [_convert(x, kind) for x in v]
    if isinstance(v, DType):
        return v.torch
    if isinstance(v, str):
        if "Device" in kind:
            return torch.device(v)
        if "Layout" in kind or "MemoryFormat" in kind:
            attr = getattr(torch, v, None)
            if not isinstance(attr, (torch.layout, torch.memory_format)):
                raise OpTypeError(f"{v!r} is not a torch layout or memory format")
            return attr
    return v


def convert_args(op: torch._ops.OpOverload, args: Sequence[Any],
                 kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Turn IR literals into what the torch operator's schema expects."""
    pos, kw = _schema_kinds(op)
    cargs = [_convert(a, pos[i] if i < len(pos) else "") for i, a in enumerate(args)]
    ckw = {k: _convert(v, kw.get(k, "")) for k, v in kwargs.items()}
    return cargs, ckw


def call_torch(op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any]) -> Any:
    cargs, ckw = convert_args(op, args, kwargs)
    return op(*cargs, **ckw)


def meta_tensor(t: TensorType, hints: Mapping[str, int]) -> torch.Tensor:
    shape = t.concrete_shape(hints)
    if t.strides is not None:
        strides = tuple(evaluate(s, hints) for s in t.strides)
        return torch.empty_strided(shape, strides, dtype=t.dtype.torch, device="meta")
    return torch.empty(shape, dtype=t.dtype.torch, device="meta")


# Scalar inputs have no value at type-inference time; the verifier checks only dtype and
# rank of results of ops that take scalar values, since their shapes may depend on them.
_DUMMY = {ScalarKind.i64: 1, ScalarKind.f64: 1.0, ScalarKind.bool: True}


def infer_torch(op: torch._ops.OpOverload, ctx: InferContext, args: Sequence[Arg],
                kwargs: Mapping[str, Arg]) -> list[Type]:
    """Result types from the meta kernel, at the symbols' hints, on the first tensor's device."""
    devices: list[str] = []

    def bind(a: Arg) -> Any:
        if isinstance(a, Value):
            if isinstance(a.type, TensorType):
                devices.append(a.type.device)
                return meta_tensor(a.type, ctx.hints)
            return _DUMMY[a.type.kind]
        if isinstance(a, list):
            return [bind(x) for x in a]
        if isinstance(a, Ref):
            raise OpTypeError(f"@{a.name} cannot be an argument of a torch operator")
        if isinstance(a, sympy.Expr):
            return evaluate(a, ctx.hints)
        return a

    try:
        margs = [bind(a) for a in args]
        mkwargs = {k: bind(v) for k, v in kwargs.items()}
        # The meta kernel runs on meta tensors: a device argument must say "meta" too (the
        # result's device is taken from the argument below).
        pos, kinds = _schema_kinds(op)
        margs = [_meta_device(a, pos[i] if i < len(pos) else "") for i, a in enumerate(margs)]
        mkwargs = {k: _meta_device(v, kinds.get(k, "")) for k, v in mkwargs.items()}
        if not devices:
            _factory_on_meta(op, margs, mkwargs)
        try:
            out = call_torch(op, margs, mkwargs)
        except Exception:
            standin = _META_STANDINS.get(op)
            if standin is None:
                raise
            out = call_torch(standin[0], margs[:standin[1]], {})
    except OpTypeError:
        raise
    except ExprEvalError as e:
        hint = " (declare a hint for it)" if "is not bound" in str(e) else ""
        raise OpTypeError(f"{ir_name(op)}: {e}{hint}") from None
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OpTypeError(f"{ir_name(op)}: its meta kernel rejected the arguments: {msg}") \
            from None
    device = _device_arg(op, args, kwargs)
    dev = device if device is not None else (devices[0] if devices else "cpu")
    types = _flatten_result(out, dev, ir_name(op))
    if op is torch.ops.aten.native_batch_norm.default and dev == "cpu" and \
            len(args) > 5 and args[5] is False and len(types) == 3:
        # the CPU kernel returns empty save_mean/save_invstd in eval mode, its meta kernel [C];
        # capture records the real kernel's types (fake tensors report them faithfully)
        types = [types[0], *(TensorType(t.dtype, (0,), None, dev) for t in types[1:]
                             if isinstance(t, TensorType))]
    return types


# Ops whose meta kernel some torch versions lack for some arguments, typed by another op with
# the same results from their leading arguments: torch 2.11's aten._convolution on meta
# tensors reached convolution_overrideable for the op database's samples on the H200
# (2026-12-03); its last four arguments (benchmark, deterministic, cudnn, tf32) never change
# the result's type.
_META_STANDINS: dict[Any, tuple[Any, int]] = {
    torch.ops.aten._convolution.default: (torch.ops.aten.convolution.default, 9)}


def _meta_device(v: Any, kind: str) -> Any:
    return "meta" if "Device" in kind and isinstance(v, str) else v


def _factory_on_meta(op: torch._ops.OpOverload, margs: list[Any], mkwargs: dict[str, Any]
                     ) -> None:
    """An op with no tensor argument (a factory: `aten.ones`, `aten.arange`) whose device is
    left out or `none` would run its real CPU kernel, allocating the whole tensor, just to be
    typed: point its device argument at "meta" instead."""
    i = 0
    for a in op._schema.arguments:
        positional = not a.kwarg_only and i < len(margs)
        if "Device" in str(a.real_type):
            if positional and margs[i] is None:
                margs[i] = "meta"
            elif not positional and mkwargs.get(a.name) is None:
                mkwargs[a.name] = "meta"
        if not a.kwarg_only:
            i += 1


def _device_arg(op: torch._ops.OpOverload, args: Sequence[Arg], kwargs: Mapping[str, Arg]
                ) -> str | None:
    """The device an op's device argument names (positional or keyword), normalized."""
    pos, kinds = _schema_kinds(op)
    for i, a in enumerate(args):
        if i < len(pos) and "Device" in pos[i] and isinstance(a, str):
            return _known_device(op, a)
    for k, v in kwargs.items():
        if "Device" in kinds.get(k, "") and isinstance(v, str):
            return _known_device(op, v)
    return None


def _known_device(op: torch._ops.OpOverload, text: str) -> str:
    try:
        return device_text(text)
    except (RuntimeError, ValueError):  # torch's words for a device string it cannot read
        raise OpTypeError(f"{ir_name(op)}: unknown device {text!r}") from None


def ir_name(op: torch._ops.OpOverload) -> str:
    """The IR name of an ATen overload, `aten.add.Tensor` (the inverse of `resolve`)."""
    return f"{op._schema.name.replace('::', '.')}.{op._overloadname or 'default'}"


def _as_declared(op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any],
                 out: Any) -> Any:
    """A real kernel's tuple as the node declares it: the meta kernel's non-None results
    (infer_torch). The two can disagree on which results are undefined, and by torch version:
    torch 2.11's cuDNN attention returns no logsumexp without compute_log_sumexp where its meta
    kernel returns one (5 results against 6 declared). A result the meta kernel has and the
    real one left undefined is zeros of the declared type (nothing reads it: the flag that
    would compute it is off); one only the real kernel returns is dropped. Only tuples with a
    None pay for the meta call, once per signature (the arguments' shapes, strides, dtypes and
    other values, and which results came back undefined): its answer is kept as a plan. Run on
    every call it was paid by every cuDNN attention call of a compiled transformer (each
    layer, every call): 63 us of host CPU against 11 us with the plan, on the CPU machine."""
    if not isinstance(out, tuple) or not any(o is None for o in out):
        return out
    try:
        key: Any = (op, tuple(o is None for o in out), tuple(_signature(a) for a in args),
                    tuple(sorted((k, _signature(v)) for k, v in kwargs.items())))
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable argument: no plan kept
        key, plan = None, None
    if plan is None:
        plan = _declared_plan(op, args, kwargs, out)
        if key is not None:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    if plan is _NO_NONES:
        return _no_nones(out)
    device = next((a.device for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)),
                  None)
    fixed = [out[i] if zeros is None or out[i] is not None else
             torch.zeros(zeros[0], dtype=zeros[1], device=device or "cpu")
             for i, zeros in plan]
    return fixed[0] if len(fixed) == 1 else tuple(fixed)


# per signature (_as_declared's key): for each declared result, the real result it is and the
# shape and dtype of its zeros where the real kernel leaves it undefined; or _NO_NONES
_DeclaredPlan = list[tuple[int, tuple[tuple[int, ...], torch.dtype] | None]]
_NO_NONES: _DeclaredPlan = []
_PLANS: dict[Any, _DeclaredPlan] = {}
_MAX_PLANS = 1024


def _signature(a: Any) -> Any:
    """What the meta kernel's answer depends on, hashable: a tensor's layout (not its device:
    the zeros go to the call's), else the value."""
    if isinstance(a, torch.Tensor):
        return (a.shape, a.stride(), a.dtype)
    if isinstance(a, (list, tuple)):
        return tuple(_signature(x) for x in a)
    return a


def _declared_plan(op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any],
                   out: tuple[Any, ...]) -> _DeclaredPlan:
    """_as_declared's plan for these arguments, from the meta kernel."""
    try:
        cargs, ckw = convert_args(op, args, kwargs)
        pos, kinds = _schema_kinds(op)
        margs = [_meta_device(_to_meta(a), pos[i] if i < len(pos) else "")
                 for i, a in enumerate(cargs)]
        mkw = {k: _meta_device(_to_meta(v), kinds.get(k, "")) for k, v in ckw.items()}
        meta = op(*margs, **mkw)
    except Exception:  # no meta kernel for these arguments: keep the real kernel's results
        return _NO_NONES
    if not isinstance(meta, tuple) or len(meta) != len(out):
        return _NO_NONES
    return [(i, (tuple(m.shape), m.dtype) if isinstance(m, torch.Tensor) else None)
            for i, m in enumerate(meta) if m is not None]


def _to_meta(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, list):
        return [_to_meta(x) for x in a]
    return a


def _no_nones(out: Any) -> Any:
    """A tuple result without its None entries (the results an output mask turned off, as in
    `aten.convolution_backward`'s): its types have none either (`_flatten_result`)."""
    if isinstance(out, tuple) and any(o is None for o in out):
        kept = tuple(o for o in out if o is not None)
        return kept[0] if len(kept) == 1 else kept
    return out


def _flatten_result(out: Any, device: str, name: str) -> list[Type]:
    if isinstance(out, torch.Tensor):
        # ir-v1 types are dense tensors: a sparse result (its unchecked indices crash the ops
        # that read it) or any other layout has no type, so no later op can be handed one
        if out.layout != torch.strided:
            raise OpTypeError(f"{name}: result of layout {out.layout} has no ir-v1 type "
                              f"(ir-v1 tensors are dense)")
        return [TensorType(DType.from_torch(out.dtype), tuple(out.shape), None, device)]
    if isinstance(out, (list, tuple)):
        res: list[Type] = []
        for o in out:
            res += _flatten_result(o, device, name)
        return res
    if out is None:
        return []
    if isinstance(out, bool):
        return [BOOL]
    if isinstance(out, int):
        return [I64]
    if isinstance(out, float):
        return [F64]
    raise OpTypeError(f"{name}: result of kind {type(out).__name__} has no ir-v1 type")
