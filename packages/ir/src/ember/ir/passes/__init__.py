"""Passes: named pure functions `Module -> Module`, in a registry, run as pipelines.

A pass is declared with `@register_pass(name, summary)` over a function whose keyword-only
parameters are its options (their annotations give the option types). Pipelines are strings,
`dce,cse,fuse{max_nodes=64}`; `register_pipeline(name, text, summary)` names one, and the name
then stands for its stages in any pipeline string. Third-party passes and pipelines register
through the entry point group `ember.passes` (each entry point names a `Pass`, a
`NamedPipeline`, or a callable that registers into the `PassRegistry`).
"""

from __future__ import annotations

from ember.ir.passes.manager import (
    NamedPipeline,
    Pass,
    PassRegistry,
    PipelineError,
    PipelineStage,
    PluginWarning,
    default_pass_registry,
    expand_pipeline,
    parse_pipeline,
    register_pass,
    register_pipeline,
    run_pipeline,
)

# Import the built-in passes so they register.
from ember.ir.passes import cse as _cse  # noqa: E402,F401  isort: skip
from ember.ir.passes import dce as _dce  # noqa: E402,F401  isort: skip

__all__ = [
    "NamedPipeline",
    "Pass",
    "PassRegistry",
    "PipelineError",
    "PipelineStage",
    "PluginWarning",
    "default_pass_registry",
    "expand_pipeline",
    "parse_pipeline",
    "register_pass",
    "register_pipeline",
    "run_pipeline",
]
