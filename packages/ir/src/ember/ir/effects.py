"""Which torch operators act outside the graph, and the switch that lets them run.

An IR file may name any torch operator, and some of them do more than compute tensors:
`aten.from_file` reads (and with `shared=true` maps and writes) a file, `aten.save` writes one,
`aten._print` prints, `aten.manual_seed` reseeds the process, collectives talk to other
processes. ember never runs such an op's kernels to type it, the verifier refuses it, and its
reference refuses to run, unless effects are allowed (`allow_effects`, `ember ... --allow-effects`).

The classification is decided here, in one place, from three sources, first match wins:

1. `EFFECT_OPS`: operators named with the reason (`ns::name`, every overload);
2. `EFFECT_NAMESPACES`: whole namespaces (profiler, collectives, TorchScript internals);
3. rules over the schema: an argument of a type that holds state outside the graph (Storage,
   Generator, Stream, Future, script objects, `Any`), a `str` argument whose name is not in
   `STR_ARGS` as safe (file names, messages, process-group names; unknown names count as
   effects, so a new torch op with a `filename` argument is refused until reviewed), or no
   results and no written argument (the op exists only for what it does outside the graph).

`tests/security/test_effects.py` scans every schema torch registers and fails on a `str`
argument name this table has not reviewed.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

from ember.ir.interpreter import InterpretError

# 1. Operators named one by one (all overloads), with what they do outside the graph.
EFFECT_OPS: dict[str, str] = {
    "aten::from_file": "reads a file (with shared=true it maps the file and writes through it)",
    "aten::save": "writes a file",
    "aten::_print": "prints to standard output",
    "aten::warn": "emits a warning",
    "aten::manual_seed": "reseeds the process-wide random generator",
    "aten::seed": "reseeds a random generator",
    "aten::set_grad_enabled": "switches autograd on or off for the whole thread",
    "aten::_cufft_set_plan_cache_max_size": "changes the process-wide cuFFT plan cache",
    "aten::_cufft_clear_plan_cache": "clears the process-wide cuFFT plan cache",
    "debugprims::load_tensor": "reads a tensor stored on disk",
    "aten::get_gradients": "reads distributed autograd state (RPC)",
    # These read and write memory outside their input's storage (no bounds check).
    "inductor::_reinterpret_tensor": "reinterprets memory without a bounds check",
    "inductor::_alloc_from_pool": "reinterprets memory without a bounds check",
    "inductor::resize_storage_bytes_": "resizes a storage that other tensors may share",
    "aten::_reshape_alias": "reinterprets memory without a bounds check",
}

# 2. Whole namespaces.
EFFECT_NAMESPACES: dict[str, str] = {
    "profiler": "records into the process-wide profiler",
    "c10d": "communicates with other processes (a collective)",
    "_c10d_functional": "communicates with other processes (a collective)",
    "_c10d_functional_autograd": "communicates with other processes (a collective)",
    "_dtensor": "communicates with other processes (a collective)",
    "symm_mem": "uses memory shared with other processes",
    "prim": "is a TorchScript interpreter op (it may print, raise, call Python or use RPC)",
    "debug_mode_ops": "records into the process-wide debug mode",
    "debugprims": "reads tensors stored on disk",
}

# 3a. Argument types that hold state outside the graph's values (matched as substrings of the
# schema type; `Generator?` is not among them: random ops take `generator=none`, the default
# generator, which is ordinary nondeterminism).
EFFECT_ARG_TYPES: dict[str, str] = {
    "Storage": "takes a Storage (memory the graph does not own)",
    "Stream": "takes a device stream",
    "Future": "takes a future (asynchronous work outside the graph)",
    "RRef": "takes a remote reference (RPC)",
    "Await": "takes an awaitable (asynchronous work outside the graph)",
    "__torch__.": "takes a script object (state outside the graph)",
    "AnyClassType": "takes an arbitrary object",
}

# 3b. Every `str` argument name torch uses, reviewed: True = the text is an option or a value
# computed on (safe), False = the text names something outside the graph (an effect). A name
# missing here counts as an effect.
_MODE = "selects a variant of the computation"
_VALUE = "a TorchScript string/list value computed on"
STR_ARGS: dict[str, tuple[bool, str]] = {
    **{k: (True, _MODE) for k in (
        "UPLO", "driver", "mode", "norm", "ord", "p", "side", "rounding_mode", "approximate",
        "equation", "indexing", "interpolation", "padding", "pad_mode", "padding_side",
        "reduce", "activation", "algorithm", "attr", "binary_attr", "unary_attr",
        "unary_algorithm", "binary_post_op", "unary_post_op", "unary_post_op_algorithm",
        "post_op_name", "post_op_algorithm", "device_type", "type")},
    **{k: (True, _VALUE) for k in (
        "a", "b", "self", "s", "el", "chars", "fillchar", "substr", "separator", "new", "old",
        "string", "values", "input", "item", "key", "dict", "l", "idx", "to_add", "inputs",
        "t", "_0", "ind")},
    "assert_msg": (True, "the message of an assertion error it raises"),
    "api_name": (True, "the API named in an error message it raises"),
    "cls": (True, "the exception class it raises (prim::RaiseException, refused by namespace)"),
    "reduce_op": (True, "a collective's reduction (collectives are refused by namespace)"),
    "red_op": (True, "a collective's reduction (collectives are refused by namespace)"),
    "op_list": (True, "a collective's op list (collectives are refused by namespace)"),
    "filename": (False, "names a file"),
    "path": (False, "names a file"),
    "file": (False, "names a file"),
    "name": (False, "names a profiler range or a stored tensor"),
    "group_name": (False, "names a process group (communicates with other processes)"),
    "message": (False, "is text written out as a warning"),
    "msg": (False, "is text written out"),
    "tag": (False, "is an annotation recorded outside the graph"),
    "args": (False, "is text recorded by the profiler"),
}


def classify_schema(schema: Any) -> str | None:
    """Why an operator with this `torch.FunctionSchema` acts outside the graph, or None."""
    why = _named_effect(schema)
    if why is not None:
        return why
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if not schema.returns and not writes:
        return "returns nothing and writes no argument: it exists for an effect outside the graph"
    return None


def _named_effect(schema: Any) -> str | None:
    """Rules 1-3 but the last: the op names or takes something outside the graph."""
    ns = schema.name.partition("::")[0]
    if schema.name in EFFECT_OPS:
        return EFFECT_OPS[schema.name]
    if ns in EFFECT_NAMESPACES:
        return EFFECT_NAMESPACES[ns]
    text = str(schema)  # torch's schema object does not expose vararg-ness: read its text
    if "(...)" in text or text.endswith("-> ..."):
        return "takes a variable argument list (a TorchScript interpreter op)"
    for a in schema.arguments:
        kind = str(a.real_type)
        for pattern, why in EFFECT_ARG_TYPES.items():
            if pattern in kind:
                return why
        if kind in ("Generator", "Any") or kind.startswith("List[Any]"):
            return f"takes an argument of type {kind} (state outside the graph)"
        if "str" in kind:
            safe, why = STR_ARGS.get(a.name, (False, f"takes text ({a.name}) that ember has "
                                                    f"not reviewed"))
            if not safe:
                return f"{why} (argument {a.name})" if a.name in STR_ARGS else why
    return None


@functools.cache
def classify(op: Any) -> str | None:
    """Why a torch `OpOverload` acts outside the graph (e.g. "reads a file ..."), or None."""
    return classify_schema(op._schema)


@functools.cache
def capture_effect(op: Any) -> str | None:
    """Why user code's call of torch's own `op` must run eagerly rather than as a graph node
    (a graph break), or None. The rules of `classify` but the last: ops that return nothing
    only to check (`_assert_async`, `_linalg_check_errors`) are reached inside torch's own
    functions and stay capture's to handle; `_print` and `warn` are named in EFFECT_OPS."""
    return _named_effect(op._schema)


class EffectError(InterpretError):
    """An op with an effect outside the graph was about to run, and effects are not allowed."""


# ---- the switch -------------------------------------------------------------------------

_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("ember_ir_effects", default=False)


def effects_allowed() -> bool:
    """Whether ops with effects outside the graph may be verified and run here (default: no)."""
    return _ALLOWED.get()


@contextlib.contextmanager
def allow_effects(allowed: bool = True) -> Iterator[None]:
    """Within the block, verify and run ops with effects outside the graph (`--allow-effects`).
    Only for IR the caller trusts: `aten.from_file` then reads the file it names."""
    token = _ALLOWED.set(allowed)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def refusal(op_name: str, why: str) -> str:
    """The one-line error for an effectful op that was not allowed."""
    return (f"{op_name} {why}: ops with effects outside the graph are refused in IR from files "
            f"and text (pass --allow-effects, or use ember.ir.effects.allow_effects(), only "
            f"for IR you trust)")


def guard_reference(name: str, why: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (an op's reference), refusing to run unless effects are allowed."""

    def reference(interp: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if not effects_allowed():
            raise EffectError(refusal(name, why))
        return fn(interp, args, kwargs)

    return reference
