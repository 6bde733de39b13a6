"""`compile(model)`'s module: a CompiledModule that is also an instance of the model's own class.

The article's example is `model = compile(model)` followed by `model.generate(...)` or
`pipeline("text-generation", model=model)`. A plain wrapper hands `generate` over as the
original's bound method, which calls the original (eager) forward, and Hugging Face rejects a
model whose class it does not know. So the compiled module's class is made per call: a subclass
of CompiledModule *and* of the model's class, with the model's class name. Every method of the
model class (`generate`, `_sample`, HF's `getattr(type(self), ...)` lookups) then runs with the
compiled module as `self`, so `self(...)` reaches the compiled forward; attribute reads that the
class does not answer fall through to the original (CompiledModule.__getattr__), and attribute
writes go to the original too, so the two never disagree. The model's own `__init__` never runs
on the compiled module: its state is the original's.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from ember.capture.modules import has_own_hooks

# Attributes a compiled module keeps for itself (everything else is the original's)
_OWN = frozenset({"_orig_mod", "_ember_compiled"})


def _forwarded(name: str) -> property:
    """A class attribute of the model class that the original instance overrides: read and
    written on the original (the class default would shadow the instance's value)."""
    def get(self: Any) -> Any:
        return getattr(self._modules["_orig_mod"], name)

    def put(self: Any, value: Any) -> None:
        setattr(self._modules["_orig_mod"], name, value)

    return property(get, put)


def _setattr(self: nn.Module, name: str, value: Any) -> None:
    mods = self.__dict__.get("_modules")
    # `__class__` too is the compiled module's own (FSDP2's fully_shard swaps the class of the
    # module it shards: the compiled one, never the original behind it)
    if mods is None or "_orig_mod" not in mods or name in _OWN or name in self.__dict__ \
            or name == "__class__":
        nn.Module.__setattr__(self, name, value)  # (nn.Module's own state: training, hooks)
    else:
        setattr(mods["_orig_mod"], name, value)


def _call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The view's `__call__` for a model class with its own: that `__call__` runs once, in the
    compiled function (capture starts at it, and a call ember runs eagerly calls the original),
    never again around it, as the view would inherit it. nn.Module's call runs only for hooks
    on the compiled module itself: global hooks fire in the model's `super().__call__()`,
    where eager fires them, and not a second time here."""
    if has_own_hooks(self):
        return nn.Module.__call__(self, *args, **kwargs)
    return self.forward(*args, **kwargs)


def compiled_module(base: Any, mod: nn.Module, compiled: Any) -> Any:
    """An instance of a fresh subclass of (`base`, type(mod)) holding `mod` and `compiled`;
    `base` is CompiledModule, whose `__init__` only initializes nn.Module state."""
    cls: Any = type(mod)
    if "__slots__" in cls.__dict__ or cls.__getattribute__ is not nn.Module.__getattribute__ \
            or cls.__new__ is not object.__new__:
        # (a class that customizes these: a plain wrapper. FSDP2's classes build an instance
        # of the class they wrap in __new__, which would drop the compiled module's own)
        return base(mod, compiled)
    ns: dict[str, Any] = {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__setattr__": _setattr, "__doc__": cls.__doc__,
    }
    shadowed = [k for k in vars(mod) if not k.startswith("_") and any(
        k in vars(c) for c in cls.__mro__ if c is not nn.Module and c is not object)]
    for k in shadowed:
        if not callable(getattr(cls, k, None)) or isinstance(getattr(cls, k), type):
            ns[k] = _forwarded(k)
    fwd = base.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fwd(self, *args, **kwargs)

    try:  # callers that read forward's signature (HF's generate does) see the model's
        forward.__signature__ = inspect.signature(cls.forward)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    ns["forward"] = forward
    if cls.__call__ is not nn.Module.__call__:
        ns["__call__"] = _call
    try:
        view: Any = type(cls.__name__, (base, cls), ns)
    except TypeError:  # (a layout or metaclass conflict: a plain wrapper)
        return base(mod, compiled)
    obj = view.__new__(view)
    if type(obj) is not view:
        return base(mod, compiled)
    base.__init__(obj, mod, compiled)
    return obj
