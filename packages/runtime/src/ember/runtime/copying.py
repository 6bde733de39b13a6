"""`copy.deepcopy` of what `compile` returns: a copy that compiles its own copy.

Training code deep-copies models (an EMA copy, checkpoint averaging, a frozen reference
model). A compiled function's state is bound to what it compiled: its entries run graphs that
read the original's parameters through guards on the original's objects, its CUDA graphs hold
the original's memory. So the deep copy of a compiled module is a compiled module of the deep
copy of the original, with a compiled function made as `compile` made the first one (same
backend, mode, dynamic and options) and nothing compiled yet: it compiles on its first call,
against its own parameters. A compiled function's deep copy is likewise a fresh compiled
function of the deep copy of its target (a plain function is its own deep copy; a bound method
is bound to the deep copy of its object). torch.compile's module deep-copies the same way (a
new wrapper of a copy of the original module).

`copy.copy` keeps nn.Module's meaning: the shallow copy shares the original's submodules, so
it shares the compiled function too (it runs the same parameters).

Pickling (`torch.save(compiled_model)`, multiprocessing) stores the original and the settings
`compile` was called with, and unpickling compiles the loaded original again
(`rebuild`): the compiled module's class is made per `compile` call (modview.py), so it
cannot be pickled by name, and compiled state is never stored. A backend given as a callable
must itself pickle (a module-level function).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

# A compiled module's attributes that are compiled state (the rest is nn.Module's own)
_COMPILED_STATE = ("_ember_compiled", "_ember_body")


def deepcopy_function(cf: Any, memo: dict[int, Any]) -> Any:
    """A fresh CompiledFunction of the deep copy of `cf`'s target, with `cf`'s settings."""
    cls: Any = type(cf)
    new = cls.__new__(cls)
    memo[id(cf)] = new  # (before the target: a target may hold the compiled function)
    target = copy.deepcopy(cf.target, memo)
    backend, options = cf._args
    new.__init__(target, backend=backend, fullgraph=cf.fullgraph, mode=cf.mode,
                 dynamic=cf.dynamic, options=options)
    # a module's eager call is its forward without hooks (compile sets it): bound to the copy
    new.eager = copy.deepcopy(cf.eager, memo)
    if "__wrapped__" in cf.__dict__:  # compile(fn) wrapped it (name, doc, fn's __dict__)
        functools.update_wrapper(new, target)
    return new


def deepcopy_module(cm: Any, memo: dict[int, Any]) -> Any:
    """A compiled module (of the same class) around the deep copy of `cm`'s original, its
    compiled function fresh (`deepcopy_function`); nn.Module's own state (training, hooks on
    the compiled module) deep-copied as nn.Module copies it."""
    cls: Any = type(cm)
    new = cls.__new__(cls)
    memo[id(cm)] = new
    state = {k: v for k, v in cm.__dict__.items() if k not in _COMPILED_STATE}
    new.__dict__.update(copy.deepcopy(state, memo))  # (its _modules: the original's copy)
    object.__setattr__(new, "_ember_compiled", copy.deepcopy(cm.__dict__["_ember_compiled"],
                                                             memo))
    return new


def settings(cf: Any) -> tuple[Any, ...]:
    """What `compile` was called with for `cf`: (backend, fullgraph, mode, dynamic, options)."""
    backend, options = cf._args
    return (backend, cf.fullgraph, cf.mode, cf.dynamic, options)


def rebuild(target: Any, how: tuple[Any, ...]) -> Any:
    """`compile(target, ...)` with the settings `settings` stored (unpickling)."""
    from ember.runtime.compile import compile  # (compile.py imports this module)
    backend, fullgraph, mode, dynamic, options = how
    return compile(target, backend=backend, fullgraph=fullgraph, mode=mode, dynamic=dynamic,
                   options=options)


def reduce_function(cf: Any) -> tuple[Any, ...]:
    return rebuild, (cf.target, settings(cf))


def reduce_module(cm: Any) -> tuple[Any, ...]:
    """The original and the settings, and nn.Module's own state of the compiled module."""
    state = {k: v for k, v in cm.__dict__.items() if k not in (*_COMPILED_STATE, "_modules")}
    return rebuild, (cm._modules["_orig_mod"], settings(cm.__dict__["_ember_compiled"])), state


def shallow_module(cm: Any) -> Any:
    """nn.Module's shallow copy: the same `__dict__` entries (the original, the compiled
    function) in a new instance of the same class."""
    cls: Any = type(cm)
    new = cls.__new__(cls)
    new.__dict__.update(cm.__dict__)
    return new
