"""The on-disk kernel cache: a second build hits; a corrupt entry is rebuilt, never loaded."""

from __future__ import annotations

import ctypes

from ember.inductor import cache
from ember.inductor.cpp import PRELUDE

SOURCE = PRELUDE + 'extern "C" int64_t ember_cache_probe(int64_t a) { return a * 7 + 1; }\n'


def _call(lib: ctypes.CDLL) -> int:
    fn = lib.ember_cache_probe
    fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_int64
    return int(fn(6))


def test_second_build_hits_and_corrupt_entry_is_rebuilt() -> None:
    src = SOURCE + "// cache test\n"
    builds, hits = cache.STATS.builds, cache.STATS.hits
    so = cache.build(src)
    assert cache.STATS.builds == builds + 1
    assert cache.build(src) == so and cache.STATS.hits == hits + 1
    assert cache.STATS.builds == builds + 1
    so.write_bytes(b"\x7fELF garbage")  # corrupt the cached library
    cache.forget_loaded()
    lib = cache.load(src)
    assert cache.cache_key(src) in cache.STATS.rejected
    assert cache.STATS.builds == builds + 2
    assert _call(lib) == 43


def test_key_covers_source_and_flags() -> None:
    assert cache.cache_key(SOURCE) != cache.cache_key(SOURCE + " ")
    assert "-fopenmp" in cache.flags() and cache.compiler_id() and "torch" in cache.versions()
