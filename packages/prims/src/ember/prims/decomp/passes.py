"""The `decompose` pass: aten ops -> prims, by a decomposition table, and the `to-prims`
pipeline (decompose, then clean up)."""

from __future__ import annotations

import functools
from typing import Any

from ember.ir import Builder, Graph, Module, Node, ScalarType, TensorType, Value
from ember.ir.expr import evaluate
from ember.ir.graph import map_args
from ember.ir.passes import PipelineError, register_pass, register_pipeline
from ember.ir.registry import EMBER_DIALECTS, OpRegistry
from ember.ir.torch_ops import resolve
from ember.ir.types import Type
from ember.ir.verifier import types_equal
from ember.prims.decomp.context import DecompContext, DecompositionError, runtime_scalar_error
from ember.prims.decomp.random import PhiloxState
from ember.prims.decomp.table import (
    DecompositionTable,
    active_table,
    decomposition_table,
    values_of,
)
from ember.prims.rules import is_number

# Fused attention kernels a backend may keep as one extern call (inductor on CPU, as
# TorchInductor does: torch's flash kernel beats matmul + softmax + matmul ~1.4x), only without
# dropout (eager's random numbers cannot be matched: dropout decomposes to philox). The
# backward kernel is what the forward's VJP rule emits on the training path (it recomputes the
# probabilities from the saved logsumexp instead of saving them); op -> dropout_p's position.
FUSED_ATTENTION_DROPOUT = {"aten._scaled_dot_product_flash_attention_for_cpu.default": 3,
                           "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": 6}
FUSED_ATTENTION = tuple(FUSED_ATTENTION_DROPOUT)
# The CUDA forms (what sdpa dispatches to on a GPU), kept whole by keep_cuda_attention=true (the
# CUDA target's front end: torch's fused kernel as one extern instead of two GEMMs, a softmax
# kernel and head copies), without dropout and with static shapes only (the target pads a bias
# whose rows are not 16-element aligned, which needs its sizes); op -> dropout_p's position.
FUSED_ATTENTION_CUDA_DROPOUT = {"aten._scaled_dot_product_flash_attention.default": 3,
                                "aten._scaled_dot_product_efficient_attention.default": 5,
                                "aten._scaled_dot_product_cudnn_attention.default": 5}
FUSED_ATTENTION_CUDA = tuple(FUSED_ATTENTION_CUDA_DROPOUT)
# Their backward kernels, what the forms' VJP rules emit on the training path
# (autograd/vjp/attention_cuda.py): kept with the forward by keep_cuda_attention=true (the CUDA
# target lowers them to extern calls); op -> dropout_p's position.
FUSED_ATTENTION_CUDA_BACKWARD_DROPOUT = {
    "aten._scaled_dot_product_flash_attention_backward.default": 10,
    "aten._scaled_dot_product_efficient_attention_backward.default": 9,
    "aten._scaled_dot_product_cudnn_attention_backward.default": 13}

# torch's own operator namespaces; an operator of any other (a `torch.library` custom op) has
# no decomposition unless a table gives one: it stays one opaque op, typed by its fake kernel,
# that every backend runs through torch (the inductor as an extern call, like matmul).
_TORCH_NAMESPACES = frozenset({"aten", "quantized", "_quantized", "inductor", "higher_order",
                               "rngprims", "debugprims", "prim", "profiler"})


# aten ops with no decomposition that stay whole the same way: grouped matmul (the kernel of
# transformers' mixture-of-experts layers in bf16; torch's inductor keeps it whole too)
KEPT_WHOLE = frozenset({"aten._grouped_mm.default"})


def is_custom_op(name: str) -> bool:
    """Whether IR op `name` is a torch operator outside torch's own namespaces (or one of the
    aten ops of KEPT_WHOLE)."""
    if name in KEPT_WHOLE:
        return True
    ns = name.split(".", 1)[0]
    if ns in EMBER_DIALECTS or ns in _TORCH_NAMESPACES:
        return False
    from ember.ir.torch_ops import resolve

    return resolve(name) is not None


@register_pass("decompose", "lower aten (and other torch) ops to ember's prims; "
               "keep_attention=true keeps torch's fused CPU attention (no dropout) as one op; "
               "keep_cuda_attention=true its CUDA forms (no dropout, static shapes); "
               "table=NAME picks a registered decomposition table (default: 'default', or "
               "compile()'s)")
def decompose(module: Module, *, keep_unsupported: bool = False, keep_attention: bool = False,
              keep_cuda_attention: bool = False, table: str = "",
              registry: OpRegistry) -> Module:
    if table:
        try:
            chosen = decomposition_table(table)
        except KeyError as e:
            raise PipelineError(f"decompose: {e.args[0]}") from None
    else:
        chosen = active_table()
    return decompose_module(module, chosen, keep_unsupported=keep_unsupported,
                            keep_attention=keep_attention,
                            keep_cuda_attention=keep_cuda_attention)


TO_PRIMS = "decompose,cse,dce"
register_pipeline("to-prims", TO_PRIMS, "aten -> ember's prims, then common subexpressions "
                  "and dead code removed")


def decompose_module(module: Module, table: DecompositionTable, *,
                     keep_unsupported: bool = False, keep_attention: bool = False,
                     keep_cuda_attention: bool = False) -> Module:
    out = module.clone()
    for g in out.graphs.values():
        _decompose_graph(out, g, table, keep_unsupported, keep_attention, keep_cuda_attention)
    return out


def _kept_cuda_attention(n: Node) -> bool:
    static = all(isinstance(d, int) for v in n.operands() if isinstance(v.type, TensorType)
                 for d in v.type.shape)
    return static and (n.op in FUSED_ATTENTION_CUDA_DROPOUT
                       or n.op in FUSED_ATTENTION_CUDA_BACKWARD_DROPOUT) \
        and _kept_attention(n)


def _kept_attention(n: Node) -> bool:
    at = FUSED_ATTENTION_DROPOUT.get(n.op, FUSED_ATTENTION_CUDA_DROPOUT.get(
        n.op, FUSED_ATTENTION_CUDA_BACKWARD_DROPOUT.get(n.op)))
    if at is None:
        return False
    at = _dropout_position(n.op, at)
    dropout = n.args[at] if len(n.args) > at else n.kwargs.get("dropout_p", 0.0)
    return dropout in (0, 0.0, None)


@functools.cache
def _dropout_position(op: str, default: int) -> int:
    """dropout_p's position in the running torch's schema of `op` (schemas move between torch
    versions); the table's where torch has no such op."""
    ov = resolve(op)
    names = [a.name for a in ov._schema.arguments if not a.kwarg_only] if ov is not None else []
    return names.index("dropout_p") if "dropout_p" in names else default


def _decompose_graph(module: Module, g: Graph, table: DecompositionTable,
                     keep_unsupported: bool, keep_attention: bool = False,
                     keep_cuda_attention: bool = False) -> None:
    vmap: dict[Value, Any] = {}  # a Value, or a literal standing for a scalar result

    def sub(v: Value) -> Any:
        return vmap.get(v, v)

    hints = module.hints()
    b = Builder(module, taken=(v.name for v in g.values()))
    rng = PhiloxState(g, b)  # random ops share one seed/offset pair per graph
    for n in g.nodes:
        args = [map_args(a, sub) for a in n.args]
        kwargs = {k: map_args(a, sub) for k, a in n.kwargs.items()}
        if n.op.split(".", 1)[0] in EMBER_DIALECTS or (keep_unsupported and n.op not in table) \
                or (keep_attention and n.op in FUSED_ATTENTION_DROPOUT and _kept_attention(n)) \
                or (keep_cuda_attention and _kept_cuda_attention(n)) \
                or (n.op not in table and is_custom_op(n.op)):
            n.args, n.kwargs = args, kwargs  # the module is a clone: editing in place is fine
            b.nodes.append(n)
            continue
        if n.op not in table:
            where = f" (line {n.pos.line})" if n.pos else ""
            raise DecompositionError(
                f"ember.prims: no decomposition for {n.op}{where}; keep such ops with "
                f"decompose{{keep_unsupported=true}}")
        _refuse_runtime_sizes(n, args, kwargs)
        b.loc = n.loc  # provenance: every emitted prim points at the source of its aten op
        results = _results(n, table.apply(DecompContext(b, n, table, rng), n.op, args, kwargs))
        _check_results(n, results, hints)
        vmap.update(zip(n.results, results, strict=True))
    g.nodes = b.nodes
    rng.finish()  # adds %philox_seed, %philox_offset and attrs(philox=...) if a random op ran
    literal = [o.name for o in g.outputs if not isinstance(sub(o), Value)]
    if literal:
        raise DecompositionError(f"@{g.name} returns %{literal[0]}, a scalar its op's "
                                 f"decomposition gives as a literal (prims make no scalars)")
    g.outputs = [sub(o) for o in g.outputs]
    g.result_types = [t if types_equal(t, o.type) else o.type
                      for t, o in zip(g.result_types, g.outputs, strict=True)]


# schema types of operands that decompositions read as sizes, dims or indices (literals or size
# expressions); `Scalar` operands are values computed on (arange checks its own)
_SIZE_KINDS = ("int", "SymInt")


def _refuse_runtime_sizes(n: Node, args: list[Any], kwargs: dict[str, Any]) -> None:
    """A scalar graph value (a parameter `%n: i64`, an `item()`) where the op's schema takes an
    int: its value is known only at run time, and a decomposition would trust the declared
    result shape instead (arange of `%n` declared f32[100000] made 100000 elements)."""
    from ember.ir.torch_ops import resolve

    op = resolve(n.op)
    if op is None:
        return
    for i, a in enumerate(op._schema.arguments):
        kind = str(a.real_type).replace("Optional[", "").replace("List[", "").rstrip("]?")
        if kind not in _SIZE_KINDS:  # int, int?, int[], SymInt[], int[]? ...
            continue
        v = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
        for x in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(x, Value) and isinstance(x.type, ScalarType):
                raise runtime_scalar_error(n.op, a.name, x)


def _results(n: Node, out: Any) -> list[Any]:
    """A decomposition's results: Values, except that a scalar result (a size, say) may be a
    number or size expression; the result's uses then take it as a literal."""
    items = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(items) != len(n.results) or all(isinstance(v, Value) for v in items):
        return values_of(out)
    for i, (r, v) in enumerate(zip(n.results, items, strict=True)):
        if not isinstance(v, Value) and not (isinstance(r.type, ScalarType) and is_number(v)):
            raise DecompositionError(f"decomposition of {n.op}: result {i} is {v!r}, not a "
                                     f"value (only scalar results may be literals)")
    return items


def _check_results(n: Node, results: list[Any], hints: dict[str, int]) -> None:
    """A decomposition must produce exactly the node's declared types (at the symbols' hints
    where either side is symbolic): a mismatch is a bug in the decomposition."""
    if len(results) != len(n.results):
        raise DecompositionError(f"decomposition of {n.op} gave {len(results)} results, the "
                                 f"node has {len(n.results)}")
    for i, (want, got) in enumerate(zip(n.results, results, strict=True)):
        if not isinstance(got, Value):
            continue  # a literal scalar, checked by _results
        if not _same_at_hints(want.type, got.type, hints):
            raise DecompositionError(f"decomposition of {n.op}: result {i} is {got.type}, the "
                                     f"node declares {want.type}")


def _same_at_hints(a: Type, b: Type, hints: dict[str, int]) -> bool:
    if types_equal(a, b):
        return True
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)):
        return False
    if (a.dtype, a.rank, a.device) != (b.dtype, b.rank, b.device):
        return False
    try:
        return all(evaluate(x, hints) == evaluate(y, hints)
                   for x, y in zip(a.shape, b.shape, strict=True))
    except Exception:
        return False
