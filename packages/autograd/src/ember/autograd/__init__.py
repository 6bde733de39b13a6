"""ember.autograd: joint forward/backward graphs and partitioning (AOTAutograd's job).

Skeleton: not built yet, see issues.
"""
