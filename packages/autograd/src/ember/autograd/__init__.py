"""ember.autograd: joint forward/backward graphs and partitioning (AOTAutograd's job).

- `ember.autograd.vjp`: one VJP rule per differentiable prim (`@vjp`), one reason per prim
  without a derivative (`NO_DERIVATIVE`);
- `ember.autograd.joint`: `joint_graph` (forward + backward in one graph), `split_joint`
  (`@forward` returning the values `@backward` reads), `build_joint`, and the `joint` pass.

The min-cut partitioner and the bridge to `torch.autograd` come next (issue 14).
"""

import ember.prims  # noqa: F401  (registers the prims the rules emit)
from ember.autograd.joint import build_joint, joint_graph, joint_pass, split_joint
from ember.autograd.vjp import NO_DERIVATIVE, VJP_RULES, VJPContext, VJPError, vjp

__all__ = ["NO_DERIVATIVE", "VJP_RULES", "VJPContext", "VJPError", "build_joint",
           "joint_graph", "joint_pass", "split_joint", "vjp"]
