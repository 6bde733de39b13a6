"""tests/security's shared fixture: `kernel_cache`, a fresh compiled-kernel cache directory for
one test module (EMBER_CACHE_DIR; never ~/.cache, never another module's), the old value back
after. Modules whose every test compiles use it with `pytestmark`."""

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("ember-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(d))
        yield d
