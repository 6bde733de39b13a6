"""Running torch code on fake tensors: unwrap symbolic arguments, call, wrap the results.

Any operation whose operands include tensors (a torch function, a tensor method, `x + 1`,
`abs(x)`, `len(x)`) is executed for real on the fake tensors, under the recorder's dispatch mode
and the symbolic grad/autocast state; the ATen operators it reaches become graph nodes. Results
come back as symbolic values: fake tensors as TensorVars, Python values as constants.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedFakeTensorException,
)

from ember.capture.customops import is_op_object, op_label, op_object_effect
from ember.capture.errors import CaptureUnhandled, UserError, unhandled
from ember.capture.sdpa_choice import as_real_choice
from ember.capture.symbolic import as_sym
from ember.capture.variables import (
    ConstVar,
    DictVar,
    FunctionVar,
    ListVar,
    MethodVar,
    ObjectVar,
    PartialVar,
    SetVar,
    TensorVar,
    TupleVar,
    Var,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

# Modules whose functions are tensor operations, called directly on fake tensors.
OP_MODULES = ("torch", "torch._C._nn", "torch._C._linalg", "torch._C._fft", "torch._C._special",
              "torch._C._VariableFunctions", "torch.nn.functional", "torch.functional",
              "torch._tensor", "torch.linalg", "torch.fft", "torch.special",
              "torch._C._nested")

# torch callables that change global state or reach outside: never run during capture.
_DENY = {"manual_seed", "seed", "set_default_dtype", "set_default_device", "set_grad_enabled",
         "use_deterministic_algorithms", "set_num_threads", "save", "load", "set_printoptions",
         "set_rng_state", "get_rng_state", "initial_seed", "compile", "set_anomaly_enabled",
         "set_float32_matmul_precision", "set_default_tensor_type", "_set_grad_enabled",
         "set_autocast_enabled", "set_flush_denormal", "set_warn_always"}


def is_torch_op(fn: Any) -> bool:
    """A callable that is a tensor operation: run it on fakes rather than inlining it."""
    if is_op_object(fn):  # torch.ops.ns.op, a custom_op function: an operator, by name
        return True
    name = getattr(fn, "__name__", "")
    if name in _DENY:
        return False
    if isinstance(fn, types.MethodDescriptorType | types.WrapperDescriptorType |
                  types.GetSetDescriptorType):
        return getattr(fn, "__objclass__", None) is torch._C.TensorBase
    if isinstance(fn, types.BuiltinFunctionType):
        owner = getattr(fn, "__self__", None)
        mod = owner.__name__ if isinstance(owner, types.ModuleType) else getattr(
            fn, "__module__", None)
        if isinstance(owner, type) and owner.__name__ == "_VariableFunctionsClass":
            return True
        return mod in OP_MODULES
    if isinstance(fn, types.FunctionType):
        return fn.__module__ in OP_MODULES and not fn.__module__ == "torch"
    return False


def unwrap(v: Var) -> Any:
    """The real (fake-tensor) Python value of a symbolic one, for a real call."""
    if isinstance(v, ConstVar):
        return v.value
    if isinstance(v, TensorVar):
        return v.fake
    if isinstance(v, TupleVar):
        items = [unwrap(i) for i in v.items]
        if v.cls is tuple:
            return tuple(items)
        if hasattr(v.cls, "_fields"):
            return v.cls(*items)
        return v.cls(items)  # torch.return_types.* (structseq)
    if isinstance(v, ListVar):
        return [unwrap(i) for i in v.items]
    if isinstance(v, DictVar):
        if v.cls is types.MappingProxyType:
            return types.MappingProxyType({k: unwrap(x) for k, x in v.items.items()})
        return v.cls((k, unwrap(x)) for k, x in v.items.items())
    if isinstance(v, SetVar):
        return (frozenset if v.frozen else set)(unwrap(x) for x in v.items.values())
    if isinstance(v, ObjectVar):
        return v.value
    if isinstance(v, FunctionVar):
        return v.fn
    if isinstance(v, MethodVar):
        return types.MethodType(unwrap(v.func), unwrap(v.obj))
    if isinstance(v, PartialVar):
        return functools.partial(unwrap(v.func), *[unwrap(a) for a in v.args],
                                 **{k: unwrap(a) for k, a in v.kwargs.items()})
    raise unhandled(f"passing a {v.describe()} to a function that runs outside capture")


def wrap_result(tx: Tracer, value: Any) -> Var:
    """A real call's result as a symbolic value (no source: nothing to guard)."""
    sym = as_sym(value)  # sizes of dynamic dims come back as SymInts (symbolic.py)
    if sym is not value:
        return ConstVar(sym)
    if isinstance(value, torch.Tensor):
        rec = tx.recorder
        if rec.is_fake(value):
            if rec.value_of(value) is None:
                raise unhandled("a torch call produced a tensor without a recorded operator")
            cls = torch.nn.Parameter if isinstance(value, torch.nn.Parameter) else torch.Tensor
            return TensorVar(value, rec, cls)
        return tx.wrap(value, None)
    if type(value) is tuple:
        items = [wrap_result(tx, x) for x in value]
        if all(isinstance(i, ConstVar) for i in items):
            return ConstVar(value)
        return TupleVar(items)
    if isinstance(value, tuple) and type(value).__module__ == "torch.return_types":
        return TupleVar([wrap_result(tx, x) for x in value], type(value))
    if type(value) is list:
        return ListVar([wrap_result(tx, x) for x in value])
    if type(value) is dict:
        return DictVar({k: wrap_result(tx, x) for k, x in value.items()})
    return tx.wrap(value, None)


def run_real(tx: Tracer, fn: Callable[..., Any], args: list[Var], kwargs: dict[str, Var],
             what: str | None = None) -> Var:
    """Call `fn` for real on unwrapped arguments, on fake tensors under the recorder."""
    a = [unwrap(x) for x in args]
    k = {n: unwrap(x) for n, x in kwargs.items()}
    if what is None and is_op_object(fn):
        what = op_label(fn)
        effect = op_object_effect(fn)  # some (manual_seed) never reach the recorder's mode
        if effect is not None:
            raise unhandled(effect)
    try:
        with tx.torch_state(), tx.recorder.active():
            # sdpa's kernel as real tensors would pick it, not as fake ones (sdpa_choice.py)
            out = as_real_choice(fn, tuple(a), k)(*a, **k)
    except CaptureUnhandled:
        raise
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        name = what or getattr(fn, "__name__", repr(fn))
        raise unhandled(f"{name} needs a tensor's data ({type(e).__name__}: {e})") from None
    except UnsupportedFakeTensorException as e:
        raise unhandled(f"fake tensors cannot run {what or fn!r}: {e}") from None
    except Exception as e:
        name = what or getattr(fn, "__name__", repr(fn))
        if "data-dependent" in str(e) or "DataDependent" in type(e).__name__:
            raise unhandled(f"{name} needs a tensor's data: {e}") from None
        if "FakeTensor" in str(e) or "fake tensor" in str(e).lower():
            raise unhandled(f"{name} cannot run on fake tensors ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}); it probably needs "
                            f"the tensor's data") from None
        raise UserError(e) from None
    return wrap_result(tx, out)


def has_tensor(v: Var) -> bool:
    if isinstance(v, TensorVar):
        return True
    if isinstance(v, TupleVar | ListVar):
        return any(has_tensor(i) for i in v.items)
    if isinstance(v, DictVar):
        return any(has_tensor(i) for i in v.items.values())
    return False
