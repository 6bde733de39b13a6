"""An example ember plugin: gelu decomposed through erfc (not erf), a fusion pass that never
fuses a reduction into its readers, the pipeline `example` that uses both, a lowering table
`example-no-exp` (exp left to an extern call, not a loop), and two backends:
`example` (that pipeline, compiled to C++ under the inductor's policy) and `example-interp` (the
backend protocol written out: prepare once, then a runner per call)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import ember.inductor  # noqa: F401  (the inductor's passes: fuse, lower-loops, ...)
from ember.inductor.fusion import fuse
from ember.inductor.lowering import LOWERINGS
from ember.ir import Interpreter, Module, RunResult, Value
from ember.ir.backends import Backend, Runner
from ember.ir.passes import NamedPipeline, run_pipeline
from ember.ir.passes.manager import make_pass
from ember.prims.decomp import DECOMPOSITIONS, DecompContext
from ember.prims.decomp.pointwise import opmath
from ember.runtime.backends import pipeline_backend


def gelu_erfc(ctx: DecompContext, self: Value, approximate: str = "none") -> Value:
    """gelu(x) = x * Phi(x) = x * 0.5 * erfc(-x / sqrt(2)), for approximate="none"."""
    if approximate != "none":
        exact: Value = DECOMPOSITIONS.apply(ctx, "aten.gelu.default", [self],
                                            {"approximate": approximate})
        return exact
    x = ctx.convert(self, opmath(ctx.out_dtype()))
    cdf = ctx.prim("mul", 0.5, ctx.prim("erfc", ctx.prim("mul", x, -math.sqrt(0.5))))
    return ctx.convert(ctx.prim("mul", x, cdf), ctx.out_dtype())


# a variant of ember's own table differing in one op; ember's table is left as it was
GELU_ERFC = DECOMPOSITIONS.copy("example-erfc").replace("aten.gelu.default", gelu_erfc)


# a lowering table: ember's rules but exp's, so prims.exp stays an extern call (torch's exp)
# instead of a loop; `lower-loops{table=example-no-exp}` picks it
EXP_EXTERN = {k: v for k, v in LOWERINGS.items() if k != "prims.exp"}


def _fuse_pointwise_only(module: Module, *, max_nodes: int = 64) -> Module:
    return fuse(module, max_nodes=max_nodes, reductions=False)


FUSE_POINTWISE_ONLY = make_pass(
    "example-fuse", "fuse, but never a reduction with its producers or readers",
    _fuse_pointwise_only)

PIPELINE = NamedPipeline(
    "example", "decompose{keep_attention=true,table=example-erfc},cse,dce,lower-loops,"
    "example-fuse,codegen-cpp,plan-buffers",
    "the inductor pipeline with gelu through erfc and no reduction fusion")

# a backend that is a pipeline: compile() runs it as it runs ember's inductor (options,
# fallbacks, explain notes, EMBER_DUMP's NAME.kernels.ir and dump_each stages)
BACKEND = pipeline_backend("example", "the pipeline `example` compiled to C++ kernels "
                           "(gelu through erfc, no reduction fusion)", "example")


def _prepare_interp(module: Module, example_inputs: Sequence[Any] | None,
                    options: Mapping[str, Any]) -> Runner:
    """The protocol by hand: lower once (here: to prims with this plugin's table), then run
    each call's graph on the reference interpreter."""
    prims = run_pipeline(module, "decompose{table=example-erfc},cse,dce")
    interp = Interpreter(prims, check_types=False)

    def run(graph: str | None, inputs: Sequence[Any]) -> RunResult:
        return interp.run(inputs, graph)

    return run


INTERP_BACKEND = Backend("example-interp", "prims with the table example-erfc, on the "
                         "reference interpreter", _prepare_interp)
