"""Testing support for every layer: the op database, its hypothesis strategies and the
generic checks. Needs hypothesis (ember-prims[test]); imported by tests only."""
