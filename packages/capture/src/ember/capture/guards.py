"""Guards: what must hold at a call for a captured graph to be reused.

Each guard is data (kind, source, expected value) that prints two ways: as a Python expression
for ember's generated guard function (`code`), and as a readable line for `explain` (`text`).
The runtime assembles the expressions of a capture's guards into one function, in order, so a
guard may rely on the ones before it (a length check before an element's check).
"""

from __future__ import annotations

import enum
import gc
import math
import reprlib
import types
from dataclasses import dataclass
from typing import Any

import torch

from ember.capture.sources import AttrSource, RefFn, Source, describe, held_name
from ember.capture.symbolic import py_var, pyexpr, rel_text
from ember.ir.expr import to_text


class GuardKind(enum.Enum):
    TENSOR_MATCH = "tensor"  # type, dtype, device, shape, strides, requires_grad, layout
    CONSTANT_MATCH = "constant"  # a Python scalar or string: same type, equal value
    EQUALS_MATCH = "equals"  # an immutable object compared with == (Size, device, range, slice)
    ID_MATCH = "identity"  # the very same object (modules, functions, classes, dtypes)
    TYPE_MATCH = "type"  # same exact type
    LENGTH = "length"  # len() of a sequence
    DICT_KEYS = "keys"  # a dict's keys, in order
    NOT_IN = "absent_key"  # a key absent from a dict (a builtin not shadowed by a global)
    ATTR_ABSENT = "absent_attr"  # an attribute absent from an object (hasattr() was False)
    SAME_OBJECT = "alias"  # two sources give the same object
    GRAD_MODE = "grad_mode"  # torch.is_grad_enabled()
    DEFAULT_DTYPE = "default_dtype"  # torch.get_default_dtype()
    DISPATCH_MODES = "dispatch_modes"  # torch._C._len_torch_dispatch_stack()
    NO_HOOKS = "no_hooks"  # an nn.Module has no forward hooks
    NO_GLOBAL_HOOKS = "no_global_hooks"  # torch's global nn.Module call hooks are all empty
    CLASS_ATTR = "class_attr"  # a class's MRO lookup of a name finds the same object
    SHAPE = "shape"  # a relation between size symbols (a branch on a dynamic size)


@dataclass(frozen=True)
class ClassLookup:
    """What a CLASS_ATTR guard checks on the class at its source: `before` (the classes of its
    MRO ahead of `owner`) do not define `name`, and `owner.__dict__[name]` is `found` (`owner`
    None: torch's or the standard library's own class, not checked); `mro`, where `owner` is
    not the class itself, is the class's `__mro__` tuple (reassigning `__bases__` replaces it)."""

    name: str
    found: Any
    owner: type | None
    before: tuple[type, ...] = ()
    mro: tuple[type, ...] | None = None

    def key(self) -> tuple[Any, ...]:
        return (self.name, id(self.found), id(self.owner), tuple(map(id, self.before)),
                id(self.mro))


@dataclass(frozen=True)
class TensorMeta:
    cls: type
    dtype: torch.dtype
    device: torch.device
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        return TensorMeta(type(t), t.dtype, t.device, tuple(int(s) for s in t.shape),
                          tuple(int(s) for s in t.stride()), bool(t.requires_grad))

    def text(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        rg = ", requires_grad" if self.requires_grad else ""
        cls = "" if self.cls is torch.Tensor else f"{self.cls.__name__} "
        return f"{cls}{dt}{list(self.shape)} stride={list(self.stride)} on {self.device}{rg}"


@dataclass(frozen=True)
class SymTensorMeta:
    """A TENSOR_MATCH for an input with dynamic dims: sizes are ints or size expressions,
    `binds` the symbols whose first appearance (in guard order) this guard is, with their
    ranges; strides are expressions of the sizes (a dense layout)."""

    cls: type
    dtype: torch.dtype
    device: torch.device
    shape: tuple[Any, ...]
    stride: tuple[Any, ...]
    requires_grad: bool
    binds: tuple[tuple[str, int, int | float], ...] = ()  # (symbol, min, max)

    def text(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        rg = ", requires_grad" if self.requires_grad else ""
        cls = "" if self.cls is torch.Tensor else f"{self.cls.__name__} "
        dims = ", ".join(map(to_text, self.shape))
        stride = ", ".join(map(to_text, self.stride))
        ranges = "".join(f", {n} in [{lo}, {'inf' if hi == math.inf else hi}]"
                         for n, lo, hi in self.binds)
        return f"{cls}{dt}[{dims}] stride=[{stride}] on {self.device}{rg}{ranges}"

    def code(self, x: str, ref: RefFn, dev: str) -> str:
        parts = [f"type({x}) is {ref(self.cls, 'T')}", f"{x}.dtype is {ref(self.dtype, 'D')}",
                 dev, f"{x}.requires_grad is {self.requires_grad!r}",
                 f"{x}.dim() == {len(self.shape)}"]
        ranges = {n: (lo, hi) for n, lo, hi in self.binds}
        for d, e in enumerate(self.shape):
            if isinstance(e, int):
                parts.append(f"{x}.shape[{d}] == {e}")
            elif e.is_Symbol and e.name in ranges:
                lo, hi = ranges.pop(e.name)
                var = py_var(e.name)
                parts.append(f"({var} := {x}.shape[{d}]) >= {lo}")
                if hi != math.inf:
                    parts.append(f"{var} <= {hi}")
            else:
                parts.append(f"{x}.shape[{d}] == {pyexpr(e)}")
        # strides of size-1 dims are not observable; the layout check skips them
        parts.append(" and ".join(f"({x}.shape[{d}] == 1 or {x}.stride({d}) == {pyexpr(e)})"
                                  for d, e in enumerate(self.stride)) or "True")
        return " and ".join(parts)


@dataclass(frozen=True)
class SymIntMeta:
    """A CONSTANT_MATCH for a Python int argument that is a size expression: an int, binding
    its symbol where this is the symbol's first appearance (`binds`), else equal to it."""

    expr: Any  # a sympy expression
    binds: tuple[tuple[str, int, int | float], ...] = ()

    def code(self, x: str) -> str:
        if self.binds:
            name, lo, hi = self.binds[0]
            top = "" if hi == math.inf else f" and {py_var(name)} <= {hi}"
            return f"type({x}) is int and ({py_var(name)} := {x}) >= {lo}{top}"
        return f"type({x}) is int and {x} == {pyexpr(self.expr)}"

    def __repr__(self) -> str:
        ranges = "".join(f", {n} in [{lo}, {'inf' if hi == math.inf else hi}]"
                         for n, lo, hi in self.binds)
        return f"{to_text(self.expr)}{ranges}"


@dataclass(frozen=True)
class ShapeRelation:
    """A relation between size symbols that held at capture (SHAPE guard)."""

    rel: Any  # a sympy relation

    def code(self) -> str:
        return pyexpr(self.rel)

    def text(self) -> str:
        return rel_text(self.rel)


@dataclass(frozen=True, eq=False)
class Guard:
    kind: GuardKind
    source: Source | None
    expected: Any = None
    other: Source | None = None

    def key(self) -> tuple[Any, ...]:
        """Identity for de-duplication."""
        exp = self.expected
        try:
            hash(exp)
        except TypeError:
            exp = id(exp)
        if self.kind is GuardKind.ID_MATCH:
            exp = id(self.expected)
        if isinstance(self.expected, ClassLookup):
            exp = self.expected.key()
        return (self.kind, self.source, exp, self.other)

    def code(self, ref: RefFn) -> str:
        """A Python expression that is true when the guard holds."""
        k, e = self.kind, self.expected
        if k is GuardKind.GRAD_MODE:
            return f"{ref(torch.is_grad_enabled, 'F')}() is {e!r}"
        if k is GuardKind.DEFAULT_DTYPE:
            return f"{ref(torch.get_default_dtype, 'F')}() is {ref(e, 'D')}"
        if k is GuardKind.DISPATCH_MODES:
            return f"{ref(torch._C._len_torch_dispatch_stack, 'F')}() == {e!r}"
        if k is GuardKind.SHAPE:
            return str(e.code())
        if k is GuardKind.NO_GLOBAL_HOOKS:  # (torch registers into these dicts in place)
            return "not (" + " or ".join(ref(d, "H") for d in global_hook_tables()) + ")"
        assert self.source is not None
        x = self.source.expr(ref)
        if k is GuardKind.TENSOR_MATCH:
            m: TensorMeta = e
            # stride() raises for non-strided layouts (a failed guard); get_device() is -1 on
            # CPU and the index on CUDA, cheaper than comparing device objects
            if m.device.type in ("cpu", "cuda"):
                dev = f"{x}.get_device() == {m.device.index if m.device.type == 'cuda' else -1}"
                if m.device.type == "cuda" and m.device.index is None:
                    dev = f"{x}.device == {ref(m.device, 'Dev')}"
            else:
                dev = f"{x}.device == {ref(m.device, 'Dev')}"
            if isinstance(e, SymTensorMeta):
                return e.code(x, ref, dev)
            return (f"type({x}) is {ref(m.cls, 'T')} and {x}.dtype is {ref(m.dtype, 'D')} "
                    f"and {x}.shape == {m.shape!r} and {x}.stride() == {m.stride!r} "
                    f"and {dev} and {x}.requires_grad is {m.requires_grad!r}")
        if k is GuardKind.CONSTANT_MATCH:
            if isinstance(e, SymIntMeta):
                return e.code(x)
            if e is None or isinstance(e, bool):
                return f"{x} is {e!r}"
            if isinstance(e, float) and math.isnan(e):
                return f"type({x}) is float and {x} != {x}"
            lit = repr(e) if isinstance(e, (int, str, bytes)) or (
                isinstance(e, float) and math.isfinite(e)) else ref(e, "V")
            return f"type({x}) is {ref(type(e), 'T')} and {x} == {lit}"
        if k is GuardKind.EQUALS_MATCH:
            return f"type({x}) is {ref(type(e), 'T')} and {x} == {ref(e, 'V')}"
        if k is GuardKind.ID_MATCH:
            return f"{x} is {ref(e, 'O')}"
        if k is GuardKind.TYPE_MATCH:
            return f"type({x}) is {ref(e, 'T')}"
        if k is GuardKind.LENGTH:
            return f"len({x}) == {e!r}"
        if k is GuardKind.DICT_KEYS:
            return f"tuple({x}) == {ref(e, 'Keys')}"
        if k is GuardKind.NOT_IN:
            return f"{e!r} not in {x}"
        if k is GuardKind.ATTR_ABSENT:
            return f"not hasattr({x}, {e!r})"
        if k is GuardKind.SAME_OBJECT:
            assert self.other is not None
            return f"{x} is {self.other.expr(ref)}"
        if k is GuardKind.NO_HOOKS:
            return (f"not ({x}._forward_hooks or {x}._forward_pre_hooks "
                    f"or {x}._backward_hooks or {x}._backward_pre_hooks)")
        if k is GuardKind.CLASS_ATTR:
            lk: ClassLookup = e
            parts = [f"{x}.__mro__ is {ref(lk.mro, 'Mro')}"] if lk.mro is not None else []
            parts += [f"{lk.name!r} not in {_class_dict(b, ref)}" for b in lk.before]
            if lk.owner is not None:
                parts.append(f"{_class_dict(lk.owner, ref)}.get({lk.name!r}) is "
                             f"{ref(lk.found, 'O')}")
            return " and ".join(parts) or "True"
        raise AssertionError(f"no guard code for kind {k}")

    def mismatch(self, actual: Any) -> str:
        """Why `actual` (the source's value now) fails the guard, in words."""
        what = describe(self.source) if self.source is not None else "global state"
        e = self.expected
        if self.kind is GuardKind.TENSOR_MATCH and isinstance(e, SymTensorMeta):
            if isinstance(actual, torch.Tensor):
                return (f"{what}: {str(actual.dtype).replace('torch.', '')}"
                        f"{list(actual.shape)} stride={list(actual.stride())}, expected "
                        f"{e.text()}")
            return f"{what} is {type(actual).__name__}, expected a tensor {e.text()}"
        if self.kind is GuardKind.TENSOR_MATCH and isinstance(actual, torch.Tensor):
            now = TensorMeta.of(actual)
            for field, label in (("cls", "type"), ("dtype", "dtype"), ("shape", "shape"),
                                 ("stride", "stride"), ("device", "device"),
                                 ("requires_grad", "requires_grad")):
                a, b = getattr(now, field), getattr(e, field)
                if a != b:
                    return f"{what}: {label} {_plain(a)}, expected {_plain(b)}"
            if actual.layout is not torch.strided:
                return f"{what}: layout {actual.layout}, expected torch.strided"
        if self.kind in (GuardKind.CONSTANT_MATCH, GuardKind.EQUALS_MATCH):
            return f"{what} is {actual!r}, expected {e!r}"
        if self.kind is GuardKind.LENGTH:
            return f"len({what}) is {_safe_len(actual)}, expected {e}"
        if self.kind is GuardKind.DICT_KEYS:
            return f"keys of {what} are {_safe_keys(actual)}, expected {list(e)}"
        if self.kind is GuardKind.CLASS_ATTR and isinstance(actual, type):
            cur = next((c.__dict__[e.name] for c in actual.__mro__ if e.name in c.__dict__),
                       None)
            return f"{what}.{e.name} is now {_short(cur)}, expected {_short(e.found)}"
        if self.kind is GuardKind.NOT_IN and isinstance(self.source, AttrSource) and \
                self.source.attr == "__dict__":
            return (f"{describe(self.source.of)}.{e} is now an instance attribute (shadowing "
                    f"the class's)")
        return f"guard failed: {self.text()}"

    def text(self) -> str:
        """A readable line: `x: tensor f32[4, 8] stride=[8, 1] on cpu`."""
        k, e = self.kind, self.expected
        if k is GuardKind.GRAD_MODE:
            return f"torch.is_grad_enabled() is {e}"
        if k is GuardKind.DEFAULT_DTYPE:
            return f"torch.get_default_dtype() is {e}"
        if k is GuardKind.DISPATCH_MODES:
            return f"TorchDispatchModes active == {e}"
        if k is GuardKind.SHAPE:
            return f"sizes: {e.text()}"
        if k is GuardKind.NO_GLOBAL_HOOKS:
            return "no global nn.Module forward/backward hooks"
        assert self.source is not None
        what = describe(self.source)
        if k is GuardKind.TENSOR_MATCH:
            return f"{what}: tensor {e.text()}"
        if k in (GuardKind.CONSTANT_MATCH, GuardKind.EQUALS_MATCH):
            return f"{what} == {e!r}"
        if k is GuardKind.ID_MATCH:
            return f"{what} is {_short(e)}"
        if k is GuardKind.TYPE_MATCH:
            return f"type({what}) is {e.__qualname__}"
        if k is GuardKind.LENGTH:
            return f"len({what}) == {e}"
        if k is GuardKind.DICT_KEYS:
            return f"keys of {what} == {list(e)}"
        if k is GuardKind.NOT_IN:
            return f"{e!r} not in {what}"
        if k is GuardKind.ATTR_ABSENT:
            return f"{what} has no attribute {e!r}"
        if k is GuardKind.SAME_OBJECT:
            assert self.other is not None
            return f"{what} is {describe(self.other)}"
        if k is GuardKind.NO_HOOKS:
            return f"{what} has no forward/backward hooks"
        if k is GuardKind.CLASS_ATTR:
            lk = e
            where = (f"{held_name(lk.owner)}.__dict__[{lk.name!r}], {_short(lk.found)}"
                     if lk.owner is not None else "a torch/stdlib base class's")
            skip = ", ".join(held_name(b) for b in lk.before)
            skip = f"; {skip} do{'es' if len(lk.before) == 1 else ''} not define it" if skip \
                else ""
            return f"{what}.{lk.name} resolves to {where}{skip}"
        raise AssertionError(f"no guard text for kind {k}")


def _class_dict(cls: type, ref: RefFn) -> str:
    """An expression for `cls`'s namespace: the dict itself, which CPython's class attribute
    writes change in place (three times faster to read than the `cls.__dict__` proxy, which is
    built anew at each access); the proxy where the dict cannot be reached."""
    refs = gc.get_referents(cls.__dict__)
    if len(refs) == 1 and type(refs[0]) is dict:
        return ref(refs[0], "CD")
    return f"{ref(cls, 'T')}.__dict__"


def _plain(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, tuple):
        return str(list(v))
    if isinstance(v, type):
        return v.__qualname__
    return str(v)


def _safe_len(v: Any) -> str:
    try:
        return str(len(v))
    except Exception:
        return f"(no len: {type(v).__name__})"


def _safe_keys(v: Any) -> str:
    try:
        return str(list(v))
    except Exception:
        return f"(not a dict: {type(v).__name__})"


def _short(obj: Any) -> str:
    if isinstance(obj, types.CodeType):
        short = obj.co_qualname.rsplit("<locals>.", 1)[-1]
        return f"<code {short} at {obj.co_filename}:{obj.co_firstlineno}>"
    if isinstance(obj, property):
        return f"<property {_short(obj.fget)}>"
    if isinstance(obj, staticmethod | classmethod):
        return f"<{type(obj).__name__} {_short(obj.__func__)}>"
    if type(obj) in (tuple, bool, int, float, str, bytes, type(None)):
        return reprlib.repr(obj)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if isinstance(name, str):
        name = name.rsplit("<locals>.", 1)[-1]
    if name is not None:
        mod = getattr(obj, "__module__", None)
        return f"{mod}.{name}" if mod and not isinstance(obj, type(math)) else str(name)
    return f"<{type(obj).__name__} object at {id(obj):#x}>"


def global_hook_tables() -> list[dict[Any, Any]]:
    """torch's global nn.Module call-hook tables (nn.modules.module.register_module_*_hook)."""
    from torch.nn.modules import module as m

    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks")
    return [t for t in (getattr(m, n, None) for n in names) if isinstance(t, dict)]


class GuardSet:
    """An ordered, de-duplicated list of guards."""

    def __init__(self) -> None:
        self.guards: list[Guard] = []
        self._seen: set[tuple[Any, ...]] = set()

    def add(self, g: Guard) -> None:
        k = g.key()
        if k not in self._seen:
            self._seen.add(k)
            self.guards.append(g)

    def remove_for(self, source: Source, kind: GuardKind) -> None:
        self.guards = [g for g in self.guards if not (g.kind is kind and g.source == source)]

    def __len__(self) -> int:
        return len(self.guards)
