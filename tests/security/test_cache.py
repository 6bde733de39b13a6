"""Issue 19 #4 and #14: the kernel cache directory is private to its user, and a read-only or
malformed cache never breaks compilation.

The digest in an entry's .json detects corruption only (anyone who can write the directory can
recompute it); the permission checks keep other users' files out. Tests may run as root, where
mode bits do not stop writes: the trust decision is on owner and mode bits (checked for real),
and read-only directories are made immutable with `chattr +i` as root (skipped where that is
not allowed).
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.runtime as er
from ember.inductor import cache
from ember.runtime import guardvm, tensorcheck


def _source(tag: str, value: int = 7) -> str:
    # a tiny translation unit (not the kernels' prelude): each build here is a quick g++ run
    return ('#include <cstdint>\nextern "C" int64_t ember_cache_probe(int64_t a) '
            f'{{ return a * {value} + 1; }}\n// {tag}\n')


def _call(lib: ctypes.CDLL) -> int:
    fn = lib.ember_cache_probe
    fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_int64
    return int(fn(6))


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    cache.forget_loaded()
    cache._WARNED.clear()
    yield root
    cache.forget_loaded()


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@contextmanager
def read_only(d: Path) -> Iterator[None]:
    """`d` made unwritable: mode 0555, or as root (which mode bits do not stop) immutable."""
    if os.geteuid() != 0:
        d.chmod(0o555)
        try:
            yield
        finally:
            d.chmod(0o700)
        return
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("running as root and `chattr +i` is not allowed: no read-only directory")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(d)], check=True)


# -- #4: a private directory ----------------------------------------------------------------
def test_cache_dir_is_created_0700_and_entries_0600(cache_root: Path) -> None:
    lib = cache.load(_source("fresh"))
    assert _call(lib) == 43
    d = cache_root / "inductor"
    assert _mode(cache_root) == 0o700 and _mode(d) == 0o700
    files = sorted(d.iterdir())
    assert files and all(_mode(f) == 0o600 for f in files), [(f, oct(_mode(f))) for f in files]


@pytest.mark.parametrize("dir_mode", [0o777, 0o770])
def test_swapped_library_in_a_shared_dir_is_not_loaded(cache_root: Path, dir_mode: int) -> None:
    """The issue's reproducer: another library moved into the entry with its digest
    recomputed. In a directory others can write, it is never loaded (a CacheWarning says why);
    the kernels are compiled into a private temporary directory instead."""
    src = _source(f"swap {dir_mode:o}")
    so = cache.build(src)
    evil = cache.build(_source("evil", value=1000))  # another library: returns 6001
    so.write_bytes(evil.read_bytes())
    meta = so.with_suffix(".json")
    meta.write_text(json.dumps({"sha256": cache.hashlib.sha256(so.read_bytes()).hexdigest()}))
    d = cache_root / "inductor"
    d.chmod(dir_mode)
    cache.forget_loaded()
    with pytest.warns(cache.CacheWarning, match="writable by group or others") as got:
        lib = cache.load(src)
    assert _call(lib) == 43  # the real kernel, compiled afresh
    assert len(got) == 1 and "\n" not in str(got[0].message)
    assert cache.STATS.hits >= 0 and Path(lib._name).parent != d  # not the untrusted dir


def test_swapped_library_with_recomputed_digest_loads_in_a_private_dir(cache_root: Path) -> None:
    """What the digest does not protect against, by design: in the user's own private
    directory, a swap by the user (with the digest recomputed) is the user's choice."""
    src = _source("own swap")
    so = cache.build(src)
    evil = cache.build(_source("own evil", value=1000))
    so.write_bytes(evil.read_bytes())
    so.with_suffix(".json").write_text(json.dumps(
        {"sha256": cache.hashlib.sha256(so.read_bytes()).hexdigest()}))
    cache.forget_loaded()
    assert _call(cache.load(src)) == 6001


@pytest.mark.parametrize("bad", ["group-writable", "other-writable", "symlink", "other-owner"])
def test_untrusted_entry_file_is_refused_and_rebuilt(cache_root: Path, bad: str) -> None:
    src = _source(f"entry {bad}")
    so = cache.build(src)
    if bad == "group-writable":
        so.chmod(0o620)
    elif bad == "other-writable":
        so.with_suffix(".json").chmod(0o602)
    elif bad == "symlink":
        real = so.with_name("elsewhere.so")
        so.rename(real)
        so.symlink_to(real)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(so, 4242, -1)
    cache.forget_loaded()
    rejected = len(cache.STATS.refused)
    with pytest.warns(cache.CacheWarning, match="is not loaded"):
        lib = cache.load(src)
    assert _call(lib) == 43 and len(cache.STATS.refused) == rejected + 1
    # rebuilt in place (the directory is the user's): a regular file, the user's, 0600
    st_ = os.lstat(so)
    assert stat.S_ISREG(st_.st_mode) and st_.st_uid == os.geteuid()
    assert stat.S_IMODE(st_.st_mode) == 0o600


def test_cache_dir_owned_by_another_user_is_not_used(cache_root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    d = cache_root / "inductor"
    d.mkdir(parents=True, mode=0o700)
    os.chown(d, 4242, 4242)
    with pytest.warns(cache.CacheWarning, match="owned by uid 4242"):
        assert _call(cache.load(_source("other owner"))) == 43
    assert not list(d.iterdir())


def test_parent_writable_by_others_is_refused_unless_sticky(cache_root: Path) -> None:
    """Someone who can write a parent could move the cache aside and put their own in its
    place; a sticky parent (as /tmp) does not allow that."""
    cache_root.mkdir(mode=0o700)
    cache_root.chmod(0o777)
    with pytest.warns(cache.CacheWarning, match="writable by group or others"):
        assert _call(cache.load(_source("parent 777"))) == 43
    assert not list((cache_root / "inductor").iterdir())
    cache_root.chmod(0o1777)  # sticky: only the owner may rename the cache directory
    cache.forget_loaded()
    with warnings.catch_warnings():
        warnings.simplefilter("error", cache.CacheWarning)
        assert _call(cache.load(_source("parent sticky"))) == 43
    assert list((cache_root / "inductor").glob("*.so"))


def test_cache_dir_that_is_a_file_compiles_privately(cache_root: Path) -> None:
    cache_root.write_text("not a directory")
    with pytest.warns(cache.CacheWarning, match="is not used"):
        assert _call(cache.load(_source("file root"))) == 43


@settings(max_examples=200, deadline=None)
@given(mode=st.integers(0, 0o7777), owner=st.sampled_from([0, 1000, 4242]),
       uid=st.sampled_from([0, 1000]), holder=st.booleans())
def test_trust_decision(mode: int, owner: int, uid: int, holder: bool) -> None:
    """The permission decision itself: the cache directory and entry files must be the user's
    and writable by nobody else; a directory above may be root's, and writable by others only
    when sticky."""
    st_ = os.stat_result((stat.S_IFDIR | mode, 0, 0, 1, owner, 0, 0, 0, 0, 0))
    why = cache.distrust(st_, uid, holder=holder)
    owned = owner == uid or (not holder and owner == 0)
    shared = bool(mode & 0o022) and (holder or not mode & stat.S_ISVTX)
    assert (why is None) == (owned and not shared), (oct(mode), owner, uid, holder, why)


# -- #14: read-only and malformed caches ----------------------------------------------------
def test_read_only_cache_with_every_entry_loads_them(cache_root: Path) -> None:
    srcs = [_source(f"ro {i}") for i in range(2)]
    cache.load_all(srcs)
    d = cache_root / "inductor"
    cache.forget_loaded()
    before = sorted(p.name for p in d.iterdir())
    with read_only(d), warnings.catch_warnings():
        warnings.simplefilter("error", cache.CacheWarning)  # nothing to say: all entries hit
        libs = cache.load_all(srcs)
    assert [_call(x) for x in libs] == [43, 43]
    assert all(Path(x._name).parent == d for x in libs)
    assert sorted(p.name for p in d.iterdir()) == before


def test_read_only_cache_missing_an_entry_compiles_elsewhere(cache_root: Path) -> None:
    have, new = _source("ro have"), _source("ro missing", value=3)
    cache.load(have)
    d = cache_root / "inductor"
    cache.forget_loaded()
    before = sorted(p.name for p in d.iterdir())
    with read_only(d), pytest.warns(cache.CacheWarning, match="compiled into a private"):
        a, b = cache.load_all([have, new])
    assert (_call(a), _call(b)) == (43, 19)
    assert Path(a._name).parent == d and Path(b._name).parent != d
    assert _mode(Path(b._name).parent) == 0o700
    assert sorted(p.name for p in d.iterdir()) == before


def test_unwritable_cache_found_only_on_write_compiles_elsewhere(
        cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the access check says writable but writing fails (as for root on a read-only
    mount), the build still succeeds, in the private directory."""
    d = cache_root / "inductor"
    real_mkdtemp = cache.tempfile.mkdtemp

    def refuse(*a: object, dir: str | None = None, **k: object) -> str:
        if dir is not None and Path(dir) == d:
            raise PermissionError(13, "Permission denied", dir)
        return real_mkdtemp(*a, dir=dir, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(cache.tempfile, "mkdtemp", refuse)
    with pytest.warns(cache.CacheWarning, match="not writable"):
        assert _call(cache.load(_source("write fails"))) == 43


@pytest.mark.parametrize("text", ["[]", "42", '{"sha256": 5}', "{not json"])
def test_malformed_entry_json_is_a_miss_and_is_rebuilt(cache_root: Path, text: str) -> None:
    src = _source(f"json {text}")
    so = cache.build(src)
    meta = so.with_suffix(".json")
    meta.write_text(text)
    cache.forget_loaded()
    builds = cache.STATS.builds
    assert _call(cache.load(src)) == 43
    assert cache.STATS.builds == builds + 1
    info = json.loads(meta.read_text())  # overwritten with a valid entry
    assert info["sha256"] == cache.hashlib.sha256(so.read_bytes()).hexdigest()


@settings(max_examples=60, deadline=None)
@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                          lambda c: st.lists(c, max_size=3)
                          | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6))
def test_any_json_that_is_not_the_digest_object_is_invalid(tmp_path_factory: pytest.TempPathFactory,
                                                           value: object) -> None:
    d = tmp_path_factory.mktemp("json")
    so, meta = d / "k.so", d / "k.json"
    so.write_bytes(b"library")
    meta.write_text(json.dumps(value))
    assert cache._valid(so, meta) is False  # never raises, whatever the JSON holds


def test_compiled_function_with_non_object_cache_json_runs_compiled(cache_root: Path) -> None:
    """The issue's reproducer: a cache .json that is valid JSON but not an object made the
    graph run eagerly on every call, never rebuilt."""
    def f(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(8)
    with torch.no_grad():
        er.compile(f)(x)
        for meta in (cache_root / "inductor").glob("*.json"):
            meta.write_text("[1, 2]")
        cache.forget_loaded()
        c = er.compile(f)
        torch.testing.assert_close(c(x), f(x))
    notes = " ".join(c.history.notes)
    assert "compiled it to" in notes and "eager backend" not in notes, notes
    # the guards' C modules are loaded once per process (functools.cache): one built by this
    # test's first compile is not loaded again, so its entry is rebuilt by the next process
    lifetime = {tensorcheck.build_extension(src).stem
                for src in (tensorcheck.source(), guardvm.source()) if src is not None}
    rebuilt = [m for m in (cache_root / "inductor").glob("*.json") if m.stem not in lifetime]
    assert rebuilt
    for meta in rebuilt:
        assert isinstance(json.loads(meta.read_text()), dict)
