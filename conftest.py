"""Repository-wide pytest setup: the hypothesis profiles.

Pick one with HYPOTHESIS_PROFILE (default `dev`; `python3 dev.py test` uses `ci`, `python3 dev.py
fuzz` uses `fuzz`). Deadlines are off everywhere: a torch op's first call (kernel selection,
lazy init) is slow enough to trip them at random. A failure prints its reproducer blob.

`ci` is derandomized: CI draws the same examples on every run, so a red run means a change broke
something, never that this run's draw found an old edge case (eager's own conventions at kinks,
NaN and infinities keep turning up). Exploring is the job of `dev` (random draws on every local
run) and `fuzz`; what they find is fixed or listed with its reason.

It also decides, before any test module imports triton, how this process runs Triton kernels:
in the interpreter, or launched on a GPU with EMBER_TEST_CUDA=1 (ember.testing.triton_mode).
"""

import os

from hypothesis import HealthCheck, settings

import ember.testing.triton_mode  # noqa: F401  (sets TRITON_INTERPRET for the whole process)

settings.register_profile(
    "ci",
    max_examples=50,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None, print_blob=True)
settings.register_profile(
    "fuzz",
    max_examples=100_000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
