"""Calling symbolic values: the dispatch of CALL.

By kind of callee: user functions are inlined; tensor operations (torch functions, tensor
methods) run on fake tensors and are recorded; builtins and `math`/`operator` have handlers;
classes are constructed (namedtuples, dataclasses and plain user classes symbolically, context
managers and exceptions directly); modules inline their forward; container methods act on the
symbolic container. Anything else is unhandled, by name.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import types
import weakref
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import contexts, pyops
from ember.capture.builtins import handler_for
from ember.capture.compiled import original
from ember.capture.containers import CONTAINER_TYPES, call_method, real_dict_read
from ember.capture.errors import CaptureUnhandled, UserError, unhandled
from ember.capture.lookups import guard_class_attr
from ember.capture.modules import call_module
from ember.capture.mro import lookup_type_attr
from ember.capture.sources import AttrSource, CallSource
from ember.capture.torchcalls import is_torch_op, run_real, unwrap
from ember.capture.variables import (
    ConstVar,
    ContextVar,
    DictVar,
    FunctionVar,
    ListVar,
    MethodVar,
    ModuleVar,
    NestedFunctionVar,
    NewObjectVar,
    ObjectVar,
    PartialVar,
    SetVar,
    TupleVar,
    Var,
)
from ember.capture.wrap import is_trusted_module

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

# Immutable builtin types whose methods are pure: called for real on constant arguments.
_PURE_TYPES = (str, bytes, int, float, complex, bool, tuple, frozenset, range, slice,
               torch.Size, torch.dtype, torch.device, torch.finfo, torch.iinfo, type(None))
# torch types built directly from constant arguments.
_TORCH_VALUE_TYPES = (torch.Size, torch.device, torch.finfo, torch.iinfo)


def call_function(tx: Tracer, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if isinstance(fn, MethodVar):
        return _call_method(tx, fn, args, kwargs)
    if isinstance(fn, FunctionVar):
        h = handler_for(fn.fn)
        if h is not None:
            return h(tx, fn.fn, args, kwargs)
        if is_torch_op(fn.fn):
            return run_real(tx, fn.fn, args, kwargs)
        if getattr(fn.fn, "_dynamo_marked_constant", False):
            return _assumed_constant(tx, fn.fn, args, kwargs)
        return tx.inline(fn, args, kwargs)
    if isinstance(fn, NestedFunctionVar):
        return tx.inline(fn, args, kwargs)
    if isinstance(fn, PartialVar):
        return call_function(tx, fn.func, fn.args + args, {**fn.kwargs, **kwargs})
    if isinstance(fn, ModuleVar):
        return call_module(tx, fn, args, kwargs)
    if isinstance(fn, contexts.ExitVar):
        assert isinstance(fn.ctx, ContextVar), f"__exit__ of a {fn.ctx.describe()}"
        return contexts.exit_(tx, fn.ctx)
    if isinstance(fn, ObjectVar) and isinstance(fn.value, weakref.ref) and not args \
            and not kwargs:
        src = CallSource(fn.source) if fn.source is not None else None
        return tx.wrap(fn.value(), src)
    if isinstance(fn, ObjectVar) and isinstance(fn.value, functools._lru_cache_wrapper):
        # functools.cache/lru_cache: the wrapped function is inlined (as TorchDynamo does);
        # the cache only saves recomputation, which capture does once anyway
        wsrc = AttrSource(fn.source, "__wrapped__") if fn.source is not None else None
        return call_function(tx, tx.wrap(fn.value.__wrapped__, wsrc), args, kwargs)
    if isinstance(fn, ObjectVar) and isinstance(fn.value, torch.jit.ScriptFunction) and \
            isinstance(getattr(fn.value, "_torchdynamo_inline", None), types.FunctionType):
        # a torch.jit.script function (transformers 4's DeBERTa-v2): its Python original is
        # traced, which torch.jit.script keeps for compilers (TorchDynamo inlines it too)
        isrc = AttrSource(fn.source, "_torchdynamo_inline") if fn.source is not None else None
        return call_function(tx, tx.wrap(fn.value._torchdynamo_inline, isrc),  # type: ignore[attr-defined]
                             args, kwargs)
    orig = original(tx, fn)  # a function ember compiled: its original is traced (compiled.py)
    if orig is not None:
        return call_function(tx, orig, args, kwargs)
    if isinstance(fn, ObjectVar | NewObjectVar):
        call = lookup_type_attr(fn.python_type(), "__call__")
        if isinstance(call, types.FunctionType):
            guard_class_attr(tx, fn.python_type(), "__call__")
            return tx.call(FunctionVar(call), [fn, *args], kwargs)
        raise unhandled(f"calling {fn.describe()}")
    if isinstance(fn, ConstVar):
        return _call_const(tx, fn.value, args, kwargs)
    raise unhandled(f"calling {fn.describe()}")


def _assumed_constant(tx: Tracer, f: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """A function its library marks as constant for compilers (`assume_constant_result`, e.g.
    transformers' install probes `is_torch_available()`): called for real at capture on
    constant arguments, its constant result unguarded, as TorchDynamo does."""
    from ember.capture.wrap import SCALARS

    if not all(pyops.deep_const(a) for a in [*args, *kwargs.values()]):
        return tx.inline(FunctionVar(f), args, kwargs)
    res = pyops.real(lambda: f(*[unwrap(a) for a in args],
                               **{k: unwrap(v) for k, v in kwargs.items()}))
    if type(res) not in SCALARS:  # only plain values can stand unguarded
        return tx.inline(FunctionVar(f), args, kwargs)
    return ConstVar(res)


def _call_method(tx: Tracer, m: MethodVar, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, func = m.obj, m.func
    if isinstance(func, ConstVar):
        f = func.value
        owner = getattr(f, "__objclass__", None)
        if owner in CONTAINER_TYPES and isinstance(obj, ListVar | DictVar | SetVar | TupleVar):
            return call_method(tx, obj, f.__name__, args, kwargs)
        storage = _dict_storage(f, obj)
        if storage is not None:
            return call_method(tx, storage, f.__name__, args, kwargs)
        if isinstance(obj, ContextVar):
            return contexts.call_context_method(tx, obj, f.__name__, args)
    return call_function(tx, func, [obj, *args], kwargs)


def _dict_storage(f: Any, obj: Var) -> DictVar | None:
    """The dict contents of a new dict-subclass instance, when `f` is a method of dict's own
    (`super().__setitem__(k, v)` in a ModelOutput, `OrderedDict.keys`)."""
    if isinstance(obj, NewObjectVar) and obj.dict is not None and getattr(
            f, "__objclass__", None) in (dict, collections.OrderedDict):
        return obj.dict
    return None


def _call_const(tx: Tracer, f: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    h = handler_for(f)
    if h is not None:
        return h(tx, f, args, kwargs)
    storage = _dict_storage(f, args[0]) if args else None
    if storage is not None:
        return call_method(tx, storage, f.__name__, args[1:], kwargs)
    if isinstance(f, type):
        return construct(tx, f, args, kwargs)
    if is_torch_op(f):
        return run_real(tx, f, args, kwargs)
    if isinstance(f, types.FunctionType):
        return tx.inline(FunctionVar(f), args, kwargs)
    if isinstance(f, types.MethodType):
        return call_function(tx, MethodVar(tx.wrap(f.__func__, None), tx.wrap(f.__self__, None)),
                             args, kwargs)
    if _is_pure(f) and all(pyops.deep_const(a) for a in [*args, *kwargs.values()]):
        return tx.wrap(pyops.real(lambda: f(*[unwrap(a) for a in args],
                                            **{k: unwrap(v) for k, v in kwargs.items()})), None)
    owner = getattr(f, "__objclass__", None)
    if owner in CONTAINER_TYPES and args and isinstance(args[0], ListVar | DictVar | SetVar |
                                                        TupleVar):
        return call_method(tx, args[0], f.__name__, args[1:], kwargs)
    if owner in (dict, collections.OrderedDict) and args and isinstance(args[0], ObjectVar) \
            and not kwargs:
        res = real_dict_read(tx, args[0], f.__name__, args[1:])
        if res is not None:
            return res
    raise unhandled(f"call to {callable_name(f)}")


def callable_name(f: Any) -> str:
    """A callable as the user knows it: `module.qualname`, without the parts a C++ binding
    makes up (pybind11 names a builtin's scope `pybind11_detail_function_record_...`)."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None)
    mod = getattr(f, "__module__", None)
    parts = [p for p in f"{mod or ''}.{name or ''}".split(".")
             if p and not p.startswith("pybind11") and p != "builtins"]
    if not name or not parts or parts[-1] != str(name).rsplit(".", 1)[-1]:
        kind = type(f).__qualname__
        kind = "callable" if "pybind11" in kind else kind
        return f"a {kind} of {'.'.join(parts)}" if parts else f"a {kind} object"
    return ".".join(parts)


def _is_pure(f: Any) -> bool:
    """A builtin method of an immutable value (str.join, (3).bit_length, dtype.to_real)."""
    if isinstance(f, types.BuiltinMethodType | types.MethodWrapperType):
        return isinstance(getattr(f, "__self__", None), _PURE_TYPES)
    if isinstance(f, types.MethodDescriptorType | types.WrapperDescriptorType |
                  types.ClassMethodDescriptorType):
        return getattr(f, "__objclass__", None) in _PURE_TYPES
    return False


def construct(tx: Tracer, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """`cls(*args, **kwargs)`."""
    if cls in contexts.CONTEXT_TYPES:
        return contexts.make_context(tx, cls, [_const(a) for a in args],
                                     {k: _const(v) for k, v in kwargs.items()})
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _namedtuple(tx, cls, args, kwargs)
    if cls in _TORCH_VALUE_TYPES or issubclass(cls, BaseException):
        if all(pyops.deep_const(a) for a in [*args, *kwargs.values()]):
            return tx.wrap(pyops.real(lambda: cls(*[unwrap(a) for a in args],
                                                  **{k: unwrap(v) for k, v in kwargs.items()})),
                           None)
        raise unhandled(f"building a {cls.__qualname__} from non-constant values")
    if issubclass(cls, torch.nn.Module):
        if not is_trusted_module(cls.__module__):
            raise unhandled(f"creating module {cls.__qualname__} (a class of your own) inside "
                            f"a compiled function: its __init__ would run once, at capture")
        # torch's own module class, built for real on fake tensors under the recorder: a local
        # object (no identity guard). One with parameters is refused there (their random
        # initialisation writes leaves under no_grad), so it is built eagerly at a graph break
        # and reaches the resume function as a value guarded by type (wrap.py).
        try:
            return run_real(tx, cls, args, kwargs, what=f"torch.nn.{cls.__qualname__}()")
        except CaptureUnhandled as e:
            raise unhandled(f"creating module {cls.__qualname__} inside a compiled function: "
                            f"{e.reason}") from None
    if issubclass(cls, torch.Tensor):
        raise unhandled(f"creating a {cls.__qualname__} directly")
    import enum

    if issubclass(cls, enum.Enum):
        return tx.wrap(pyops.real(cls, *[_const(a) for a in args]), None)
    if cls.__module__ == "builtins" or (  # a metaclass with its own __call__
            type(cls) is not type and vars(type).get("__call__") is not lookup_call(type(cls))):
        raise unhandled(f"building a {cls.__qualname__}")
    return _user_object(tx, cls, args, kwargs)


def lookup_call(meta: type) -> Any:
    """The `__call__` a metaclass defines or inherits (type's, unless overridden)."""
    return lookup_type_attr(meta, "__call__")


def _namedtuple(tx: Tracer, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var:
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    defaults: dict[str, Any] = getattr(cls, "_field_defaults", {})
    bound: dict[str, Var] = {}
    if len(args) > len(fields):
        raise UserError(TypeError(f"{cls.__name__}() takes {len(fields)} arguments"))
    for name, a in zip(fields, args):
        bound[name] = a
    for k, v in kwargs.items():
        if k not in fields or k in bound:
            raise UserError(TypeError(f"{cls.__name__}() got an unexpected or repeated "
                                      f"argument {k!r}"))
        bound[k] = v
    for f in fields:
        if f not in bound:
            if f not in defaults:
                raise UserError(TypeError(f"{cls.__name__}() missing argument {f!r}"))
            bound[f] = tx.wrap(defaults[f], None)
    return TupleVar([bound[f] for f in fields], cls)


# Builtin bases whose instances capture builds symbolically, with their own __new__/__init__.
_DICT_BASES = (dict, collections.OrderedDict)


def _user_object(tx: Tracer, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var:
    new = getattr(cls, "__new__", None)
    if vars(object)["__new__"] is not new and not (
            issubclass(cls, dict) and new in [vars(b)["__new__"] for b in _DICT_BASES
                                              if "__new__" in vars(b)]):
        raise unhandled(f"class {cls.__qualname__} with a custom __new__")
    if getattr(cls, "__slots__", None) and not dataclasses.is_dataclass(cls):
        raise unhandled(f"class {cls.__qualname__} with __slots__")
    if issubclass(cls, dict) and any(b.__module__ in ("builtins", "collections") and
                                     b not in (*_DICT_BASES, object) for b in cls.__mro__):
        raise unhandled(f"class {cls.__qualname__} derived from a builtin dict type")
    obj = NewObjectVar(cls)
    init = getattr(cls, "__init__", None)
    if init is vars(object)["__init__"]:
        if args or kwargs:
            raise UserError(TypeError(f"{cls.__name__}() takes no arguments"))
        return obj
    if obj.dict is not None and init in [vars(b)["__init__"] for b in _DICT_BASES]:
        from ember.capture.containers import update_dict

        for a in args:
            update_dict(tx, obj.dict, a)
        obj.dict.items.update(kwargs)
        return obj
    if not isinstance(init, types.FunctionType):
        raise unhandled(f"class {cls.__qualname__} with a builtin __init__")
    res = tx.call(FunctionVar(init), [obj, *args], kwargs)
    if not (isinstance(res, ConstVar) and res.value is None):
        raise UserError(TypeError("__init__() should return None"))
    return obj


def _const(v: Var) -> Any:
    if isinstance(v, ConstVar):
        return v.value
    raise unhandled(f"a {v.describe()} where a constant is needed")
