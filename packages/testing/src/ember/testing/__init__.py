"""ember.testing: the op database, its hypothesis strategies and the generic checks, for the
tests of every layer. A distribution of its own (ember-testing), never inside the installed
library: the layers whose tests use it declare it as their `test` extra (ember-prims[test],
...), and the dev set-up (tools/bootstrap.py) installs it."""
