"""Attribute access on symbolic values, following Python's lookup rules.

For objects from outside the frame the lookup is done statically, as `object.__getattribute__`
would: data descriptors on the type (properties are inlined), then the instance dict, then (for
nn.Modules) the parameter/buffer/child tables, then the type's attributes (functions become bound
methods, classmethods bind the class), then a Python `__getattr__`, which is inlined. Every value
read from an object carries a source, so it is guarded and (for tensors) lifted.
"""

from __future__ import annotations

import types
import weakref
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.compiled import original_attr
from ember.capture.errors import UserError, unhandled
from ember.capture.lookups import guard_class_attr
from ember.capture.mro import MISSING, lookup, lookup_type_attr
from ember.capture.side_effects import module_attr_writable
from ember.capture.sources import AttrSource, HeldSource, ModuleMemberSource
from ember.capture.torchcalls import run_real
from ember.capture.variables import (
    ConstVar,
    ContextVar,
    DictVar,
    FunctionVar,
    ListVar,
    MethodVar,
    NestedFunctionVar,
    NewObjectVar,
    ObjectVar,
    PartialVar,
    SetVar,
    SuperVar,
    TensorVar,
    TupleVar,
    Var,
)
from ember.capture.wrap import already_wrapped, is_trusted_module

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

# Tensor attributes that are not graph values.
_TENSOR_REFUSED = {"grad": "reading .grad", "grad_fn": "reading .grad_fn",
                   "_base": "reading ._base (views come with capture part 2)",
                   "data_ptr": "data_ptr()", "untyped_storage": "storage access",
                   "storage": "storage access", "_version": "the version counter",
                   "requires_grad_": "requires_grad_() (autograd state of a graph value)",
                   "retain_grad": "retain_grad()", "register_hook": "tensor hooks",
                   "register_post_accumulate_grad_hook": "tensor hooks",
                   "backward": "backward() inside a compiled function"}


def getattr_var(tx: Tracer, obj: Var, name: str) -> Var:
    """`obj.name`."""
    if isinstance(obj, TensorVar):
        return _tensor_attr(tx, obj, name)
    if isinstance(obj, ConstVar):
        return _const_attr(tx, obj, name)
    if isinstance(obj, ObjectVar):
        return _object_attr(tx, obj, name)
    if isinstance(obj, NewObjectVar):
        return _new_object_attr(tx, obj, name)
    if name == "__class__" and isinstance(obj, FunctionVar | NestedFunctionVar | TupleVar |
                                          ListVar | DictVar | SetVar):
        return ConstVar(obj.python_type())  # fixed for these (torchvision's API-usage logging)
    if isinstance(obj, TupleVar) and obj.cls is not tuple:
        fields = getattr(obj.cls, "_fields", None)
        if fields is not None and name in fields:
            return obj.items[int(fields.index(name))]
        if obj.cls.__module__ == "torch.return_types":
            fake = obj.cls([_unwrap_any(i) for i in obj.items])
            if hasattr(type(fake), name) and not callable(getattr(fake, name)):
                idx = [i for i, x in enumerate(fake) if x is getattr(fake, name)]
                if idx:
                    return obj.items[idx[0]]
    if isinstance(obj, TupleVar | ListVar | DictVar | SetVar):
        cls = obj.python_type()
        f = lookup(cls, name)
        if f is MISSING:
            raise UserError(AttributeError(f"'{cls.__name__}' object has no attribute {name!r}"))
        if isinstance(f, types.FunctionType | classmethod | staticmethod):
            return _bind_class_attr(tx, obj, cls, name, f)  # a namedtuple's _replace, _make
        return MethodVar(ConstVar(f), obj)
    if isinstance(obj, SuperVar):
        return _super_attr(tx, obj, name)
    if isinstance(obj, FunctionVar):
        # a user function's attributes can be reassigned: read through the function, guarded
        fsrc = None if is_trusted_module(obj.fn.__module__) else HeldSource(obj.fn)
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__defaults__",
                    "__kwdefaults__", "__wrapped__", "__code__", "__dict__"):
            return tx.wrap(getattr(obj.fn, name), AttrSource(fsrc, name) if fsrc else None)
        if name in obj.fn.__dict__:
            return tx.wrap(obj.fn.__dict__[name], AttrSource(fsrc, name) if fsrc else None)
    if isinstance(obj, NestedFunctionVar) and name in ("__name__", "__qualname__"):
        return ConstVar(obj.qualname.rsplit(".", 1)[-1] if name == "__name__" else obj.qualname)
    if isinstance(obj, MethodVar):
        if name == "__self__":
            return obj.obj
        if name == "__func__":
            return obj.func
        return getattr_var(tx, obj.func, name)
    if isinstance(obj, PartialVar):
        if name == "func":
            return obj.func
        if name == "args":
            return TupleVar(list(obj.args))
        if name == "keywords":
            return DictVar(dict(obj.kwargs))
    if isinstance(obj, ContextVar):
        f = lookup_type_attr(obj.cls, name)
        if f is not None:
            return MethodVar(ConstVar(f), obj)
    raise unhandled(f"attribute {name!r} of {obj.describe()}")


def _unwrap_any(v: Var) -> Any:
    from ember.capture.torchcalls import unwrap

    return unwrap(v)


def _tensor_attr(tx: Tracer, obj: TensorVar, name: str) -> Var:
    tx.recorder.observed.add(id(obj.fake))
    if name in _TENSOR_REFUSED:
        raise unhandled(f"{_TENSOR_REFUSED[name]} of a tensor")
    f = lookup(torch.Tensor, name)
    if f is MISSING:
        raise UserError(AttributeError(f"'Tensor' object has no attribute {name!r}"))
    if isinstance(f, types.FunctionType | types.MethodDescriptorType |
                  types.WrapperDescriptorType | types.BuiltinFunctionType | staticmethod |
                  classmethod):
        return MethodVar(ConstVar(getattr(torch.Tensor, name)), obj)
    # properties and getset descriptors (shape, dtype, T, mT, real, data, ...): evaluated on
    # the fake tensor; views among them are recorded as operators.
    return run_real(tx, lambda t: getattr(t, name), [obj], {}, what=f"tensor .{name}")


def _const_attr(tx: Tracer, obj: ConstVar, name: str) -> Var:
    v = obj.value
    try:
        res = getattr(v, name)
    except AttributeError as e:
        raise UserError(e) from None
    if isinstance(v, types.ModuleType):
        src = None
        if obj.source is not None and not is_trusted_module(v.__name__):
            src = AttrSource(obj.source, name)
        return tx.wrap(res, src)
    if isinstance(v, type):
        raw = lookup(v, name)
        if isinstance(raw, types.FunctionType | classmethod | staticmethod | property):
            guard_class_attr(tx, v, name)  # `Cls.method` patched on the class
        if isinstance(raw, types.FunctionType):  # an unbound function of a class
            return FunctionVar(raw)
        if isinstance(raw, classmethod):
            return MethodVar(_fn_var(tx, raw.__func__), obj)
        if isinstance(raw, staticmethod):
            return _fn_var(tx, raw.__func__)
        if isinstance(raw, property):
            return ConstVar(raw)
        src = None
        if obj.source is not None and not is_trusted_module(v.__module__):
            src = AttrSource(obj.source, name)
        return tx.wrap(res, src)
    return tx.wrap(res, None)


def _fn_var(tx: Tracer, f: Any) -> Var:
    if isinstance(f, types.FunctionType):
        return FunctionVar(f)
    return tx.wrap(f, None)


def _object_attr(tx: Tracer, obj: ObjectVar, name: str, generic: bool = False) -> Var:
    """`obj.name`; `generic`: object.__getattribute__'s lookup even where the class has its own
    (which is inlined otherwise: transformers' configs map attribute aliases in one)."""
    value = obj.value
    written = _WRITES.get(tx, {}).get((id(value), name))
    if written is not None:
        return written[1]
    cls = type(value)
    if not generic and not isinstance(value, torch.nn.Module):
        custom = lookup_type_attr(cls, "__getattribute__")
        if isinstance(custom, types.FunctionType):
            return tx.call(FunctionVar(custom), [obj, ConstVar(name)])
    src = obj.source
    if name == "__dict__" and not isinstance(value, torch.nn.Module) and isinstance(
            getattr(value, "__dict__", None), dict):
        return _instance_dict(tx, obj)
    cls_attr = lookup(cls, name)
    if cls_attr is not MISSING and _is_data_descriptor(cls_attr):
        if isinstance(cls_attr, property):
            guard_class_attr(tx, cls, name)  # a property replaced on the class
            if cls_attr.fget is None:
                raise UserError(AttributeError(f"unreadable attribute {name!r}"))
            return tx.call(_fn_var(tx, cls_attr.fget), [obj])
        return tx.wrap(_real_getattr(value, name), AttrSource(src, name) if src else None)
    d = getattr(value, "__dict__", None)
    if isinstance(d, dict) and name in d:
        return tx.wrap(d[name], AttrSource(src, name) if src else None)
    if isinstance(value, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            t = value.__dict__.get(table)
            if t is not None and name in t:
                return tx.wrap(t[name], ModuleMemberSource(src, table, name) if src else None)
    if cls_attr is not MISSING:
        if hasattr(type(cls_attr), "__get__"):  # a method: patched on the class, or shadowed
            guard_class_attr(tx, cls, name, src, value)
        return _bind_class_attr(tx, obj, cls, name, cls_attr)
    getattr_fn = lookup_type_attr(cls, "__getattr__")
    if isinstance(getattr_fn, types.FunctionType) and getattr_fn is not getattr(
            torch.nn.Module, "__getattr__", None):
        return tx.call(FunctionVar(getattr_fn), [obj, ConstVar(name)])
    raise UserError(AttributeError(f"'{cls.__name__}' object has no attribute {name!r}"))


def _instance_dict(tx: Tracer, obj: ObjectVar) -> Var:
    """`obj.__dict__`, kept as the real dict so that reads guard only the keys they touch (a
    transformers config reads `self.__dict__.get(k)` in every attribute access; wrapping the whole
    dict would guard each of its entries)."""
    if any(k[0] == id(obj.value) for k in _WRITES.get(tx, {})):
        raise unhandled(f"reading __dict__ of a {type(obj.value).__qualname__} object whose "
                        f"attributes were written during capture")
    src = AttrSource(obj.source, "__dict__") if obj.source is not None else None
    return ObjectVar(obj.value.__dict__, src)


def _bind_class_attr(tx: Tracer, obj: Var, cls: type, name: str, cls_attr: Any) -> Var:
    if isinstance(cls_attr, staticmethod):
        return _fn_var(tx, cls_attr.__func__)
    if isinstance(cls_attr, classmethod):
        return MethodVar(_fn_var(tx, cls_attr.__func__), ConstVar(cls))
    if isinstance(cls_attr, types.FunctionType):
        return MethodVar(FunctionVar(cls_attr), obj)
    if isinstance(cls_attr, types.MethodDescriptorType | types.WrapperDescriptorType):
        return MethodVar(ConstVar(cls_attr), obj)
    orig = original_attr(cls_attr)  # a method compiled by ember (`@compile` in the class body)
    if orig is not None and isinstance(getattr(cls_attr, orig), types.FunctionType):
        return MethodVar(FunctionVar(getattr(cls_attr, orig)), obj)  # its function is traced
    if hasattr(type(cls_attr), "__get__") and not isinstance(cls_attr, type):
        raise unhandled(f"descriptor {type(cls_attr).__name__} {name!r} of "
                        f"{cls.__qualname__}")
    src = obj.source
    if src is not None and not is_trusted_module(cls.__module__):
        return tx.wrap(cls_attr, AttrSource(src, name))
    return tx.wrap(cls_attr, None)


def generic_getattr(tx: Tracer, obj: Var, name: str) -> Var:
    """`object.__getattribute__(obj, name)`."""
    if isinstance(obj, ObjectVar):
        return _object_attr(tx, obj, name, generic=True)
    if isinstance(obj, NewObjectVar):
        return _new_object_attr(tx, obj, name, generic=True)
    return getattr_var(tx, obj, name)


def _new_object_attr(tx: Tracer, obj: NewObjectVar, name: str, generic: bool = False) -> Var:
    if not generic:
        custom = lookup_type_attr(obj.cls, "__getattribute__")
        if isinstance(custom, types.FunctionType):
            return tx.call(FunctionVar(custom), [obj, ConstVar(name)])
    if name == "__dict__":  # a copy: reads only (writes through it would not be seen)
        return DictVar(dict(obj.attrs))
    if name == "__class__":
        return ConstVar(obj.cls)
    cls_attr = lookup(obj.cls, name)
    if cls_attr is not MISSING and _is_data_descriptor(cls_attr):
        if isinstance(cls_attr, property) and cls_attr.fget is not None:
            guard_class_attr(tx, obj.cls, name)
            return tx.call(_fn_var(tx, cls_attr.fget), [obj])
        raise unhandled(f"descriptor {name!r} of a new {obj.cls.__qualname__}")
    if name in obj.attrs:
        return obj.attrs[name]
    if cls_attr is not MISSING:
        guard_class_attr(tx, obj.cls, name)
        return _bind_class_attr(tx, obj, obj.cls, name, cls_attr)
    getattr_fn = lookup_type_attr(obj.cls, "__getattr__")
    if isinstance(getattr_fn, types.FunctionType):
        return tx.call(FunctionVar(getattr_fn), [obj, ConstVar(name)])
    raise UserError(AttributeError(f"'{obj.cls.__name__}' object has no attribute {name!r}"))


def _super_attr(tx: Tracer, sup: SuperVar, name: str) -> Var:
    target = sup.obj.python_type() if not (isinstance(sup.obj, ConstVar) and isinstance(
        sup.obj.value, type)) else sup.obj.value
    mro = target.__mro__
    try:
        start = mro.index(sup.cls) + 1
    except ValueError:
        raise UserError(TypeError("super(type, obj): obj must be an instance or subtype of "
                                  "type")) from None
    for klass in mro[start:]:
        if name in klass.__dict__:
            raw = klass.__dict__[name]
            guard_class_attr(tx, target, name, start=start)
            if isinstance(raw, staticmethod):
                return _fn_var(tx, raw.__func__)
            if isinstance(raw, classmethod):
                return MethodVar(_fn_var(tx, raw.__func__), ConstVar(target))
            if isinstance(raw, property) and raw.fget is not None:
                return tx.call(_fn_var(tx, raw.fget), [sup.obj])
            if isinstance(raw, types.FunctionType):
                return MethodVar(FunctionVar(raw), sup.obj)
            if isinstance(raw, types.MethodDescriptorType | types.WrapperDescriptorType):
                return MethodVar(ConstVar(raw), sup.obj)
            return tx.wrap(raw, None)
    raise UserError(AttributeError(f"'super' object has no attribute {name!r}"))


def _is_data_descriptor(a: Any) -> bool:
    t = type(a)
    return hasattr(t, "__get__") and (hasattr(t, "__set__") or hasattr(t, "__delete__"))


def _real_getattr(value: Any, name: str) -> Any:
    try:
        return getattr(value, name)
    except AttributeError as e:
        raise UserError(e) from None


def hasattr_var(tx: Tracer, obj: Var, name: str) -> bool:
    try:
        getattr_var(tx, obj, name)
        return True
    except UserError as e:
        if not isinstance(e.exc, AttributeError):
            raise
        if obj.source is not None:
            from ember.capture.guards import Guard, GuardKind

            tx.guard(Guard(GuardKind.ATTR_ABSENT, obj.source, name))
        return False


def setattr_var(tx: Tracer, obj: Var, name: str, value: Var) -> None:
    """`obj.name = value`: only objects made during capture can be written."""
    if isinstance(obj, NewObjectVar):
        cls_attr = lookup(obj.cls, name)
        if isinstance(cls_attr, property):
            if cls_attr.fset is None:
                raise UserError(AttributeError(f"can't set attribute {name!r}"))
            tx.call(_fn_var(tx, cls_attr.fset), [obj, value])
            return
        custom = lookup_type_attr(obj.cls, "__setattr__")
        if custom is not None and custom is not object.__setattr__:
            if isinstance(custom, types.FunctionType):
                tx.call(FunctionVar(custom), [obj, ConstVar(name), value])
                return
            raise unhandled(f"__setattr__ of {obj.cls.__qualname__}")
        obj.attrs[name] = value
        return
    if isinstance(obj, TensorVar):
        raise unhandled(f"setting tensor attribute .{name}")
    if isinstance(obj, ObjectVar) and _stores_back_same_tensor(tx, obj.value, name, value):
        # `self.count += 1` on a buffer: `+=` updated the tensor in place (functionalized into an
        # input update) and STORE_ATTR puts the same object back: nothing to replay.
        return
    if isinstance(obj, ObjectVar) and (
            (not isinstance(obj.value, torch.nn.Module) and _plain_slot(obj.value, name))
            or module_attr_writable(obj.value, name, value)):
        writes = _WRITES.setdefault(tx, {})
        key = (id(obj.value), name)
        if key not in writes:
            d = obj.value.__dict__
            writes[key] = (obj.value, value, d[name] if name in d else MISSING)
        else:
            writes[key] = (obj.value, value, writes[key][2])
        return
    raise unhandled(f"setting attribute {name!r} of {obj.describe()} (a write capture does not "
                    f"replay: a property, a custom __setattr__, a tensor or module on a module)")


# Attribute writes to objects from outside the frame, per tracer: (object, name) -> (object, the
# value written, the value before capture). Library code sets a flag and restores it (transformers'
# CompileableContextVar does, around every forward): reads see the written value; writes that
# restore the old value vanish, lasting ones are replayed (ember.capture.side_effects.collect).
_WRITES: weakref.WeakKeyDictionary[Tracer, dict[tuple[int, str], tuple[Any, Var, Any]]] = \
    weakref.WeakKeyDictionary()


def _stores_back_same_tensor(tx: Tracer, owner: Any, name: str, value: Var) -> bool:
    """`owner.name = value` where value is the symbolic tensor that reading `owner.name` gave."""
    if not isinstance(value, TensorVar):
        return False
    try:
        current = getattr(owner, name)
    except Exception:  # a property that raises, say: not the simple case
        return False
    if not isinstance(current, torch.Tensor):
        return False
    held = already_wrapped(tx, current)
    return isinstance(held, TensorVar) and held.fake is value.fake


def _plain_slot(value: Any, name: str) -> bool:
    """An attribute kept in the instance dict, with no descriptor or custom __setattr__."""
    cls = type(value)
    if not isinstance(getattr(value, "__dict__", None), dict):
        return False
    if lookup_type_attr(cls, "__setattr__") is not object.__setattr__:
        return False
    return lookup(cls, name) is MISSING or not _is_data_descriptor(lookup(cls, name))
