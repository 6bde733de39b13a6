"""ember.inductor: loop-level IR, fusion and C++ (CPU) codegen (TorchInductor's job).

Importing this package registers, in ember.ir's registries: the `loop` and `kernels` dialects,
the passes `lower-loops`, `fuse` and `codegen-cpp`, and the IR backend `inductor`
(decompose -> lower-loops -> fuse -> codegen-cpp -> run). See docs/inductor.md.
"""

import ember.prims  # noqa: F401  (the prims and the decompose pass)
from ember.inductor.loopir import register_loop_ops
from ember.ir import default_registry

register_loop_ops(default_registry())

from ember.inductor import lowering  # noqa: E402,F401  isort: skip
from ember.inductor import fusion  # noqa: E402,F401  isort: skip
from ember.inductor.kernels import register_backend, register_kernel_ops  # noqa: E402  isort: skip

register_kernel_ops(default_registry())
register_backend()
