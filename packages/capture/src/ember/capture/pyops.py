"""Python's operators on symbolic values: arithmetic, comparison, truth, iteration, indexing.

The rule: constants compute for real (constant folding); anything with a tensor runs on fake
tensors (and records ATen nodes); containers follow Python's semantics element by element; user
objects dispatch to their Python dunder methods, which are inlined.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.errors import UserError, unhandled
from ember.capture.mro import lookup_type_attr
from ember.capture.torchcalls import run_real, unwrap
from ember.capture.variables import (
    ConstVar,
    DictVar,
    FunctionVar,
    IteratorVar,
    ListVar,
    MethodVar,
    ModuleVar,
    NewObjectVar,
    ObjectVar,
    SetVar,
    TensorVar,
    TupleVar,
    Var,
    items_of,
    set_key,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

# BINARY_OP's argument (the same numbering in 3.11 and 3.12): NB_* -> (operator, in-place form)
NB_OPS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("+", operator.add), ("&", operator.and_), ("//", operator.floordiv),
    ("<<", operator.lshift), ("@", operator.matmul), ("*", operator.mul), ("%", operator.mod),
    ("|", operator.or_), ("**", operator.pow), (">>", operator.rshift), ("-", operator.sub),
    ("/", operator.truediv), ("^", operator.xor),
]
NB_INPLACE: list[Callable[[Any, Any], Any]] = [
    operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
    operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub,
    operator.itruediv, operator.ixor,
]
DUNDER = {operator.add: "add", operator.and_: "and", operator.floordiv: "floordiv",
          operator.lshift: "lshift", operator.matmul: "matmul", operator.mul: "mul",
          operator.mod: "mod", operator.or_: "or", operator.pow: "pow", operator.rshift: "rshift",
          operator.sub: "sub", operator.truediv: "truediv", operator.xor: "xor"}
COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
           ">": operator.gt, ">=": operator.ge}
REFLECTED = {"<": "__gt__", "<=": "__ge__", "==": "__eq__", "!=": "__ne__", ">": "__lt__",
             ">=": "__le__"}
CMP_DUNDER = {"<": "__lt__", "<=": "__le__", "==": "__eq__", "!=": "__ne__", ">": "__gt__",
              ">=": "__ge__"}


def real(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a Python operation on constants; its exception is the user's."""
    try:
        return fn(*args)
    except Exception as e:
        raise UserError(e) from None


def deep_const(v: Var) -> bool:
    """A value made only of constants (it can be rebuilt as a real Python value)."""
    if isinstance(v, ConstVar):
        return True
    if isinstance(v, TupleVar | ListVar):
        return all(deep_const(i) for i in v.items)
    if isinstance(v, DictVar):
        return all(deep_const(i) for i in v.items.values())
    return isinstance(v, SetVar)


def binary(tx: Tracer, fn: Callable[[Any, Any], Any], a: Var, b: Var,
           inplace: Callable[[Any, Any], Any] | None = None) -> Var:
    """`a <op> b` (`inplace` is the augmented form, e.g. operator.iadd for `+=`)."""
    if isinstance(a, TensorVar) or isinstance(b, TensorVar):
        if isinstance(a, TensorVar) and inplace is not None:
            return run_real(tx, inplace, [a, b], {})
        return run_real(tx, fn, [a, b], {})
    if isinstance(a, ConstVar) and isinstance(b, ConstVar):
        return ConstVar(real(inplace or fn, a.value, b.value))
    if isinstance(a, NewObjectVar | ObjectVar) or isinstance(b, NewObjectVar | ObjectVar):
        return _dunder_binary(tx, fn, a, b, inplace)
    seq = _sequence_binary(tx, fn, a, b, inplace)
    if seq is not None:
        return seq
    if deep_const(a) and deep_const(b):
        return tx.wrap(real(inplace or fn, unwrap(a), unwrap(b)), None)
    raise unhandled(f"operator {DUNDER.get(fn, fn.__name__)} on {a.describe()} and "
                    f"{b.describe()}")


def _sequence_binary(tx: Tracer, fn: Callable[[Any, Any], Any], a: Var, b: Var,
                     inplace: Callable[[Any, Any], Any] | None) -> Var | None:
    ia, ib = items_of(a), items_of(b)
    if fn is operator.add and ia is not None and ib is not None:
        if isinstance(a, ListVar) and inplace is not None:
            from ember.capture.containers import mutate

            mutate(a)
            a.items.extend(ib)
            return a
        if isinstance(a, ListVar) and isinstance(b, ListVar):
            return ListVar(ia + ib)
        if _is_tuple(a) and _is_tuple(b):
            return TupleVar(ia + ib)
        raise UserError(TypeError(f"can only concatenate {a.python_type().__name__} (not "
                                  f"{b.python_type().__name__})"))
    if isinstance(a, ListVar) and inplace is not None and fn is operator.add:
        from ember.capture.builtins import iterate
        from ember.capture.containers import mutate

        mutate(a)
        a.items.extend(iterate(tx, b))
        return a
    if fn is operator.mul:
        if ia is not None and isinstance(b, ConstVar) and isinstance(b.value, int):
            return ListVar(ia * b.value) if isinstance(a, ListVar) else TupleVar(ia * b.value)
        if ib is not None and isinstance(a, ConstVar) and isinstance(a.value, int):
            return ListVar(ib * a.value) if isinstance(b, ListVar) else TupleVar(ib * a.value)
    if fn is operator.or_ and isinstance(a, DictVar) and isinstance(b, DictVar):
        return DictVar({**a.items, **b.items}, a.cls)
    return None


def _is_tuple(v: Var) -> bool:
    return isinstance(v, TupleVar) or (isinstance(v, ConstVar) and isinstance(v.value, tuple))


def _dunder_binary(tx: Tracer, fn: Callable[[Any, Any], Any], a: Var, b: Var,
                   inplace: Callable[[Any, Any], Any] | None) -> Var:
    name = DUNDER.get(fn)
    if name is None:
        raise unhandled(f"operator {fn.__name__} on a user object")
    tries = []
    if inplace is not None:
        tries.append((a, f"__i{name}__", b))
    tries += [(a, f"__{name}__", b), (b, f"__r{name}__", a)]
    for obj, meth, other in tries:
        f = lookup_type_attr(obj.python_type(), meth)
        if f is None:
            continue
        res = tx.call(_as_fn(tx, f), [obj, other])
        if not (isinstance(res, ConstVar) and res.value is NotImplemented):
            return res
    raise UserError(TypeError(f"unsupported operand type(s) for {name}: "
                              f"{a.python_type().__name__} and {b.python_type().__name__}"))


def _as_fn(tx: Tracer, f: Any) -> Var:
    import types

    if isinstance(f, types.FunctionType):
        return FunctionVar(f)
    return tx.wrap(f, None)


def unary(tx: Tracer, fn: Callable[[Any], Any], a: Var) -> Var:
    if isinstance(a, TensorVar):
        return run_real(tx, fn, [a], {})
    if isinstance(a, ConstVar):
        return ConstVar(real(fn, a.value))
    names = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__"}
    if isinstance(a, NewObjectVar | ObjectVar) and fn in names:
        f = lookup_type_attr(a.python_type(), names[fn])
        if f is not None:
            return tx.call(_as_fn(tx, f), [a])
    raise unhandled(f"unary {fn.__name__} on {a.describe()}")


def truth(tx: Tracer, v: Var) -> bool:
    """bool(v), for a branch: a tensor's value is not known during capture."""
    if isinstance(v, ConstVar):
        return bool(real(bool, v.value))
    if isinstance(v, TensorVar):
        raise unhandled("a branch on a tensor's value (data-dependent control flow)")
    if isinstance(v, TupleVar | ListVar):
        return bool(v.items)
    if isinstance(v, DictVar | SetVar):
        return bool(v.items)
    if isinstance(v, ObjectVar | NewObjectVar):
        for meth in ("__bool__", "__len__"):
            f = lookup_type_attr(v.python_type(), meth)
            if f is not None and f is not getattr(object, meth, None):
                r = tx.call(_as_fn(tx, f), [v])
                if isinstance(r, ConstVar):
                    return bool(r.value)
                return truth(tx, r)
        return True
    return True


def identical(a: Var, b: Var) -> bool:
    """`a is b`."""
    if a is b:
        return True
    if isinstance(a, ConstVar) and isinstance(b, ConstVar):
        return a.value is b.value
    if isinstance(a, TensorVar) and isinstance(b, TensorVar):
        return a.fake is b.fake
    if isinstance(a, ObjectVar) and isinstance(b, ObjectVar):
        return a.value is b.value
    if isinstance(a, FunctionVar) and isinstance(b, FunctionVar):
        return a.fn is b.fn
    return False


def compare(tx: Tracer, op: str, a: Var, b: Var) -> Var:
    fn = COMPARE[op]
    if isinstance(a, TensorVar) or isinstance(b, TensorVar):
        return run_real(tx, fn, [a, b], {})
    if isinstance(a, ConstVar) and isinstance(b, ConstVar):
        return ConstVar(real(fn, a.value, b.value))
    if isinstance(a, NewObjectVar | ObjectVar) or isinstance(b, NewObjectVar | ObjectVar):
        for obj, meth, other in ((a, CMP_DUNDER[op], b), (b, REFLECTED[op], a)):
            f = lookup_type_attr(obj.python_type(), meth)
            if f is not None and f is not getattr(object, meth):
                res = tx.call(_as_fn(tx, f), [obj, other])
                if not (isinstance(res, ConstVar) and res.value is NotImplemented):
                    return res
        if op in ("==", "!="):
            same = identical(a, b)
            return ConstVar(same if op == "==" else not same)
        raise UserError(TypeError(f"'{op}' not supported between {a.describe()} and "
                                  f"{b.describe()}"))
    if deep_const(a) and deep_const(b):
        return ConstVar(real(fn, unwrap(a), unwrap(b)))
    ia, ib = items_of(a), items_of(b)
    if op in ("==", "!=") and ia is not None and ib is not None:
        if type(a) is not type(b) and not (_is_tuple(a) and _is_tuple(b)):
            return ConstVar(op == "!=")
        eq = len(ia) == len(ib) and all(
            identical(x, y) or truth(tx, compare(tx, "==", x, y)) for x, y in zip(ia, ib))
        return ConstVar(eq if op == "==" else not eq)
    if op in ("==", "!="):
        same = identical(a, b)
        return ConstVar(same if op == "==" else not same)
    raise unhandled(f"comparison {op} between {a.describe()} and {b.describe()}")


def contains(tx: Tracer, item: Var, container: Var) -> bool:
    """`item in container`."""
    if isinstance(container, ConstVar) and isinstance(item, ConstVar):
        return bool(real(operator.contains, container.value, item.value))
    if isinstance(container, DictVar | SetVar):
        return set_key(item) in container.items
    seq = items_of(container)
    if seq is not None:
        for x in seq:
            if identical(x, item) or truth(tx, compare(tx, "==", x, item)):
                return True
        return False
    if isinstance(container, TensorVar):
        raise unhandled("`in` on a tensor (needs its data)")
    if isinstance(container, ObjectVar | NewObjectVar | ModuleVar):
        f = lookup_type_attr(container.python_type(), "__contains__")
        if f is not None:
            return truth(tx, tx.call(_as_fn(tx, f), [container, item]))
    raise unhandled(f"`in` on {container.describe()}")


def getitem(tx: Tracer, obj: Var, key: Var) -> Var:
    if isinstance(obj, TensorVar):
        return run_real(tx, operator.getitem, [obj, key], {}, what="tensor indexing")
    if isinstance(obj, TupleVar | ListVar):
        if isinstance(key, ConstVar) and isinstance(key.value, int | slice):
            res = real(operator.getitem, obj.items, key.value)
            if isinstance(key.value, slice):
                return ListVar(res) if isinstance(obj, ListVar) else TupleVar(res)
            return res  # type: ignore[no-any-return]
        if isinstance(key, TensorVar):
            raise unhandled("indexing a Python sequence with a tensor (needs its data)")
        raise UserError(TypeError(f"indices must be integers or slices, not "
                                  f"{key.python_type().__name__}"))
    if isinstance(obj, DictVar):
        k = set_key(key)
        if k not in obj.items:
            missing = getattr(obj.cls, "__missing__", None)
            if missing is not None:
                raise unhandled("a dict subclass with __missing__")
            raise UserError(KeyError(k))
        return obj.items[k]
    if isinstance(obj, ConstVar):
        if isinstance(key, ConstVar):
            return tx.wrap(real(operator.getitem, obj.value, key.value), None)
        if isinstance(obj.value, type) and deep_const(key):  # list[int], dict[str, int]
            return ConstVar(real(operator.getitem, obj.value, unwrap(key)))
        raise unhandled(f"indexing {obj.describe()} with {key.describe()}")
    if isinstance(obj, ModuleVar):
        from ember.capture.modules import module_getitem

        return module_getitem(tx, obj, key)
    if isinstance(obj, ObjectVar | NewObjectVar):
        f = lookup_type_attr(obj.python_type(), "__getitem__")
        if f is not None:
            return tx.call(_as_fn(tx, f), [obj, key])
    raise unhandled(f"indexing {obj.describe()}")


def setitem(tx: Tracer, obj: Var, key: Var, value: Var) -> None:
    from ember.capture.containers import mutate

    if isinstance(obj, TensorVar):
        run_real(tx, operator.setitem, [obj, key, value], {}, what="tensor item assignment")
        return
    if isinstance(obj, ListVar):
        mutate(obj)
        if isinstance(key, ConstVar) and isinstance(key.value, int | slice):
            if isinstance(key.value, slice):
                from ember.capture.builtins import iterate

                real(operator.setitem, obj.items, key.value, iterate(tx, value))
            else:
                real(operator.setitem, obj.items, key.value, value)
            return
        raise unhandled(f"list assignment with a {key.describe()} index")
    if isinstance(obj, DictVar):
        mutate(obj)
        obj.items[set_key(key)] = value
        return
    if isinstance(obj, NewObjectVar):
        f = lookup_type_attr(obj.cls, "__setitem__")
        if f is not None:
            tx.call(_as_fn(tx, f), [obj, key, value])
            return
    raise unhandled(f"item assignment on {obj.describe()} (side effects on objects from "
                    f"outside the frame come with graph breaks)")


def delitem(tx: Tracer, obj: Var, key: Var) -> None:
    from ember.capture.containers import mutate

    if isinstance(obj, ListVar) and isinstance(key, ConstVar):
        mutate(obj)
        real(operator.delitem, obj.items, key.value)
        return
    if isinstance(obj, DictVar):
        mutate(obj)
        k = set_key(key)
        if k not in obj.items:
            raise UserError(KeyError(k))
        del obj.items[k]
        return
    raise unhandled(f"del on an item of {obj.describe()}")


def get_iter(tx: Tracer, v: Var) -> IteratorVar:
    """iter(v)."""
    if isinstance(v, IteratorVar):
        return v
    if isinstance(v, ListVar):
        return IteratorVar([], over=v)
    if isinstance(v, TupleVar):
        return IteratorVar(list(v.items))
    if isinstance(v, DictVar):
        return IteratorVar([ConstVar(k) for k in v.items])
    if isinstance(v, SetVar):
        return IteratorVar(list(v.items.values()))
    if isinstance(v, ConstVar):
        val = v.value
        if isinstance(val, (tuple, list, str, range, bytes, frozenset, set, dict)) or isinstance(
                val, torch.Size):
            if isinstance(val, range) and len(val) > 1_000_000:
                raise unhandled("iterating a range of more than a million elements")
            return IteratorVar([tx.wrap(x, None) for x in real(list, val)])
        raise UserError(TypeError(f"'{type(val).__name__}' object is not iterable"))
    if isinstance(v, TensorVar):
        res = run_real(tx, lambda t: tuple(t.unbind(0)) if t.dim() else iter(t), [v], {},
                       what="iterating a tensor")
        items = items_of(res)
        assert items is not None, "iterating a tensor gave no items"
        return IteratorVar(list(items))
    if isinstance(v, ModuleVar | ObjectVar | NewObjectVar):
        f = lookup_type_attr(v.python_type(), "__iter__")
        if f is not None:
            res = tx.call(_as_fn(tx, f), [v])
            return get_iter(tx, res)
    if isinstance(v, MethodVar):
        raise UserError(TypeError("'method' object is not iterable"))
    raise unhandled(f"iterating over {v.describe()}")


def length(tx: Tracer, v: Var) -> int:
    if isinstance(v, TupleVar | ListVar):
        return len(v.items)
    if isinstance(v, DictVar | SetVar):
        return len(v.items)
    if isinstance(v, ConstVar):
        return int(real(len, v.value))
    if isinstance(v, TensorVar):
        res = run_real(tx, len, [v], {})
        assert isinstance(res, ConstVar), f"len() of a tensor gave {res.describe()}"
        return int(res.value)
    if isinstance(v, ModuleVar | ObjectVar | NewObjectVar):
        f = lookup_type_attr(v.python_type(), "__len__")
        if f is not None:
            r = tx.call(_as_fn(tx, f), [v])
            if isinstance(r, ConstVar) and isinstance(r.value, int):
                return r.value
    if isinstance(v, IteratorVar):
        raise UserError(TypeError("object of type 'iterator' has no len()"))
    raise unhandled(f"len() of {v.describe()}")
