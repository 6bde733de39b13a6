"""The CPU target's code generation and loading: the `codegen-cpp` pass and the `cpp` loader.

`codegen-cpp` turns each loop kernel into a `kernel @name cpp` block (its source between triple
quotes) and its node into `kernels.call(@name, bufs..., out_dtypes=, out_shapes=)` (see
kernels.py). `loop.extern` becomes `kernels.extern` (the prim's implementation through
Python, no libtorch headers). All `cpp` blocks of a module, in order, form one translation unit:
`@cpp_prelude` holds the helpers, each other block one `extern "C"` function named after it
(`sanitize.kernel_symbol`: `@f_k0` defines `ember_k_f_k0`). A kernel over symbolic sizes takes
the size symbols its code reads as `int64_t` arguments after its buffers, named by the call's
`sizes=[s0, ...]` (one library serves every size). A kernel the C++ tables cannot
express yet keeps its `loop.pointwise`/`loop.reduction` node and body (run by the reference),
with the reason in `attrs(cpp_fallback=...)` of that body. The `cpp` loader (`load_cpp`) builds
a module's blocks with g++ through the cache (cache.py), split into translation units compiled
in parallel; its kernels take their buffers' data addresses (ABI "pointer").
"""

from __future__ import annotations

import math
from typing import Any

from ember.inductor import buffers as _buffers  # noqa: F401  (registers plan-buffers)
from ember.inductor.body import SignMemo, body_names, body_signature
from ember.inductor.codegen import (
    assemble,
    call_node,
    extern_node,
    keep_on_reference,
    kernel_body,
    kernel_name,
    lower_graphs,
)
from ember.inductor.launch import LoadedKernel
from ember.inductor.sanitize import kernel_symbol
from ember.inductor.targets import require_device
from ember.inductor.targets.cpu import cache, trampoline
from ember.inductor.targets.cpu.cpp import PRELUDE, CodegenError
from ember.inductor.targets.cpu.inplace import inplace_inputs
from ember.inductor.targets.cpu.kernel import kernel_source_sizes
from ember.ir import (
    Graph,
    Kernel,
    Module,
    Node,
    Value,
)
from ember.ir.passes import register_pass

PRELUDE_NAME = "cpp_prelude"
KERNELS_PER_UNIT = 6  # kernels per translation unit before a module's C++ is split
# kernels whose integer division or modulo may divide by zero (they set the error flag)
_CHECKED_OPS = ("ember_div_trunc<", "ember_fmod<", "ember_pymod<")


def module_source(m: Module) -> str:
    return "\n".join(k.source for k in m.kernels.values() if k.lang == "cpp")


def module_units(m: Module, blocks: list[Kernel] | None = None) -> list[list[Kernel]]:
    """The module's kernel blocks split into translation units compiled in parallel: each
    unit is the prelude plus some kernels, in module order, at most one unit per compile job
    (and at least KERNELS_PER_UNIT kernels a unit). Kernels go to units by their source
    length (largest first, to the lightest unit) so the concurrent g++ processes finish
    together: the build takes as long as its slowest unit, and kernel sizes vary by 10x (a
    DenseNet's concatenations). Deterministic: the same module gives the same units, so the
    cache keyed by each unit's source finds them again."""
    blocks = [k for k in m.kernels.values() if k.lang == "cpp"] if blocks is None else blocks
    prelude = [k for k in blocks if k.name == PRELUDE_NAME]
    rest = [k for k in blocks if k.name != PRELUDE_NAME]
    if not rest:
        return []
    n = max(1, min(cache.jobs(), math.ceil(len(rest) / KERNELS_PER_UNIT)))
    load = [0] * n
    unit_of: dict[int, int] = {}
    for k in sorted(range(len(rest)), key=lambda k: (-len(rest[k].source), k)):
        u = min(range(n), key=lambda j: (load[j], j))
        unit_of[k] = u
        load[u] += len(rest[k].source)
    units: list[list[Kernel]] = [list(prelude) for _ in range(n)]
    for k, kern in enumerate(rest):
        units[unit_of[k]].append(kern)
    return [u for u in units if len(u) > len(prelude)]


def load_cpp(m: Module, blocks: list[Kernel]) -> dict[str, LoadedKernel]:
    """The `cpp` loader: build (or find in the cache) a module's C++ units, in parallel; kernel
    name -> its function (with the library's error-flag reader if it may divide by zero)."""
    units = module_units(m, blocks)
    libs = cache.load_all(["\n".join(k.source for k in u) for u in units])
    table: dict[str, LoadedKernel] = {}
    for unit, lib in zip(units, libs, strict=True):
        for k in unit:
            if k.name != PRELUDE_NAME:
                fn = _symbol(lib, k)
                fn.restype = None
                checks = any(op in k.source for op in _CHECKED_OPS)
                table[k.name] = LoadedKernel(fn, "pointer",
                                             lib.ember_take_errors if checks else None,
                                             fast=trampoline.caller)
    return table


def _symbol(lib: Any, k: Kernel) -> Any:
    """A kernel block's function: `kernel_symbol(name)` as codegen-cpp names it (never a libc
    or prelude name); a hand-written block (run only with --allow-kernels) or an older dump
    may define its plain name instead."""
    try:
        return lib[kernel_symbol(k.name)]
    except AttributeError:
        pass
    try:
        return lib[k.name]
    except AttributeError:
        raise CodegenError(f"kernel @{k.name}: its source defines no function "
                           f"{kernel_symbol(k.name)} (or {k.name})") from None


@register_pass("codegen-cpp", "loop IR -> kernels.* graph with C++ kernel blocks (one function "
               "per loop kernel)")
def codegen_cpp(module: Module) -> Module:
    src = module.clone()
    bodies = body_names(src)
    # C++ for CPU buffers only: a graph on another device is refused, never compiled for the CPU
    require_device(src, [g for g in src.graphs.values() if g.name not in bodies], "cpu",
                   "codegen-cpp")
    kernels: list[Kernel] = [Kernel(PRELUDE_NAME, "cpp", PRELUDE)]
    fallback: list[Graph] = []
    shared = _Shared()
    graphs = lower_graphs(src, lambda g: [_lower_node(src, g, n, kernels, fallback, shared)
                                          for n in g.nodes])
    return assemble(src, kernels if len(kernels) > 1 else [], graphs, fallback)


class _Shared:
    """The kernels made so far by what decides their C++: a loop node equal to an earlier one
    in everything but names (a transformer's repeated layers: CaiT's 24, Swin's blocks) calls
    that kernel instead of generating and compiling the same function again."""

    def __init__(self) -> None:
        # key -> name, sizes, inplace
        self.made: dict[tuple[object, ...], tuple[str, list[str], list[int]]] = {}
        self.sigs = SignMemo()  # body_signature's memo

    def key(self, m: Module, n: Node, body: Graph) -> tuple[object, ...]:
        """What kernel_source_sizes reads besides names and comments: the node's op, kwargs
        (ranges, schedule attributes) and types, and the body's structure with its nested
        reduction bodies (body_signature, parameter types included)."""
        return (n.op, repr(sorted(n.kwargs.items())), tuple(str(r.type) for r in n.results),
                tuple(str(a.type) if isinstance(a, Value) else repr(a) for a in n.args[1:]),
                body_signature(m.items, body, self.sigs))


def _lower_node(m: Module, g: Graph, n: Node, kernels: list[Kernel], fallback: list[Graph],
                shared: _Shared | None = None) -> Node:
    ext = extern_node(m, n)  # (a view: matmul reads the buffer as it is)
    if ext is not None:
        return ext
    body = kernel_body(m, n)
    if body is None:
        return n
    key = shared.key(m, n, body) if shared is not None else None
    if shared is not None and key in shared.made:
        name, sizes, inplace = shared.made[key]
        return _call(n, name, sizes, inplace)
    name = kernel_name(body, kernels)
    inplace = inplace_inputs(n, body)
    try:
        source, sizes = kernel_source_sizes(name, n, body, f"@{g.name}", m.items, m.symbols,
                                            inplace)
    except CodegenError as e:
        body.attrs["cpp_fallback"] = str(e)
        keep_on_reference(m, body, fallback)
        return n
    kernels.append(Kernel(name, "cpp", source))
    if shared is not None and key is not None:
        shared.made[key] = (name, sizes, inplace)
    return _call(n, name, sizes, inplace)


def _call(n: Node, name: str, sizes: list[str], inplace: list[int]) -> Node:
    """`n` as the call of kernel @name (taking the size symbols `sizes` after its buffers;
    `inplace`: per output, the operand whose storage it may take, -1 for none)."""
    # plan-buffers may write an output over its operand `inplace` names
    return call_node(n, name, n.args[1:], sizes,
                     {"inplace": list(inplace)} if any(k >= 0 for k in inplace) else None)


