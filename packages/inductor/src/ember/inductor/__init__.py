"""ember.inductor: loop-level IR, fusion and code generation per target (TorchInductor's job).

Importing this package registers, in ember.ir's registries: the `loop` and `kernels` dialects,
the target-neutral passes `lower-loops`, `fuse` and `plan-buffers`, the CPU target
(targets/cpu/: `conv-nhwc`, `codegen-cpp`, the `cpp` loader, the pipelines `inductor-cpu` and
`inductor`) and the IR backend `inductor` (the pipeline of the graph's device's target, then
run). See docs/inductor.md.
"""

import ember.prims  # noqa: F401  (the prims and the decompose pass)
from ember.inductor.loopir import register_loop_ops
from ember.ir import default_registry

register_loop_ops(default_registry())

from ember.inductor import lowering  # noqa: E402,F401  isort: skip
from ember.inductor import lowering_plugins  # noqa: E402,F401  isort: skip
from ember.inductor import fusion  # noqa: E402,F401  isort: skip
from ember.inductor.kernels import register_kernel_ops  # noqa: E402  isort: skip

register_kernel_ops(default_registry())

from ember.inductor.targets import cpu as _cpu  # noqa: E402,F401  isort: skip
from ember.inductor.targets import cuda as _cuda  # noqa: E402,F401  isort: skip
from ember.inductor.backend import register_backend  # noqa: E402  isort: skip

register_backend()
