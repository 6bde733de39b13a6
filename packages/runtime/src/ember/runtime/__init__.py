"""ember.runtime: compile(), guards at call time, caches, kernel launch, and the `ember` CLI.

The top of the package DAG: it may import every other ember layer; no other layer imports it.
"""
