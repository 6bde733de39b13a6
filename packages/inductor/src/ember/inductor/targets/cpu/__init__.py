"""The CPU target: C++/OpenMP kernels built by g++ (docs/inductor.md).

Registers, for device kind "cpu": the `cpp` loader (codegen.py: g++ through the compile cache,
cache.py), the pipelines `inductor-cpu` (prims -> kernels.*: `cache-inplace` (a static KV
cache's rows written in place, targets/cuda/inplace.py), `window-reduce` (pool.py: pooling's
stacked windows as elementwise chains), `group-linears` (group_linear.py: the linears of one
input as one product by their concatenated weights), `conv-nhwc`, the target-neutral
`lower-loops` and `fuse`, `schedule-cpu` (schedule.py: the kernels' schedules as attributes),
`codegen-cpp`, `plan-buffers`) and `inductor` (its front end
`decompose{keep_attention=true},cse,dce`, then `inductor-cpu`), and its lowering rules: the
channels-last convolution (conv.py) and the fused CPU attention kept as one extern call
(`keep_attention=true` keeps it through decompose; attention.py: ember's kernel, flash.py,
where it serves, else torch's flash kernel, as TorchInductor calls).
"""

from __future__ import annotations

from typing import Any

from ember.inductor.fusion import RECOMPUTE_NODES
from ember.inductor.launch import register_loader
from ember.inductor.targets import FusionHooks, Rule, register_target
from ember.inductor.targets.cpu.attention import BACKWARD as ATTENTION_BACKWARD
from ember.inductor.targets.cpu.attention import FORWARD as ATTENTION_FORWARD
from ember.inductor.targets.cpu.attention import lower_attention, lower_attention_backward
from ember.inductor.targets.cpu.broadcast import broadcast_veto
from ember.inductor.targets.cpu.codegen import load_cpp
from ember.inductor.targets.cpu.conv import CONV_OP, lower_conv2d
from ember.inductor.targets.cpu.conv_backward import lower_conv_backward
from ember.inductor.targets.cpu.gather import gather_veto
from ember.inductor.targets.cpu.group_linear import lower_matmul
from ember.inductor.targets.cpu.multipass import multipass_veto
from ember.inductor.targets.cpu.pool import window_reduce as _window_reduce  # noqa: F401
from ember.inductor.targets.cpu.schedule import schedule_cpu as _schedule  # noqa: F401
from ember.ir import Graph, Module, Node
from ember.ir.passes import register_pipeline
from ember.prims.decomp.passes import FUSED_ATTENTION

FRONT = "decompose{keep_attention=true},cse,dce"
INDUCTOR_CPU = register_pipeline(
    "inductor-cpu",
    "cache-inplace,dce,window-reduce,group-linears,conv-nhwc,lower-loops,fuse,schedule-cpu,"
    "codegen-cpp,plan-buffers",
    "prims -> loop kernels, fused, scheduled, as C++ kernel blocks with planned buffers (CPU)"
).text
# compile()'s default on CPU graphs: the inductor backend runs the pipeline of the graph's
# device's target, which for the CPU is this one
DEFAULT_PIPELINE = register_pipeline(
    "inductor", f"{FRONT},inductor-cpu",
    "compile()'s default: aten -> prims (fused CPU attention kept) -> C++ kernels").text


def _attention(lw: Any, n: Node) -> None:
    """Torch's fused CPU attention (kept by decompose{keep_attention=true}): one extern call
    on strided views of q, k, v."""
    lw.passthrough(n, n.op)


# the convolution gradients of training (prims.convolution's VJP rule): torch's backward kernel
CONV_BACKWARD = "aten.convolution_backward.default"


def _extern(lw: Any, n: Node) -> None:
    """A torch kernel the front end keeps whole: one extern call on strided views."""
    lw.passthrough(n, n.op)


# torch.nonzero: its row count is an unbacked symbol the graph binds from the data (capture)
NONZERO = "aten.nonzero.default"

# a static KV cache's new rows written into the cache itself (`cache-inplace`, first in
# inductor-cpu: the op and the pass are targets/cuda/inplace.py's, target-neutral but the
# decode attention kernel); without it a decode step cloned each cache whole for the scatter
# and the runtime copied the result back
CACHE_ROWS = "loop.index_copy_inplace"


def _cache_rows(lw: Any, n: Node) -> None:
    """`index_copy_` into the cache, its rows a buffer of their own (the kernel computing the
    rows, rotary, writes them there)."""
    from ember.inductor.targets.cuda.inplace import lower_inplace  # (imported after this one)
    lower_inplace(lw, n)


# convolution gradients channels-last (conv_backward.py)
LOWERINGS: dict[str, Rule] = {CONV_OP: lower_conv2d, CONV_BACKWARD: lower_conv_backward,
                              NONZERO: _extern, CACHE_ROWS: _cache_rows,
                              # F.linear's x @ w.T on oneDNN's packed w (linear.py);
                              # group-linears' product of concatenated weights: one call
                              # (group_linear.py)
                              "prims.matmul": lower_matmul,
                              **{op: _attention for op in FUSED_ATTENTION}}
# the attention backward's gradients read where the kernel writes them ([B, L, H, E] buffers)
LOWERINGS[ATTENTION_BACKWARD] = lower_attention_backward
# and the forward's output and logsumexp, for a heads-last q (attention.py)
LOWERINGS[ATTENTION_FORWARD] = lower_attention

CPP_LOADER = register_loader("cpp", load_cpp, devices=("cpu",))
# recompute: a cheap multi-reader pointwise value (a training backward's x - mean, xhat, the
# masked cotangent) is inlined into its readers rather than written and read back (fusion.py)
# veto: a costly broadcast value (a squeeze-excitation gate, broadcast.py) or a costly value a
# multi-pass kernel reads in several passes (a GELU under a LayerNorm, multipass.py) is
# written once, as is a value gathered through index arithmetic that its reader would
# evaluate several times per element (Swin's window mask under a softmax, gather.py)


def _veto(m: Module, g: Graph, producer: Node, consumer: Node) -> str | None:
    return broadcast_veto(m, g, producer, consumer) \
        or multipass_veto(m, g, producer, consumer) \
        or gather_veto(m, g, producer, consumer)


CPU = register_target("cpu", "inductor-cpu", "cpp", lowerings=LOWERINGS, front=FRONT,
                      fusion=FusionHooks(recompute=RECOMPUTE_NODES, veto=_veto),
                      description="C++/OpenMP kernels built by g++")

__all__ = ["CPU", "DEFAULT_PIPELINE", "FRONT", "INDUCTOR_CPU", "LOWERINGS"]
