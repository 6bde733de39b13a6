"""The fast guard check: the capture's guards, reading objects through their instance dicts.

A forward of a Hugging Face model has hundreds of guards, nearly all of them reads of module
and config attributes. Such a read is slow in Python: `nn.Module` defines `__getattr__`, so
CPython does not specialize attribute loads on modules (~250 ns each), and a transformers config
runs its Python `__getattribute__` on every read (~1-5 us). Capture made those sources with
`object.__getattribute__`'s lookup (ember.capture.attrs), which for an attribute held in the
instance dict, with no data descriptor of that name on the class, is the dict entry. So, once a
guard has fixed an object's exact type (TYPE_MATCH) or identity (ID_MATCH), the fast check
reads its attributes (and an nn.Module's `_modules`/`_parameters`/`_buffers` entries and hook
tables) as dict items: from the object's `__dict__` bound as a constant where the identity is
guarded, else from `object.__getattribute__(x, '__dict__')` read once per call.

The rewriting is decided on the first call whose full check passes, from the values that check
read (`fast_check`): a read is rewritten only where the dict entry is the very object the full
expression gives, and the fast check is kept only where it returns the same inputs. Every guard
is still checked, in the same order but for the tensor guards, which run last, all in one C
call where the C checker is available (tensorcheck.py; a guard expression only reads, so the
order decides nothing but which failure is met first); on any failure (or exception) the fast
check returns what the full check returns, so recompilation reasons and failing-guard indexes
are unchanged.

What the fast check does not see (documented limits, as torch.compile's dict-version guards
have theirs): a data descriptor added to a class after compiling under a name an instance holds
in its `__dict__`, and an identity-guarded object's `__dict__` reassigned wholesale
(`obj.__dict__ = {...}`; updating it, as `setattr` and `nn.Module.__setattr__` do, is seen).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FunctionType
from typing import Any, cast

import torch

from ember.capture import Guard, GuardKind, Source
from ember.capture.guards import TensorMeta
from ember.capture.sources import (
    AttrSource,
    GetItemSource,
    ModuleMemberSource,
    SelfSource,
    key_expr,
    prefixes,
)
from ember.runtime import guardvm, tensorcheck

FullCheck = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                "_backward_pre_hooks")
_ROOTS = ("S", "A", "K")
_MISSING = object()
# guards that only read their source's value: implied by its identity where it is immutable
_FROZEN_KINDS = (GuardKind.TYPE_MATCH, GuardKind.LENGTH, GuardKind.CONSTANT_MATCH,
                 GuardKind.EQUALS_MATCH)
_VALUE_KINDS = (GuardKind.CONSTANT_MATCH, GuardKind.EQUALS_MATCH)
_SCALARS = (int, float, bool, str, bytes, complex, type(None))


def _frozen(x: Any, depth: int = 0) -> bool:
    """Whether `x` (and all it holds) can never change: an exact scalar or string, or an exact
    tuple (or torch.Size) of such."""
    t = type(x)
    if t in _SCALARS:
        return True
    return depth < 4 and t in (tuple, torch.Size) and all(_frozen(i, depth + 1) for i in x)


@dataclass(frozen=True)
class _Code(Source):
    """An already rewritten expression (a local, a constant, a dict read)."""

    text: str

    def expr(self, ref: Any) -> str:
        return self.text

    def name(self) -> str:
        return self.text


class _Refs:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {"_ga": object.__getattribute__}
        self._ids: dict[int, str] = {}

    def ref(self, obj: Any, hint: str) -> str:
        name = self._ids.get(id(obj))
        if name is None:
            name = f"{hint}{len(self._ids)}"
            self._ids[id(obj)] = name
            self.values[name] = obj
        return name


def _class_lookup(cls: type, name: str) -> Any:
    for c in cls.__mro__:
        if name in c.__dict__:
            return c.__dict__[name]
    return _MISSING


def _instance_dict(value: Any, name: str) -> dict[str, Any] | None:
    """`value`'s instance dict where `object.__getattribute__(value, name)` is its entry
    `name` (no data descriptor of that name on the class), else None."""
    if isinstance(value, type):
        return None
    try:
        d = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return None
    if type(d) is not dict or name not in d:
        return None
    attr = _class_lookup(type(value), name)
    if attr is not _MISSING and (hasattr(type(attr), "__set__") or
                                 hasattr(type(attr), "__delete__")):
        return None
    return d


def _own_dict(value: Any) -> dict[str, Any] | None:
    try:
        d = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return None
    return d if type(d) is dict else None


class _Builder:
    def __init__(self, S: Any, A: tuple[Any, ...], K: dict[str, Any], full: FullCheck):
        self.S, self.A, self.K = S, A, K
        self.ns = _Refs()
        self.ns.values["_full"] = full
        self.body: list[str] = []
        self.pinned: dict[Source, Any] = {}  # identity guarded: the object itself
        self.typed: set[Source] = set()  # exact type guarded
        self.subst: dict[Source, Source] = {}  # hoisted locals
        self.dicts: dict[Source, str] = {}  # an unpinned object's __dict__, read once
        self.hoist: set[Source] = set()
        self._values: dict[Source, Any] = {}
        # tensor guards checked in one C call after the others: (expression, type, spec)
        self.tensors: list[tuple[str, type, list[int]]] = []

    def value(self, src: Source) -> Any:
        """The source's value now, through its full expression."""
        if src not in self._values:
            code = compile(f"lambda S, A, K: {src.expr(self.ns.ref)}",
                           "<ember generated guards>", "eval")
            fn = eval(code, self.ns.values)  # noqa: S307  (ember's own generated source)
            self._values[src] = fn(self.S, self.A, self.K)
        return self._values[src]

    def local(self, text: str) -> _Code:
        var = f"v{len(self.subst) + len(self.dicts)}"
        self.body.append(f"        {var} = {text}")
        return _Code(var)

    def dict_of(self, src: Source, name: str, own: bool = False) -> str | None:
        """An expression for the instance dict of `src`'s (type-guarded) object, where its
        entry `name` is what the generic lookup of `name` finds (`own`: the dict itself)."""
        if src not in self.pinned and src not in self.typed:
            return None
        d = _own_dict(self.value(src)) if own else _instance_dict(self.value(src), name)
        if d is None:
            return None
        if src in self.pinned:
            return self.ns.ref(d, "OD")
        if src not in self.dicts:
            self.dicts[src] = self.local(f"_ga({self.fast(src).expr(self.ns.ref)}, "
                                         f"'__dict__')").text
        return self.dicts[src]

    def fast(self, src: Source) -> Source:
        if src in self.subst:
            return self.subst[src]
        if src in self.pinned:
            return _Code(self.ns.ref(self.pinned[src], "P"))
        base = src.base()
        out: Source | None = None
        if base is not None:
            out = self._dict_read(src, base)
            if out is None:
                out = replace(cast(Any, src), of=self.fast(base))
        else:
            out = src
        assert out is not None
        if src in self.hoist:
            out = self.subst[src] = self.local(out.expr(self.ns.ref))
        return out

    def _dict_read(self, src: Source, base: Source) -> Source | None:
        if isinstance(src, AttrSource) and (base in self.pinned or base in self.typed):
            real = self.value(base)
            if src.attr == "__dict__" and not isinstance(real, type):
                d = self.dict_of(base, "__dict__", own=True)
                if d is not None and self.value(src) is object.__getattribute__(real,
                                                                                "__dict__"):
                    return _Code(d)
            elif isinstance(_class_lookup(type(real), "__getattribute__"), FunctionType) \
                    and not isinstance(real, type) and _instance_dict(real, src.attr) is None:
                # a class attribute, say, of an object whose class has a Python
                # __getattribute__: capture's read is the generic lookup (attrs.py)
                try:
                    same = object.__getattribute__(real, src.attr) is self.value(src)
                except AttributeError:
                    same = False
                if same:
                    return _Code(f"_ga({self.fast(base).expr(self.ns.ref)}, {src.attr!r})")
        if isinstance(src, AttrSource):
            name = src.attr
        elif isinstance(src, ModuleMemberSource):
            name = src.table
        else:
            return None
        d = self.dict_of(base, name)
        if d is None:
            return None
        real = self.value(base)
        entry = object.__getattribute__(real, "__dict__")[name]
        if isinstance(src, ModuleMemberSource):
            try:
                item = entry[src.key]
            except Exception:
                return None
            if item is not self.value(src):
                return None
            return _Code(f"{d}[{name!r}][{key_expr(src.key, self.ns.ref)}]")
        if entry is not self.value(src):
            return None
        return _Code(f"{d}[{name!r}]")

    def guard_code(self, g: Guard) -> str | None:
        """The guard's fast expression; None where the guard joins the C tensor check."""
        ref = self.ns.ref
        src = g.source
        if g.kind is GuardKind.TENSOR_MATCH and type(g.expected) is TensorMeta and \
                src is not None:
            spec = tensorcheck.entry(self.value(src), g.expected)
            if spec is not None:
                self.tensors.append((self.fast(src).expr(ref), g.expected.cls, spec))
                return None
        if g.kind is GuardKind.NO_HOOKS and src is not None:
            d = self.dict_of(src, _HOOK_TABLES[0])
            if d is not None and all(_instance_dict(self.value(src), t) is not None
                                     for t in _HOOK_TABLES):
                return "not (" + " or ".join(f"{d}[{t!r}]" for t in _HOOK_TABLES) + ")"
        if g.kind is GuardKind.ATTR_ABSENT and src is not None:
            absent = self._absent(src, g.expected)
            if absent is not None:
                return absent
        gsrc = self.fast(src) if src is not None else None
        other = self.fast(g.other) if g.other is not None else None
        return Guard(g.kind, gsrc, g.expected, other).code(ref)

    def _absent(self, src: Source, name: str) -> str | None:
        """`not hasattr(x, name)` as dict lookups where the generic lookup, and nn.Module's
        tables, are what decide it: `name` in none of the instance dict, the class dicts along
        the (type-guarded) MRO and, for a module, its `_parameters`/`_buffers`/`_modules`. A
        Python `__getattribute__` (a config's) was inlined by capture, and what it read is
        guarded ahead of this guard; a `__getattr__` other than nn.Module's keeps the full
        check."""
        d = self.dict_of(src, "__dict__", own=True)
        real = self.value(src)
        if d is None or not isinstance(name, str):
            return None
        own = object.__getattribute__(real, "__dict__")
        cls = type(real)
        getattr_fn = _class_lookup(cls, "__getattr__")
        tables: tuple[str, ...] = ()
        if isinstance(real, torch.nn.Module) and getattr_fn is torch.nn.Module.__getattr__:
            tables = ("_parameters", "_buffers", "_modules")
            if any(type(own.get(t)) is not dict for t in tables):
                return None
        elif getattr_fn is not _MISSING:
            return None
        if name in own or any(name in own[t] for t in tables) or \
                _class_lookup(cls, name) is not _MISSING:
            return None
        parts = [f"{name!r} not in {d}"] + [f"{name!r} not in {d}[{t!r}]" for t in tables]
        parts += [f"{name!r} not in {self.ns.ref(c.__dict__, 'CP')}" for c in cls.__mro__]
        return " and ".join(parts)

    def _frozen_anchor(self, g: Guard) -> tuple[Source, str] | None:
        """For a type, length or value guard on a deeply immutable value (a conv's `stride`
        tuple, its items, a float `eps`): the outermost source it is read through by item
        reads of immutable values only, and a reference to that source's value now. When the
        source is that very object again, the guard holds as it did (its value cannot have
        changed), so the check tests identity first (`_emit_group`): a conv's `stride` guards
        (type, length, each item's type and value) become one `v is C`; any other object
        still gets the guards themselves, so what passes and fails is unchanged."""
        src = g.source
        if src is None or g.other is not None or g.kind not in _FROZEN_KINDS or (
                g.kind in _VALUE_KINDS and not _frozen(g.expected)) or (
                g.kind is GuardKind.CONSTANT_MATCH and (g.expected is None or
                                                        type(g.expected) is bool)):
            # (`x is None`, `x is True`: already one identity test)
            return None
        chain = prefixes(src)
        for k, p in enumerate(chain):
            if p.expr(self.ns.ref) in _ROOTS or p in self.pinned:
                continue
            if all(isinstance(q, GetItemSource) for q in chain[k + 1:]):
                try:
                    v = self.value(p)
                except Exception:
                    return None
                if _frozen(v):
                    return p, self.ns.ref(v, "FZ")
        return None

    def _emit_group(self, anchor: tuple[Source, str], codes: list[str]) -> None:
        src, const = anchor
        conj = " and ".join(f"({c})" for c in codes)
        self.body.append(f"        if not ({self.fast(src).expr(self.ns.ref)} is {const} "
                         f"or ({conj})):")
        self.body.append("            return _full(S, A, K)")

    def build(self, guards: list[Guard], inputs: list[Source]) -> str:
        uses: dict[Source, int] = {}
        for s in [s for g in guards for s in (g.source, g.other) if s is not None] + inputs:
            for p in prefixes(s):
                uses[p] = uses.get(p, 0) + 1
        self.hoist = {s for s, n in uses.items()
                      if n > 1 and s.expr(self.ns.ref) not in _ROOTS}
        group: list[str] = []  # consecutive guards on one frozen value (`_frozen_anchor`)
        anchor: tuple[Source, str] | None = None
        for g in guards:
            at = self._frozen_anchor(g)
            if anchor is not None and (at is None or at[0] is not anchor[0]):
                self._emit_group(anchor, group)
                anchor, group = None, []
            code = self.guard_code(g)
            if code is not None and at is not None:
                anchor = anchor or at
                group.append(code)
            elif code is not None:
                self.body.append(f"        if not ({code}):")
                self.body.append("            return _full(S, A, K)")
            if g.source is not None and g.kind is GuardKind.ID_MATCH:
                self.pinned[g.source] = g.expected
                self.typed.add(g.source)
            elif g.source is not None and g.kind is GuardKind.TYPE_MATCH:
                self.typed.add(g.source)
        if anchor is not None:
            self._emit_group(anchor, group)
        if self.tensors:  # (a TorchFunctionMode may intercept tensor attributes: Python's)
            mod = tensorcheck.checker()
            ref = self.ns.ref
            types = ref(tuple(t for _, t, _ in self.tensors), "TT")
            spec = ref(tensorcheck.pack([s for _, _, s in self.tensors]), "TS")
            exprs = "".join(f"{e}, " for e, _, _ in self.tensors)
            self.body.append(f"        if {ref(torch._C._len_torch_function_stack, 'F')}() or "
                             f"not {ref(mod.check, 'F')}({types}, ({exprs}), {spec}):")
            self.body.append("            return _full(S, A, K)")
        built = [self.fast(s).expr(self.ns.ref) for s in inputs]
        lines = ["def guard(S, A, K):", "    try:", *self.body,
                 f"        return [{', '.join(built)}]",
                 "    except Exception:", "        return _full(S, A, K)", ""]
        return "\n".join(lines)


def fast_check(guards: list[Guard], inputs: list[Source], full: FullCheck, S: Any,
               A: tuple[Any, ...], K: dict[str, Any], expected: list[Any]
               ) -> tuple[FullCheck, str] | None:
    """The fast check for a capture (and its source), built on a call whose full check passed
    with inputs `expected`; None where it cannot be built or does not give the same inputs."""
    if not any(g.kind is GuardKind.ID_MATCH and isinstance(g.source, SelfSource)
               for g in guards) and not any(g.kind is GuardKind.TYPE_MATCH for g in guards):
        return None  # nothing to read faster
    try:
        b = _Builder(S, A, K, full)
        source = b.build(guards, inputs)
        exec(compile(source, "<ember generated guards>", "exec"),  # noqa: S102
             b.ns.values)  # ember's own generated source, from the guards' data
        fn: FullCheck = b.ns.values["guard"]
        fell_back = object()
        b.ns.values["_full"] = lambda S, A, K: fell_back  # it must pass on its own
        got = fn(S, A, K)
        b.ns.values["_full"] = full
    except Exception:
        return None
    if not _same(got, expected):
        return None
    # the same function as a C program (guardvm.py), kept where it too passes on its own
    try:
        test = guardvm.program(source, b.ns.values, lambda S, A, K: fell_back)
        if test is not None and _same(test(S, A, K), expected):
            fn = guardvm.program(source, b.ns.values, full)
    except Exception:
        pass
    return fn, source


def _same(got: Any, expected: list[Any]) -> bool:
    return type(got) is list and len(got) == len(expected) and \
        all(x is y for x, y in zip(got, expected, strict=True))
