"""ember.capture: Python bytecode -> aten-level graph + guards (TorchDynamo's job).

`capture(fn, args, kwargs)` executes the function's CPython bytecode symbolically (3.11 and
3.12), records the tensor operations it reaches as `aten.*` nodes (run on fake tensors under a
dispatch mode), and returns a `Captured` (an ir-v1 module with one graph, how to build its
inputs from the call, how to rebuild the return value, and the guards that keep it valid) or an
`Unhandled` naming the construct it stopped at and the user's source line.
"""

from ember.capture.capture import capture, graph_name, target_code
from ember.capture.errors import Unhandled
from ember.capture.guards import Guard, GuardKind, TensorMeta
from ember.capture.result import (
    Captured,
    OutConst,
    OutDict,
    OutObject,
    OutSeq,
    OutSource,
    OutSpec,
    OutTensor,
)
from ember.capture.sources import Source, describe, param_name

__all__ = [
    "Captured", "Guard", "GuardKind", "OutConst", "OutDict", "OutObject", "OutSeq", "OutSource",
    "OutSpec", "OutTensor", "Source", "TensorMeta", "Unhandled", "capture", "describe",
    "graph_name", "param_name", "target_code",
]
