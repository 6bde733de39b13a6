"""Operators called as objects: `torch.ops.ns.op(...)`, `torch.ops.ns.op.overload(...)` and the
function a `torch.library.custom_op` decorator returns.

Capture runs such a call like any torch function: on fake tensors under the recorder, where the
operator reaches the dispatch mode as itself (`zoo.gmm.default`), so a custom operator becomes
one opaque node, typed by its fake kernel, that every backend runs through torch (an extern call
in the inductor). A custom operator is refused, with a graph break naming it, when capture cannot
keep eager's meaning: no fake kernel (its types are unknown), a written argument (`Tensor(a!)`,
which ember does not functionalize for opaque operators), or a result that is not tensors (an
operator run for an effect, or returning a Python value, would vanish from the graph).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._library.custom_ops import OPDEFS, CustomOpDef

from ember.ir.effects import EFFECT_NAMESPACES, capture_effect

OP_TYPES: tuple[type, ...] = (torch._ops.OpOverload, torch._ops.OpOverloadPacket, CustomOpDef)

# torch's own namespaces: their operators have meta kernels or decompositions of their own.
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quantized", "inductor",
                               "higher_order", "rngprims", "debugprims", "_refs"})
_TENSOR_RETURNS = ("Tensor", "Tensor[]", "Tensor?")


def is_op_object(f: Any) -> bool:
    return isinstance(f, OP_TYPES)


def op_label(f: Any) -> str:
    """`ns::op` (`ns::op.overload`) for an operator object; never a binding's internal name."""
    if isinstance(f, CustomOpDef):
        return str(f._qualname)
    if isinstance(f, torch._ops.OpOverloadPacket):
        return str(f._qualified_op_name)
    if isinstance(f, torch._ops.OpOverload):
        name = str(f._schema.name)
        return name if f._overloadname in ("default", "") else f"{name}.{f._overloadname}"
    return type(f).__qualname__


@functools.cache
def custom_op_problem(op: torch._ops.OpOverload) -> str | None:
    """Why capture cannot record a call of `op` as one node, or None (torch's own operators
    are never refused here)."""
    schema = op._schema
    qual = str(schema.name)
    if qual.partition("::")[0] in _TORCH_NAMESPACES:
        return None
    if not _has_fake_kernel(op):
        return f"{qual} has no fake kernel (register one with torch.library.register_fake)"
    written = [a.name for a in schema.arguments
               if a.alias_info is not None and a.alias_info.is_write]
    if written:
        return (f"custom op {qual} writes its argument{'s' if len(written) > 1 else ''} "
                f"{', '.join(written)} (Tensor(a!) in its schema): ember records only custom "
                f"ops that return new tensors, so the call runs eagerly")
    kinds = [str(r.real_type) for r in schema.returns]
    if not kinds or any(k not in _TENSOR_RETURNS for k in kinds):
        what = "nothing" if not kinds else ", ".join(kinds)
        return (f"custom op {qual} returns {what}: only tensor results can be graph values "
                f"(the call would vanish from the graph), so it runs eagerly")
    return None


def torch_op_effect(op: torch._ops.OpOverload) -> str | None:
    """Why a call of torch's own `op` must run eagerly, outside the graph (a graph break): it
    acts outside the graph (`ember.ir.effects`: prints, reads a file, reseeds, ...). Recorded,
    such a call would run on fake tensors only, and its effect would be lost. A custom op is the
    user's own and is recorded as one node (`custom_op_problem`) whatever its text arguments."""
    ns = str(op._schema.name).partition("::")[0]
    if ns not in _TORCH_NAMESPACES and ns not in EFFECT_NAMESPACES:
        return None
    why = capture_effect(op)
    if why is None:
        return None
    return f"{op_label(op)} {why}: it runs eagerly, outside the graph (a graph break)"


def op_object_effect(f: Any) -> str | None:
    """`torch_op_effect` of an operator object the user calls; a packet (`torch.ops.aten.
    set_`) breaks only if every overload acts outside the graph, else the overload that torch
    picks is checked when it reaches the recorder."""
    if isinstance(f, torch._ops.OpOverload):
        return torch_op_effect(f)
    if isinstance(f, torch._ops.OpOverloadPacket):
        whys = [torch_op_effect(getattr(f, o)) for o in f.overloads()]
        if whys and all(whys):
            return whys[0]
    return None


def _has_fake_kernel(op: torch._ops.OpOverload) -> bool:
    qual = str(op._schema.name)
    opdef = OPDEFS.get(qual)
    if opdef is not None:  # custom_op registers a Meta kernel that raises until register_fake
        return opdef._abstract_fn is not None
    if op.has_kernel_for_dispatch_key(torch._C.DispatchKey.Meta):
        return True
    from torch._library.simple_registry import singleton

    entry = singleton.find(qual)
    return entry.fake_impl.kernel is not None
