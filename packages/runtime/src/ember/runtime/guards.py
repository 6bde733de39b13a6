"""Generated code for a capture: one function that checks the guards and, when they hold,
builds the graph's inputs; and one that rebuilds the caller's return value.

ember writes their Python source from a capture's guards, input sources and output spec (never
from user-provided text), compiles it once, and calls it on every call:

    def guard(S, A, K):      # the graph's inputs (a list) when every guard holds, else the
                             # index of the first failing guard (an int)
    def output(O, S, A, K):  # the caller's return value from the graph's outputs O

`S` is the bound object (a module, or the `self` of a bound method), `A` the positional and `K`
the keyword arguments. A source read more than once (`S._modules['fc1']`) is evaluated once into
a local, right before the first guard that needs it. Objects the code needs (dtypes, classes,
modules, constants) are bound by name in the functions' namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.capture import (
    Guard,
    OutConst,
    OutDict,
    OutObject,
    OutSeq,
    OutSource,
    OutSpec,
    OutTensor,
    Source,
)
from ember.capture.guards import SymIntMeta, SymTensorMeta
from ember.capture.sources import LocalSource, prefixes, rebase
from ember.capture.symbolic import SymInt, py_var, pyexpr
from ember.runtime.fastguards import fast_check

CHECK_ERROR = -2  # evaluating a guard raised: treated as a failed guard
_ROOTS = ("S", "A", "K")


class _Namespace:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {"_new": _new_object}
        self._ids: dict[int, str] = {}
        self._keep: list[Any] = []

    def ref(self, obj: Any, hint: str) -> str:
        name = self._ids.get(id(obj))
        if name is None:
            name = f"{hint}{len(self._ids)}"
            self._ids[id(obj)] = name
            self.values[name] = obj
            self._keep.append(obj)
        return name


# per class: its MRO when last read, and the dict base found in it (_new_object)
_DICT_BASES: dict[type, tuple[tuple[type, ...], Any]] = {}


def _new_object(cls: type, attrs: dict[str, Any],
                items: list[tuple[Any, Any]] | None = None) -> Any:
    if items is None:
        obj: Any = object.__new__(cls)
    else:  # a dict subclass (a ModelOutput): contents set through the dict base's own methods
        # (the base is looked up again only where the class's MRO is another tuple, i.e. its
        # `__bases__` were reassigned: the walk over the MRO cost ~10-30 us per call, cold)
        mro = cls.__mro__
        got = _DICT_BASES.get(cls)
        if got is None or got[0] is not mro:
            got = _DICT_BASES[cls] = (mro, next(
                b for b in mro if b.__module__ in ("builtins", "collections")))
        base: Any = got[1]
        obj = base.__new__(cls)
        for k, v in items:
            base.__setitem__(obj, k, v)
    obj.__dict__.update(attrs)
    return obj


def _sources_of(g: Guard) -> list[Source]:
    return [s for s in (g.source, g.other) if s is not None]


class CallCode:
    """The compiled guard and output functions of one capture, and their source."""

    def __init__(self, guards: list[Guard], inputs: list[Source], output: OutSpec | None):
        ns = _Namespace()
        ref = ns.ref
        uses: dict[Source, int] = {}
        for src in [s for g in guards for s in _sources_of(g)] + list(inputs):
            for p in prefixes(src):
                uses[p] = uses.get(p, 0) + 1
        hoist = {s for s, n in uses.items() if n > 1 and s.expr(ref) not in _ROOTS}
        subst: dict[Source, Source] = {}
        body: list[str] = []

        def need(src: Source) -> Source:
            for p in prefixes(src):
                if p in hoist and p not in subst:
                    var = f"v{len(subst)}"
                    body.append(f"        {var} = {rebase(p, subst).expr(ref)}")
                    subst[p] = LocalSource(var)
            return rebase(src, subst)

        for i, g in enumerate(guards):
            gsrc = need(g.source) if g.source is not None else None
            other = need(g.other) if g.other is not None else None
            local = Guard(g.kind, gsrc, g.expected, other)
            body.append(f"        if not ({local.code(ref)}):")
            body.append(f"            return {i}")
        built = [need(s).expr(ref) for s in inputs]
        lines = ["def guard(S, A, K):", "    try:", *body,
                 f"        return [{', '.join(built)}]",
                 "    except Exception:", f"        return {CHECK_ERROR}", ""]
        if output is not None:
            lines.append("def output(O, S, A, K):")
            syms: set[str] = set()
            ret = _out(output, ref, syms)
            # a size symbol the output returns (a side effect's `layer.batch_size = s0`):
            # bound again here from the input that binds it in the guards
            lines += [f"    {py_var(n)} = {b}" for n, b in _symbol_reads(guards, ref).items()
                      if n in syms]
            lines.append(f"    return {ret}")
        self.source = "\n".join(lines) + "\n"
        self.guards = guards
        self.inputs = list(inputs)
        code = compile(self.source, "<ember generated guards>", "exec")
        exec(code, ns.values)  # ember's own generated source, see the module docstring
        self.full: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] = ns.values["guard"]
        # the fast check replaces it once a call passes (fastguards.py)
        self.guard: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] = self._first
        self.fast_source: str | None = None
        self.output = ns.values.get("output")
        self._ns = ns

    def _first(self, S: Any, A: tuple[Any, ...], K: dict[str, Any]) -> Any:
        """The full check; on the first call that passes, build the fast check from the
        values it read (kept only where it returns the very same inputs)."""
        r = self.full(S, A, K)
        if isinstance(r, list):
            got = fast_check(self.guards, self.inputs, self.full, S, A, K, r)
            self.guard = self.full
            if got is not None:
                self.guard, self.fast_source = got
        return r

    def check(self, S: Any, A: tuple[Any, ...], K: dict[str, Any]) -> int:
        """-1 when the guards hold, else the index of the first failing guard (or -2)."""
        r = self.guard(S, A, K)
        return -1 if isinstance(r, list) else int(r)

    def failure(self, S: Any, A: tuple[Any, ...], K: dict[str, Any]) -> str | None:
        """Why the guards fail for this call (None when they hold)."""
        i = self.check(S, A, K)
        if i == -1:
            return None
        if i == CHECK_ERROR:
            return "evaluating a guard raised an exception (the call's structure changed)"
        g = self.guards[i]
        if g.source is None:
            return f"guard failed: {g.text()}"
        try:
            getter = eval(compile(f"lambda S, A, K: {g.source.expr(self._ns.ref)}",  # noqa: S307
                                  "<ember generated guards>", "eval"), self._ns.values)
            actual = getter(S, A, K)
        except Exception:
            return f"guard failed: {g.text()}"
        return g.mismatch(actual)


def _symbol_reads(guards: list[Guard], ref: Any) -> dict[str, str]:
    """Per size symbol, a Python expression over S/A/K reading it: the dim (or int argument)
    whose guard binds it."""
    out: dict[str, str] = {}
    for g in guards:
        e = g.expected
        if g.source is None or not getattr(e, "binds", None):
            continue
        if isinstance(e, SymTensorMeta):
            for d, x in enumerate(e.shape):
                if not isinstance(x, int) and x.is_Symbol and x.name not in out:
                    out[x.name] = f"{g.source.expr(ref)}.shape[{d}]"
        elif isinstance(e, SymIntMeta) and e.expr.is_Symbol:
            out.setdefault(e.expr.name, g.source.expr(ref))
    return out


def _out(spec: OutSpec, ref: Any, syms: set[str] | None = None) -> str:
    if isinstance(spec, OutTensor):
        return f"O[{spec.index}]"
    if isinstance(spec, OutConst):
        v = spec.value
        if isinstance(v, SymInt) and syms is not None:  # (an int subclass: before int's repr)
            syms.update(x.name for x in v.expr.free_symbols)
            return f"int({pyexpr(v.expr)})"
        if v is None or isinstance(v, (bool, int, str)) or (
                isinstance(v, float) and v == v and v not in (float("inf"), float("-inf"))):
            return repr(v)
        return str(ref(v, "V"))
    if isinstance(spec, OutSource):
        return str(spec.source.expr(ref))
    if isinstance(spec, OutSeq):
        items = [_out(i, ref, syms) for i in spec.items]
        if spec.cls is tuple:
            return "(" + "".join(i + ", " for i in items) + ")"
        if spec.cls is list:
            return "[" + ", ".join(items) + "]"
        if hasattr(spec.cls, "_fields"):
            return f"{ref(spec.cls, 'T')}(" + ", ".join(items) + ")"
        return f"{ref(spec.cls, 'T')}((" + "".join(i + ", " for i in items) + "))"
    if isinstance(spec, OutDict):
        pairs = ", ".join(f"({ref(k, 'Key')}, {_out(v, ref, syms)})"
                          for k, v in zip(spec.keys, spec.items, strict=True))
        return f"{ref(spec.cls, 'T')}([{pairs}])"
    if isinstance(spec, OutObject):
        attrs = ", ".join(f"{k!r}: {_out(v, ref, syms)}" for k, v in spec.attrs)
        if spec.items is None:
            return f"_new({ref(spec.cls, 'T')}, {{{attrs}}})"
        entries = ", ".join(f"({ref(k, 'Key')}, {_out(v, ref, syms)})" for k, v in spec.items)
        return f"_new({ref(spec.cls, 'T')}, {{{attrs}}}, [{entries}])"
    raise TypeError(f"unknown output spec {spec!r}")
