"""Moved to `ember.inductor.targets.cpu.cache` (the CPU target). This name stays importable and is
the same module object, so reading or patching it through either name is the same."""

import sys

from ember.inductor.targets.cpu import cache as _module
from ember.inductor.targets.cpu.cache import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _module
