"""tests/security's shared fixture: `kernel_cache`, a fresh compiled-kernel cache directory for
one test module (EMBER_CACHE_DIR; never ~/.cache, never another module's), the old value back
after. Modules whose every test compiles use it with `pytestmark`."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("ember-cache")
    old = os.environ.get("EMBER_CACHE_DIR")
    os.environ["EMBER_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("EMBER_CACHE_DIR", None)
    else:
        os.environ["EMBER_CACHE_DIR"] = old
