"""Python builtins, `math`, `operator` and a few torch queries, on symbolic values.

One handler per callable, registered in one table keyed by the callable itself. Handlers follow
Python's semantics over symbolic values; on constants most of them just run the real builtin.
"""

from __future__ import annotations

import builtins
import collections
import contextvars
import copy
import functools
import inspect
import math
import operator
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import contexts, pyops
from ember.capture.errors import UserError, unhandled
from ember.capture.guards import Guard, GuardKind
from ember.capture.mro import lookup_type_attr
from ember.capture.symbolic import SymInt, concrete
from ember.capture.torchcalls import has_tensor, run_real, unwrap
from ember.capture.variables import (
    ConstVar,
    DictVar,
    FunctionVar,
    IteratorVar,
    ListVar,
    MethodVar,
    NewObjectVar,
    ObjectVar,
    PartialVar,
    SetVar,
    SuperVar,
    TensorVar,
    TupleVar,
    Var,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

BuiltinHandler = Callable[["Tracer", Any, list[Var], dict[str, Var]], Var]
BUILTINS: dict[int, tuple[Any, BuiltinHandler]] = {}


def builtin(*fns: Any) -> Callable[[BuiltinHandler], BuiltinHandler]:
    def deco(h: BuiltinHandler) -> BuiltinHandler:
        for f in fns:
            if id(f) in BUILTINS:
                raise ValueError(f"{f!r} already has a handler")
            BUILTINS[id(f)] = (f, h)
        return h

    return deco


def handler_for(fn: Any) -> BuiltinHandler | None:
    entry = BUILTINS.get(id(fn))
    return entry[1] if entry is not None and entry[0] is fn else None


def iterate(tx: Tracer, v: Var) -> list[Var]:
    """Every element of an iterable, in order."""
    return pyops.get_iter(tx, v).rest()


def _c(v: Var, what: str = "a constant") -> Any:
    if isinstance(v, ConstVar):
        return v.value
    raise unhandled(f"{v.describe()} where {what} is needed")


def _noargs(kwargs: dict[str, Var], name: str) -> None:
    if kwargs:
        raise UserError(TypeError(f"{name}() takes no keyword arguments"))


@builtin(len)
def _len(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    _noargs(kwargs, "len")
    if len(args) != 1:
        raise UserError(TypeError(f"len() takes exactly one argument ({len(args)} given)"))
    if isinstance(args[0], TensorVar):
        tx.recorder.observed.add(id(args[0].fake))
    return ConstVar(pyops.length(tx, args[0]))


@builtin(range)
def _range(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    _noargs(kwargs, "range")
    return ConstVar(pyops.real(range, *[concrete(_c(a, "an int"), "a loop over a size")
                                        for a in args]))


@builtin(enumerate)
def _enumerate(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    start = _c(args[1] if len(args) > 1 else kwargs.get("start", ConstVar(0)))
    items = iterate(tx, args[0])
    return IteratorVar([TupleVar([ConstVar(start + i), x]) for i, x in enumerate(items)])


@builtin(zip)
def _zip(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    strict = bool(_c(kwargs.get("strict", ConstVar(False))))
    seqs = [iterate(tx, a) for a in args]
    if strict and len({len(s) for s in seqs}) > 1:
        raise UserError(ValueError("zip() arguments have different lengths"))
    return IteratorVar([TupleVar(list(t)) for t in zip(*seqs)])


@builtin(reversed)
def _reversed(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    v = args[0]
    if isinstance(v, IteratorVar) or isinstance(v, SetVar):
        raise UserError(TypeError(f"'{v.python_type().__name__}' object is not reversible"))
    if isinstance(v, DictVar):
        return IteratorVar([ConstVar(k) for k in reversed(v.items)])
    return IteratorVar(list(reversed(iterate(tx, v))))


def sort_items(tx: Tracer, items: list[Var], key: Var | None, reverse: Any) -> list[Var]:
    keys = [tx.call(key, [x]) if key is not None and not (
        isinstance(key, ConstVar) and key.value is None) else x for x in items]
    if not all(pyops.deep_const(k) for k in keys):
        raise unhandled("sorting by values that are not constants")
    real_keys = [unwrap(k) for k in keys]
    order: list[int] = pyops.real(lambda: sorted(range(len(items)), key=lambda i: real_keys[i],
                                                 reverse=bool(reverse)))
    return [items[i] for i in order]


@builtin(sorted)
def _sorted(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    rev = _c(kwargs.get("reverse", ConstVar(False)))
    return ListVar(sort_items(tx, iterate(tx, args[0]), kwargs.get("key"), rev))


def _classes(v: Var) -> tuple[type, ...]:
    c = _c(v, "a class")
    if isinstance(c, tuple):
        return tuple(x for sub in c for x in (sub if isinstance(sub, tuple) else (sub,)))
    return (c,)


@builtin(isinstance)
def _isinstance(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, classes = args[0], _classes(args[1])
    if isinstance(obj, ConstVar | ObjectVar):
        return ConstVar(pyops.real(isinstance, obj.value, classes))
    return ConstVar(pyops.real(issubclass, obj.python_type(), classes))


@builtin(issubclass)
def _issubclass(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ConstVar(pyops.real(issubclass, _c(args[0]), _classes(args[1])))


@builtin(hasattr)
def _hasattr(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    from ember.capture.attrs import hasattr_var

    return ConstVar(hasattr_var(tx, args[0], _c(args[1], "an attribute name")))


@builtin(getattr)
def _getattr(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    from ember.capture.attrs import getattr_var, hasattr_var

    name = _c(args[1], "an attribute name")
    if len(args) > 2 and not hasattr_var(tx, args[0], name):
        return args[2]
    return getattr_var(tx, args[0], name)


@builtin(setattr)
def _setattr(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    from ember.capture.attrs import setattr_var

    setattr_var(tx, args[0], _c(args[1], "an attribute name"), args[2])
    return ConstVar(None)


@builtin(object.__getattribute__)
def _object_getattribute(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    from ember.capture.attrs import generic_getattr

    return generic_getattr(tx, args[0], _c(args[1], "an attribute name"))


@builtin(object.__setattr__)
def _object_setattr(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, name, value = args
    if isinstance(obj, NewObjectVar):
        obj.attrs[_c(name)] = value
        return ConstVar(None)
    raise unhandled(f"object.__setattr__ on {obj.describe()}")


def _minmax(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = iterate(tx, args[0]) if len(args) == 1 else list(args)
    key = kwargs.get("key")
    if not items:
        if "default" in kwargs:
            return kwargs["default"]
        raise UserError(ValueError(f"{fn.__name__}() arg is an empty sequence"))
    consts = [i.value for i in items if isinstance(i, ConstVar)]
    if key is None and len(consts) == len(items):
        return ConstVar(pyops.real(fn, consts))
    if key is not None:
        keys = [tx.call(key, [i]) for i in items]
        vals = [k.value for k in keys if isinstance(k, ConstVar)]
        if len(vals) == len(keys):
            best: int = pyops.real(lambda: fn(range(len(items)), key=lambda i: vals[i]))
            return items[best]
    if any(isinstance(i, TensorVar) for i in items):
        raise unhandled(f"{fn.__name__}() over tensors (compares their values)")
    raise unhandled(f"{fn.__name__}() over {', '.join(i.describe() for i in items)}")


@builtin(min)
def _min(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return _minmax(tx, min, args, kwargs)


@builtin(max)
def _max(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return _minmax(tx, max, args, kwargs)


@builtin(sum)
def _sum(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    acc = args[1] if len(args) > 1 else kwargs.get("start", ConstVar(0))
    for x in iterate(tx, args[0]):
        acc = pyops.binary(tx, operator.add, acc, x)
    return acc


@builtin(abs)
def _abs(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return pyops.unary(tx, abs, args[0])


@builtin(any, all)
def _anyall(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = iterate(tx, args[0])
    is_any = fn is builtins.any
    for x in items:
        t = pyops.truth(tx, x)
        if t and is_any:
            return ConstVar(True)
        if not t and not is_any:
            return ConstVar(False)
    return ConstVar(not is_any)


@builtin(map)
def _map(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    seqs = [iterate(tx, a) for a in args[1:]]
    return IteratorVar([tx.call(args[0], list(t)) for t in zip(*seqs)])


@builtin(filter)
def _filter(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    pred = args[0]
    items = iterate(tx, args[1])
    if isinstance(pred, ConstVar) and pred.value is None:
        return IteratorVar([x for x in items if pyops.truth(tx, x)])
    return IteratorVar([x for x in items if pyops.truth(tx, tx.call(pred, [x]))])


@builtin(iter)
def _iter(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if len(args) != 1:
        raise unhandled("iter(callable, sentinel)")
    return pyops.get_iter(tx, args[0])


@builtin(next)
def _next(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    it = args[0]
    if not isinstance(it, IteratorVar):
        raise UserError(TypeError(f"'{it.python_type().__name__}' object is not an iterator"))
    v = it.next()
    if v is None:
        if len(args) > 1:
            return args[1]
        raise UserError(StopIteration())
    return v


@builtin(list)
def _list(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ListVar(iterate(tx, args[0]) if args else [])


@builtin(tuple)
def _tuple(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if args and isinstance(args[0], ConstVar) and type(args[0].value) is tuple:
        return args[0]  # (not a torch.Size or namedtuple: tuple() of those is a plain tuple)
    items = iterate(tx, args[0]) if args else []
    consts = [i.value for i in items if isinstance(i, ConstVar)]
    if len(consts) == len(items):
        return ConstVar(tuple(consts))
    return TupleVar(items)


@builtin(dict)
def _dict(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    from ember.capture.containers import update_dict

    d = DictVar({})
    if args:
        update_dict(tx, d, args[0])
    d.items.update(kwargs)
    return d


@builtin(collections.OrderedDict)
def _ordered_dict(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    d = _dict(tx, dict, args, kwargs)
    assert isinstance(d, DictVar), f"OrderedDict(): built a {d.describe()}"
    d.cls = collections.OrderedDict
    return d


@builtin(tuple.__new__)
def _tuple_new(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    cls = _c(args[0], "a class")
    items = iterate(tx, args[1]) if len(args) > 1 else []
    if cls is tuple:
        return _tuple(tx, tuple, args[1:], {})
    return TupleVar(items, cls)


@builtin(set, frozenset)
def _set(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return SetVar(iterate(tx, args[0]) if args else [],
                  frozen=fn is frozenset)


def _scalar_convert(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if args and isinstance(args[0], TensorVar):
        raise unhandled(f"{fn.__name__}() of a tensor (needs its data)")
    if fn is int and len(args) == 1 and not kwargs and isinstance(args[0], ConstVar) and \
            isinstance(args[0].value, SymInt):
        return args[0]  # int(size) keeps the size's expression: a comparison is then guarded
    if all(isinstance(a, ConstVar) for a in [*args, *kwargs.values()]):
        return ConstVar(pyops.real(lambda: fn(*[_c(a) for a in args],
                                              **{k: _c(v) for k, v in kwargs.items()})))
    if fn is bool and len(args) == 1:
        return ConstVar(pyops.truth(tx, args[0]))
    if fn in (str, repr) and len(args) == 1 and pyops.deep_const(args[0]):
        return ConstVar(pyops.real(fn, unwrap(args[0])))
    raise unhandled(f"{fn.__name__}() of {', '.join(a.describe() for a in args)}")


@builtin(int, float, bool, str, repr, format, round, divmod, pow, hash, ord, chr, complex,
         bin, hex, oct, ascii)
def _scalar(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if fn is round and args and isinstance(args[0], TensorVar):
        return run_real(tx, round, args, kwargs)
    if fn is pow and args and any(isinstance(a, TensorVar) for a in args):
        return run_real(tx, pow, args, kwargs)
    return _scalar_convert(tx, fn, args, kwargs)


@builtin(callable)
def _callable(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    v = args[0]
    if isinstance(v, ConstVar | ObjectVar):
        return ConstVar(callable(v.value))
    if isinstance(v, TensorVar | TupleVar | ListVar | DictVar | SetVar | IteratorVar):
        return ConstVar(False)
    if isinstance(v, NewObjectVar):
        return ConstVar(any("__call__" in k.__dict__ for k in v.cls.__mro__))
    return ConstVar(True)


@builtin(type)
def _type(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if len(args) != 1:
        raise unhandled("type() with three arguments (creating a class)")
    return ConstVar(args[0].python_type())


@builtin(super)
def _super(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if len(args) == 2:
        return SuperVar(_c(args[0], "a class"), args[1])
    if args:
        raise unhandled("super() with one argument")
    frame = tx.frames[-1]
    cell = frame.cells.get("__class__")
    if cell is None or cell.contents is None:
        raise UserError(RuntimeError("super(): __class__ cell not found"))
    first = frame.code.co_varnames[0] if frame.code.co_argcount else None
    if first is None:
        raise UserError(RuntimeError("super(): no arguments"))
    obj = frame.locals.get(first)
    if obj is None and first in frame.cells:
        obj = frame.cells[first].contents
    if obj is None:
        raise UserError(RuntimeError("super(): arg[0] deleted"))
    return SuperVar(_c(cell.contents, "a class"), obj)


@builtin(slice)
def _slice(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ConstVar(slice(*[_c(a, "a constant slice bound") for a in args]))


@builtin(object)
def _object(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return NewObjectVar(object)


@builtin(print)
def _print(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    raise unhandled("print() (output: a graph break)")


@builtin(id)
def _id(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    raise unhandled("id() (object identity would be baked into the graph)")


@builtin(functools.partial)
def _partial(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    target = args[0]
    if isinstance(target, PartialVar):
        return PartialVar(target.func, target.args + args[1:], {**target.kwargs, **kwargs})
    return PartialVar(target, args[1:], kwargs)


@builtin(functools.reduce)
def _reduce(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = iterate(tx, args[1])
    if len(args) > 2:
        acc = args[2]
    elif items:
        acc, items = items[0], items[1:]
    else:
        raise UserError(TypeError("reduce() of empty iterable with no initial value"))
    for x in items:
        acc = tx.call(args[0], [acc, x])
    return acc


# -- operator -------------------------------------------------------------------------------
def _make_binary(op: Any, inplace: Any = None) -> BuiltinHandler:
    def h(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        return pyops.binary(tx, op, args[0], args[1], inplace)
    return h


for _name, _fn in pyops.NB_OPS:
    builtin(_fn)(_make_binary(_fn))
for (_name, _fn), _ifn in zip(pyops.NB_OPS, pyops.NB_INPLACE):
    builtin(_ifn)(_make_binary(_fn, _ifn))
def _make_compare(op: str) -> BuiltinHandler:
    def h(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        return pyops.compare(tx, op, args[0], args[1])
    return h


for _op, _fn in pyops.COMPARE.items():
    builtin(_fn)(_make_compare(_op))
builtin(operator.neg)(lambda tx, fn, args, kwargs: pyops.unary(tx, operator.neg, args[0]))
builtin(operator.pos)(lambda tx, fn, args, kwargs: pyops.unary(tx, operator.pos, args[0]))
builtin(operator.invert)(lambda tx, fn, args, kwargs: pyops.unary(tx, operator.invert, args[0]))
builtin(operator.not_)(lambda tx, fn, args, kwargs: ConstVar(not pyops.truth(tx, args[0])))
builtin(operator.truth)(lambda tx, fn, args, kwargs: ConstVar(pyops.truth(tx, args[0])))
builtin(operator.getitem)(lambda tx, fn, args, kwargs: pyops.getitem(tx, args[0], args[1]))
builtin(operator.contains)(
    lambda tx, fn, args, kwargs: ConstVar(pyops.contains(tx, args[1], args[0])))
builtin(operator.is_)(lambda tx, fn, args, kwargs: ConstVar(pyops.identical(args[0], args[1])))
builtin(operator.is_not)(
    lambda tx, fn, args, kwargs: ConstVar(not pyops.identical(args[0], args[1])))
builtin(operator.index)(lambda tx, fn, args, kwargs: ConstVar(pyops.real(operator.index,
                                                                      _c(args[0]))))


@builtin(operator.setitem)
def _op_setitem(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    pyops.setitem(tx, args[0], args[1], args[2])
    return ConstVar(None)


# -- math: pure functions of numbers ----------------------------------------------------------
def _math(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if any(has_tensor(a) for a in args):
        raise unhandled(f"math.{fn.__name__}() of a tensor (needs its data)")
    return ConstVar(pyops.real(lambda: fn(*[_c(a) for a in args],
                                          **{k: _c(v) for k, v in kwargs.items()})))


for _name in dir(math):
    _f = getattr(math, _name)
    if callable(_f) and not _name.startswith("_"):
        builtin(_f)(_math)


# -- torch queries ----------------------------------------------------------------------------
@builtin(torch.is_grad_enabled)
def _is_grad_enabled(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ConstVar(tx.grad_enabled)


@builtin(torch.is_autocast_enabled)
def _is_autocast_enabled(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """The symbolic autocast state (autocast at the call site is refused at capture entry, so
    only contexts entered during capture count). No argument means CUDA, as in torch."""
    dev = args[0] if args else kwargs.get("device_type", ConstVar("cuda"))
    if not isinstance(dev, ConstVar) or not isinstance(dev.value, str):
        raise unhandled("torch.is_autocast_enabled with a non-constant device type")
    states = [st for st in tx.autocast if st.device == dev.value]
    return ConstVar(bool(states and states[-1].enabled))


@builtin(torch.get_default_dtype)
def _default_dtype(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ConstVar(torch.get_default_dtype())  # guarded for every capture


def _false(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ConstVar(False)


builtin(torch.jit.is_scripting, torch.jit.is_tracing, torch._C._is_tracing,
        torch._C._has_torch_function, torch._C._has_torch_function_unary,
        torch._C._has_torch_function_variadic)(_false)
# Like TorchDynamo: code asking whether it is being compiled is; libraries (transformers) take
# their traceable paths then and skip data-dependent shortcuts that compute the same result.
builtin(torch.compiler.is_compiling, torch.compiler.is_dynamo_compiling)(
    lambda tx, fn, args, kwargs: ConstVar(True))
# Queries of process state that capture reads once (a CUDA graph being recorded on this stream).
builtin(torch.cuda.is_current_stream_capturing)(
    lambda tx, fn, args, kwargs: ConstVar(bool(torch.cuda.is_current_stream_capturing())))
builtin(torch._C._get_tracing_state)(lambda tx, fn, args, kwargs: ConstVar(None))


@builtin(torch.cuda.get_device_capability)
def _device_capability(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """The GPU's compute capability, read once at capture (a fact of the machine, like the
    CUDA-graph query above): transformers' MoE layers ask it before choosing grouped matmul
    on CUDA, and tracing into it (C queries of the driver) broke the graph."""
    pos = [a.value for a in args if isinstance(a, ConstVar)]
    kw = {k: v.value for k, v in kwargs.items() if isinstance(v, ConstVar)}
    if len(pos) != len(args) or len(kw) != len(kwargs):
        raise unhandled("torch.cuda.get_device_capability of a non-constant device")
    return ConstVar(fn(*pos, **kw))


# Like TorchDynamo: nn.MultiheadAttention then skips its fused inference fast path
# (torch._native_multi_head_attention) for the composite ops the compiler decomposes.
builtin(torch.nn.modules.activation._is_make_fx_tracing)(
    lambda tx, fn, args, kwargs: ConstVar(True))
# The fused inference kernels of nn.TransformerEncoder(Layer) and MultiheadAttention
# (torch._transformer_encoder_layer_fwd, nested tensors) are opaque to a compiler, which fuses
# the composite ops itself: capture reports the fast path off and takes the composite path.
builtin(torch.backends.mha.get_fastpath_enabled)(lambda tx, fn, args, kwargs: ConstVar(False))


@builtin(torch._C._len_torch_dispatch_stack)
def _dispatch_stack_len(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """A pure query of the caller's TorchDispatchMode stack (fast-path tests of
    nn.MultiheadAttention and TransformerEncoderLayer in some torch versions): the value at
    capture (the recorder's own mode is pushed only while an operator runs), guarded as
    TorchDynamo does, so that a call under a mode does not reuse the graph."""
    if args or kwargs:
        raise unhandled("torch._C._len_torch_dispatch_stack with arguments")
    n = torch._C._len_torch_dispatch_stack()
    tx.guard(Guard(GuardKind.DISPATCH_MODES, None, n))
    return ConstVar(n)


@builtin(torch._C._log_api_usage_once)
def _log_api_usage(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """Telemetry with no result (torchvision logs every op it runs): logged once, at capture,
    rather than breaking the graph for it."""
    if len(args) != 1 or kwargs or not isinstance(args[0], ConstVar) or not isinstance(
            args[0].value, str):
        raise unhandled("torch._C._log_api_usage_once with a non-constant event")
    torch._C._log_api_usage_once(args[0].value)
    return ConstVar(None)


def _needs_grad(tx: Tracer, v: Var) -> bool:
    if isinstance(v, TensorVar):
        return tx.grad_enabled and bool(v.fake.requires_grad)
    if isinstance(v, TupleVar | ListVar):
        return any(_needs_grad(tx, i) for i in v.items)
    if isinstance(v, DictVar):
        return any(_needs_grad(tx, i) for i in v.items.values())
    return False


@builtin(vars(torch.autograd.Function)["apply"].__func__)
def _autograd_function_apply(tx: Tracer, fn: Any, args: list[Var],
                             kwargs: dict[str, Var]) -> Var:
    """`MyFunction.apply(*args)` where no gradient is recorded (grad mode off, or no tensor
    argument requires grad): its forward is inlined with a fresh context object, as TorchDynamo
    does; nothing can call its backward. With gradients, differentiating forward's ops would
    replace the user's backward, so apply runs eagerly at a graph break."""
    from ember.capture.calls import construct
    from ember.capture.lookups import guard_class_attr

    if not args or not isinstance(args[0], ConstVar) or not isinstance(args[0].value, type) \
            or not issubclass(args[0].value, torch.autograd.Function):
        raise unhandled("torch.autograd.Function.apply on something other than its subclass")
    cls: Any = args[0].value
    inputs = args[1:]
    if any(_needs_grad(tx, a) for a in [*inputs, *kwargs.values()]):
        raise unhandled(f"{cls.__qualname__}.apply with gradients recorded (its custom "
                        f"backward runs eagerly)")
    guard_class_attr(tx, cls, "forward")
    guard_class_attr(tx, cls, "setup_context")
    forward = tx.wrap(cls.forward, None)  # (a staticmethod: the function itself)
    if cls.setup_context is not torch.autograd.function._SingleLevelFunction.setup_context:
        return tx.call(forward, inputs, kwargs)  # setup_context only prepares a backward
    ctx = construct(tx, torch.autograd.function.FunctionCtx, [], {})
    assert isinstance(ctx, NewObjectVar)
    ctx.attrs["needs_input_grad"] = ConstVar(tuple(False for _ in inputs))
    return tx.call(forward, [ctx, *inputs], kwargs)


builtin(contextvars.ContextVar.set)(contexts.contextvar_set)
builtin(contextvars.ContextVar.get)(contexts.contextvar_get)
builtin(contextvars.ContextVar.reset)(contexts.contextvar_reset)


@builtin(inspect.signature)
def _signature(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    # The signature of a real function comes from its code and defaults, which capture does
    # not change: computed for real rather than inlining inspect's machinery.
    if len(args) != 1 or not isinstance(args[0], ConstVar | FunctionVar | MethodVar |
                                        ObjectVar):
        raise unhandled(f"inspect.signature of {args[0].describe() if args else 'nothing'}")
    target = unwrap(args[0])
    fn_var = args[0].func if isinstance(args[0], MethodVar) else args[0]
    if isinstance(fn_var, FunctionVar):  # a user function's defaults may be reassigned
        from ember.capture.lookups import guard_function

        guard_function(tx, fn_var.fn)
    return tx.wrap(pyops.real(inspect.signature, target,
                              **{k: _c(v) for k, v in kwargs.items()}), None)


@builtin(copy.deepcopy, copy.copy)
def _copy(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if len(args) != 1 or kwargs:
        raise unhandled(f"copy.{fn.__name__} with a memo")
    return copy_var(tx, args[0], fn is copy.deepcopy, {})


def copy_var(tx: Tracer, v: Var, deep: bool, memo: dict[int, Var]) -> Var:
    """A copy of a symbolic value, as copy.copy/deepcopy make it. An object from outside the
    frame is copied into a new symbolic object whose attributes are its own, read through its
    source (so guarded): later writes to the copy stay in capture."""
    if id(v) in memo:
        return memo[id(v)]

    def sub(x: Var) -> Var:
        return copy_var(tx, x, deep, memo) if deep else x

    out: Var
    if isinstance(v, ConstVar | FunctionVar):
        return v  # immutable values and functions: copy returns them
    if isinstance(v, TupleVar):
        items = [sub(x) for x in v.items]
        return v if all(a is b for a, b in zip(items, v.items)) else TupleVar(items, v.cls)
    if isinstance(v, ListVar):
        out = memo[id(v)] = ListVar([])
        out.items = [sub(x) for x in v.items]
        return out
    if isinstance(v, DictVar) and v.cls in (dict, collections.OrderedDict):
        out = memo[id(v)] = DictVar({}, v.cls)
        out.items = {k: sub(x) for k, x in v.items.items()}
        return out
    if isinstance(v, SetVar):
        return SetVar(list(v.items.values()), frozen=v.frozen)
    if isinstance(v, NewObjectVar | ObjectVar):
        cls = v.python_type()
        custom = [m for m in ("__copy__", "__deepcopy__", "__reduce_ex__", "__reduce__",
                              "__getstate__", "__setstate__")
                  if getattr(cls, m, None) is not getattr(object, m, None)]
        if custom or issubclass(cls, torch.nn.Module | dict) or (
                isinstance(v, ObjectVar) and not _plain_object(v.value)):
            raise unhandled(f"copying a {cls.__qualname__} object (a custom copy protocol or "
                            f"state that is not its __dict__)")
        new = NewObjectVar(cls)
        memo[id(v)] = new
        if isinstance(v, NewObjectVar):
            attrs = dict(v.attrs)
        else:
            from ember.capture.sources import AttrSource

            d = v.value.__dict__
            attrs = {k: tx.wrap(x, AttrSource(v.source, k) if v.source is not None else None)
                     for k, x in d.items()}
        new.attrs = {k: sub(x) for k, x in attrs.items()}
        return new
    raise unhandled(f"copying a {v.describe()}")


def _plain_object(value: Any) -> bool:
    """An instance whose whole state is its __dict__ (made by object.__new__, no slots)."""
    cls = type(value)
    return (isinstance(getattr(value, "__dict__", None), dict) and
            getattr(cls, "__new__", None) is vars(object)["__new__"]
            and not any("__slots__" in vars(k) for k in cls.__mro__[:-1]))


@builtin(delattr)
def _delattr(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, name = args[0], _c(args[1], "an attribute name")
    if not isinstance(obj, NewObjectVar):
        raise unhandled(f"deleting attribute {name!r} of {obj.describe()}")
    custom = lookup_type_attr(obj.cls, "__delattr__")
    if isinstance(custom, types.FunctionType):
        return tx.call(FunctionVar(custom), [obj, args[1]])
    if name not in obj.attrs:
        raise UserError(AttributeError(name))
    del obj.attrs[name]
    return ConstVar(None)


@builtin(object.__delattr__)
def _object_delattr(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, name = args[0], _c(args[1], "an attribute name")
    if not isinstance(obj, NewObjectVar):
        raise unhandled(f"deleting attribute {name!r} of {obj.describe()}")
    if name not in obj.attrs:
        raise UserError(AttributeError(name))
    del obj.attrs[name]
    return ConstVar(None)


@builtin(torch.is_tensor)
def _is_tensor(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ConstVar(isinstance(args[0], TensorVar))


@builtin(torch._assert)
def _torch_assert(tx: Tracer, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if not pyops.truth(tx, args[0]):
        raise UserError(AssertionError(_c(args[1]) if len(args) > 1 else ""))
    return ConstVar(None)
