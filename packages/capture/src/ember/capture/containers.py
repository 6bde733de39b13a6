"""Methods of lists, dicts, sets and tuples held symbolically (they may contain tensors).

Containers made during capture mutate freely; containers read from outside the frame are
read-only (`mutate` refuses: side effects on the caller's objects come with graph breaks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.capture.errors import UserError, unhandled
from ember.capture.guards import Guard, GuardKind
from ember.capture.sources import DictItemSource
from ember.capture.variables import (
    ConstVar,
    DictVar,
    ListVar,
    ObjectVar,
    SetVar,
    TupleVar,
    Var,
    set_key,
)

if TYPE_CHECKING:
    from ember.capture.tracer import Tracer

CONTAINER_TYPES = (list, dict, set, frozenset, tuple)


def mutate(v: ListVar | DictVar | SetVar) -> None:
    # a list or dict from outside the frame (it has a source) changes symbolically and is
    # written back after the graph (ember.capture.side_effects)
    if getattr(v, "readonly", False) and (isinstance(v, SetVar) or v.source is None):
        raise unhandled(f"mutating a {v.python_type().__name__} from outside the compiled "
                        f"function (a set, or a container capture cannot reach again)")
    if isinstance(v, ListVar | DictVar):
        v.mutated = True


def _n(args: list[Var], lo: int, hi: int, name: str) -> None:
    if not lo <= len(args) <= hi:
        raise UserError(TypeError(f"{name}() takes {lo} to {hi} arguments ({len(args)} given)"))


def call_method(tx: Tracer, obj: Var, name: str, args: list[Var], kwargs: dict[str, Var]
                ) -> Var:
    """`obj.name(*args, **kwargs)` for a list, dict, set or tuple."""
    if isinstance(obj, ListVar):
        return _list_method(tx, obj, name, args, kwargs)
    if isinstance(obj, DictVar):
        return _dict_method(tx, obj, name, args, kwargs)
    if isinstance(obj, SetVar):
        return _set_method(tx, obj, name, args, kwargs)
    if isinstance(obj, TupleVar):
        return _seq_query(tx, obj.items, name, args)
    raise unhandled(f"method {name} of {obj.describe()}")


def _seq_query(tx: Tracer, items: list[Var], name: str, args: list[Var]) -> Var:
    from ember.capture.pyops import compare, identical, truth

    if name in ("index", "count"):
        _n(args, 1, 1, name)
        hits = 0
        for i, x in enumerate(items):  # like Python: identity first, then ==
            if identical(x, args[0]) or truth(tx, compare(tx, "==", x, args[0])):
                if name == "index":
                    return ConstVar(i)
                hits += 1
        if name == "count":
            return ConstVar(hits)
        raise UserError(ValueError("value is not in the sequence"))
    raise unhandled(f"sequence method {name}")


def _list_method(tx: Tracer, obj: ListVar, name: str, args: list[Var],
                 kwargs: dict[str, Var]) -> Var:
    from ember.capture.builtins import iterate, sort_items

    if name in ("index", "count"):
        return _seq_query(tx, obj.items, name, args)
    if name == "copy":
        return ListVar(list(obj.items))
    if name == "__len__":
        return ConstVar(len(obj.items))
    if name == "__getitem__":
        from ember.capture.pyops import getitem

        return getitem(tx, obj, args[0])
    mutate(obj)
    if name == "append":
        _n(args, 1, 1, name)
        obj.items.append(args[0])
    elif name == "extend":
        _n(args, 1, 1, name)
        obj.items.extend(iterate(tx, args[0]))
    elif name == "insert":
        _n(args, 2, 2, name)
        obj.items.insert(_int(args[0]), args[1])
    elif name == "pop":
        _n(args, 0, 1, name)
        if not obj.items:
            raise UserError(IndexError("pop from empty list"))
        try:
            return obj.items.pop(_int(args[0]) if args else -1)
        except IndexError as e:
            raise UserError(e) from None
    elif name == "remove":
        idx = _seq_query(tx, obj.items, "index", args)
        assert isinstance(idx, ConstVar), f"list.remove: index {idx.describe()}"
        del obj.items[idx.value]
    elif name == "clear":
        obj.items.clear()
    elif name == "reverse":
        obj.items.reverse()
    elif name == "sort":
        key = kwargs.get("key")
        rev = kwargs.get("reverse", ConstVar(False))
        obj.items[:] = sort_items(tx, obj.items, key, _const(rev))
    else:
        raise unhandled(f"list method {name}")
    return ConstVar(None)


def _dict_method(tx: Tracer, obj: DictVar, name: str, args: list[Var],
                 kwargs: dict[str, Var]) -> Var:
    if name == "get":
        _n(args, 1, 2, name)
        k = set_key(args[0])
        if k in obj.items:
            return obj.items[k]
        return args[1] if len(args) > 1 else ConstVar(None)
    if name == "keys":
        return TupleVar([ConstVar(k) for k in obj.items])
    if name == "values":
        return TupleVar(list(obj.items.values()))
    if name == "items":
        return TupleVar([TupleVar([ConstVar(k), v]) for k, v in obj.items.items()])
    if name == "copy":
        return DictVar(dict(obj.items), obj.cls)
    if name == "__getitem__":
        from ember.capture.pyops import getitem

        return getitem(tx, obj, args[0])
    if name == "__contains__":
        return ConstVar(set_key(args[0]) in obj.items)
    if name == "__len__":
        return ConstVar(len(obj.items))
    if name == "__iter__":
        from ember.capture.variables import IteratorVar

        return IteratorVar([ConstVar(k) for k in obj.items])
    mutate(obj)
    if name == "__setitem__":
        _n(args, 2, 2, name)
        obj.items[set_key(args[0])] = args[1]
        return ConstVar(None)
    if name == "__delitem__":
        _n(args, 1, 1, name)
        k = set_key(args[0])
        if k not in obj.items:
            raise UserError(KeyError(k))
        del obj.items[k]
        return ConstVar(None)
    if name == "pop":
        _n(args, 1, 2, name)
        k = set_key(args[0])
        if k in obj.items:
            return obj.items.pop(k)
        if len(args) > 1:
            return args[1]
        raise UserError(KeyError(k))
    if name == "setdefault":
        _n(args, 1, 2, name)
        k = set_key(args[0])
        if k not in obj.items:
            obj.items[k] = args[1] if len(args) > 1 else ConstVar(None)
        return obj.items[k]
    if name == "update":
        for a in args:
            update_dict(tx, obj, a)
        for k, v in kwargs.items():
            obj.items[k] = v
        return ConstVar(None)
    if name == "clear":
        obj.items.clear()
        return ConstVar(None)
    if name == "popitem":
        if not obj.items:
            raise UserError(KeyError("popitem(): dictionary is empty"))
        k = next(reversed(obj.items))
        return TupleVar([ConstVar(k), obj.items.pop(k)])
    raise unhandled(f"dict method {name}")


def update_dict(tx: Tracer, obj: DictVar, other: Var) -> None:
    from ember.capture.builtins import iterate
    from ember.capture.variables import items_of

    if isinstance(other, DictVar):
        obj.items.update(other.items)
        return
    if isinstance(other, ConstVar) and isinstance(other.value, dict):
        obj.items.update({k: tx.wrap(v, None) for k, v in other.value.items()})
        return
    for pair in iterate(tx, other):
        kv = items_of(pair)
        if kv is None or len(kv) != 2:
            raise UserError(ValueError("dictionary update sequence element has wrong length"))
        obj.items[set_key(kv[0])] = kv[1]


def _set_method(tx: Tracer, obj: SetVar, name: str, args: list[Var],
                kwargs: dict[str, Var]) -> Var:
    from ember.capture.builtins import iterate

    if name in ("union", "intersection", "difference", "issubset", "issuperset", "isdisjoint",
                "copy", "symmetric_difference"):
        mine = {k for k in obj.items}
        others = [{set_key(x) for x in iterate(tx, a)} for a in args]
        res = getattr(set(mine), name)(*others)
        if isinstance(res, bool):
            return ConstVar(res)
        return SetVar([ConstVar(x) for x in res], frozen=obj.frozen)
    if obj.frozen:
        raise UserError(AttributeError(f"'frozenset' object has no attribute {name!r}"))
    mutate(obj)
    if name == "add":
        obj.items[set_key(args[0])] = args[0]
    elif name == "update":
        for a in args:
            for x in iterate(tx, a):
                obj.items[set_key(x)] = x
    elif name in ("discard", "remove"):
        k = set_key(args[0])
        if k not in obj.items and name == "remove":
            raise UserError(KeyError(k))
        obj.items.pop(k, None)
    elif name == "clear":
        obj.items.clear()
    else:
        raise unhandled(f"set method {name}")
    return ConstVar(None)


def _int(v: Var) -> int:
    if isinstance(v, ConstVar) and isinstance(v.value, int):
        return v.value
    raise unhandled(f"a {v.describe()} where an int index is needed")


def _const(v: Var) -> Any:
    if isinstance(v, ConstVar):
        return v.value
    raise unhandled(f"a {v.describe()} where a constant is needed")


_DICT_READS = ("get", "__getitem__", "__contains__")
_DICT_VIEWS = ("keys", "values", "items", "__iter__", "__len__")


def real_dict_read(tx: Tracer, obj: ObjectVar, name: str, args: list[Var]) -> Var | None:
    """dict's own read methods on a real dict of the caller's that capture does not copy (a
    dict subclass: a library's registry, a ModelOutput passed in). `d.get(k)`, `d[k]`, `k in d`
    with one constant key read and guard only that key (present: its value; absent: `k not in
    d`), so entries added for other keys later do not invalidate the graph; `keys()`,
    `values()`, `items()`, `iter(d)`, `len(d)` guard the keys. Values are read as dict's methods
    read them (`DictItemSource`, past a subclass's __getitem__). None when this does not apply."""
    d = obj.value
    src = obj.source
    if not isinstance(d, dict):
        return None

    def value(key: Any) -> Var:
        return tx.wrap(d[key] if type(d) is dict else dict.__getitem__(d, key),
                       DictItemSource(src, key) if src is not None else None)

    if name in _DICT_VIEWS and not args:
        if not all(type(k) in (str, int) for k in d):
            return None
        if src is not None:
            tx.guard(Guard(GuardKind.DICT_KEYS, src, tuple(d)))
        keys = list(d)
        if name == "__len__":
            return ConstVar(len(keys))
        if name == "__iter__":
            from ember.capture.variables import IteratorVar

            return IteratorVar([ConstVar(k) for k in keys])
        if name == "keys":
            return TupleVar([ConstVar(k) for k in keys])
        if name == "values":
            return TupleVar([value(k) for k in keys])
        return TupleVar([TupleVar([ConstVar(k), value(k)]) for k in keys])
    if name not in _DICT_READS or not args or len(args) > 2:
        return None
    if not isinstance(args[0], ConstVar) or type(args[0].value) not in (str, int):
        return None
    key = args[0].value
    if dict.__contains__(d, key):
        v = value(key)  # read (and guarded) even for `in`: the guard checks it is still there
        return ConstVar(True) if name == "__contains__" else v
    if src is not None:
        tx.guard(Guard(GuardKind.NOT_IN, src, key))
    if name == "__getitem__":
        raise UserError(KeyError(key))
    if name == "__contains__":
        return ConstVar(False)
    return args[1] if len(args) > 1 else ConstVar(None)
