"""An example ember plugin: gelu decomposed through erfc (not erf), and a fusion pass that
never fuses a reduction into its readers, plus the pipeline `example` that uses both."""

from __future__ import annotations

import math

import ember.inductor  # noqa: F401  (the inductor's passes: fuse, lower-loops, ...)
from ember.inductor.fusion import fuse
from ember.ir import Module, Value
from ember.ir.passes import NamedPipeline
from ember.ir.passes.manager import make_pass
from ember.prims.decomp import DECOMPOSITIONS, DecompContext
from ember.prims.decomp.pointwise import opmath


def gelu_erfc(ctx: DecompContext, self: Value, approximate: str = "none") -> Value:
    """gelu(x) = x * Phi(x) = x * 0.5 * erfc(-x / sqrt(2)), for approximate="none"."""
    if approximate != "none":
        return DECOMPOSITIONS.apply(ctx, "aten.gelu.default", [self],
                                    {"approximate": approximate})
    x = ctx.convert(self, opmath(ctx.out_dtype()))
    cdf = ctx.prim("mul", 0.5, ctx.prim("erfc", ctx.prim("mul", x, -math.sqrt(0.5))))
    return ctx.convert(ctx.prim("mul", x, cdf), ctx.out_dtype())


# a variant of ember's own table differing in one op; ember's table is left as it was
GELU_ERFC = DECOMPOSITIONS.copy("example-erfc").replace("aten.gelu.default", gelu_erfc)


def _fuse_pointwise_only(module: Module, *, max_nodes: int = 64) -> Module:
    return fuse(module, max_nodes=max_nodes, reductions=False)


FUSE_POINTWISE_ONLY = make_pass(
    "example-fuse", "fuse, but never a reduction with its producers or readers",
    _fuse_pointwise_only)

PIPELINE = NamedPipeline(
    "example", "decompose{keep_attention=true,table=example-erfc},cse,dce,lower-loops,"
    "example-fuse,codegen-cpp,plan-buffers",
    "the inductor pipeline with gelu through erfc and no reduction fusion")
