"""ember.autograd: joint forward/backward graphs and partitioning (AOTAutograd's job).

- `ember.autograd.vjp`: one VJP rule per differentiable prim (`@vjp`), one reason per prim
  without a derivative (`NO_DERIVATIVE`);
- `ember.autograd.joint`: `joint_graph` (forward + backward in one graph), `split_joint`
  (`@forward` returning the values `@backward` reads), `build_joint`, and the `joint` pass;
- `ember.autograd.partition`: the save-all, recompute-all and min-cut partitioners;
- `ember.autograd.stop`: the stop-gradient marker `detach` decomposes to on the training path;
- `ember.autograd.buckets`: `split_buckets` and the `split-buckets` pass, which cut a graph at
  DDP's gradient buckets (so its all-reduce overlaps the backward).

The runtime bridge to `torch.autograd` is ember.runtime.training (docs/autograd.md).
"""

import ember.prims  # noqa: F401  (registers the prims the rules emit)
from ember.autograd.buckets import split_buckets, split_buckets_pass
from ember.autograd.joint import (
    build_joint,
    joint_graph,
    joint_pass,
    partition_joint,
    split_joint,
)
from ember.autograd.partition import POLICIES, PartitionReport
from ember.autograd.vjp import NO_DERIVATIVE, VJP_RULES, VJPContext, VJPError, vjp

__all__ = ["NO_DERIVATIVE", "POLICIES", "VJP_RULES", "PartitionReport", "VJPContext",
           "VJPError", "build_joint", "joint_graph", "joint_pass", "partition_joint",
           "split_buckets", "split_buckets_pass", "split_joint", "vjp"]
