"""ember.capture: Python bytecode -> aten-level graph + guards (TorchDynamo's job).

Skeleton: not built yet, see issues.
"""
