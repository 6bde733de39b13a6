"""Repository tooling for ember: the dev bootstrap and the source scans used by the repo tests.

A regular package (not a namespace) so that the repo's `tools` wins over any installed `tools`.
"""
