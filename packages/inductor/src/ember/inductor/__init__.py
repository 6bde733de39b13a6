"""ember.inductor: loop-level IR, fusion, Triton (GPU) and C++ (CPU) codegen (TorchInductor's job).

Skeleton: not built yet, see issues.
"""
