"""Compiling C++ kernel sources into shared libraries, cached on disk.

The key covers the source, the compiler command and flags, the compiler's version, the CPU
(`-march=native` code runs only where it was built) and the versions of ember.inductor and torch.
A module's kernels are split into several translation units (`build_all`), compiled by
concurrent g++ processes (one per core, the longest unit first), one library each. An entry is `<key>.so` plus `<key>.json`
holding the library's sha256; both are written (mode 0600) to a temporary file and moved into
place with `os.replace`, so readers never see half a file. The directory is
`$EMBER_CACHE_DIR/inductor` or `~/.cache/ember/inductor`, created mode 0700.

Two different protections:
- the digest detects corruption (a truncated or damaged file): such an entry, or a `.json` that
  is not an object with the digest, is a miss and is rebuilt, never loaded. It is no defence
  against a person: anyone who can write the directory can recompute it.
- the permission check keeps other users out: the directory must be the user's and writable by
  nobody else, and every directory above it the user's or root's and not writable by others
  (unless sticky, as /tmp), so nobody else can move it aside; an entry file must be a regular
  file of the user's, writable by nobody else. A directory failing the check is never read: a
  one-line `CacheWarning` says why and the process compiles into a private temporary directory.
  An untrusted entry file in a private directory is not loaded, and is rebuilt.
A read-only cache directory serves the entries it has; missing ones are compiled into a private
temporary directory (with a note).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

CXX = os.environ.get("EMBER_CXX", "g++")
# -fno-math-errno: libm calls may then be vectorised (kernels never read errno)
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fwrapv",
              "-fno-math-errno", "-std=c++17")


class CompileError(RuntimeError):
    """The C++ compiler rejected a kernel source."""


class CacheWarning(UserWarning):
    """The kernel cache directory (or an entry) is not used: not private to the user, or not
    writable. Kernels are still compiled; only the cache is bypassed."""


@dataclass
class CacheStats:
    hits: int = 0
    builds: int = 0
    rejected: list[str] = field(default_factory=list)  # keys of corrupt entries rebuilt
    refused: list[str] = field(default_factory=list)  # keys of entries of untrusted files


STATS = CacheStats()
_LOADED: dict[str, ctypes.CDLL] = {}
_WARNED: set[str] = set()
_PRIVATE: list[Path] = []  # this process's private fallback directory, made on first need


def _warn(msg: str) -> None:
    """A one-line CacheWarning, once per distinct problem per process."""
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, CacheWarning, stacklevel=2)


def configured_dir() -> Path:
    """`$EMBER_CACHE_DIR/inductor`, else `~/.cache/ember/inductor` (not created here)."""
    base = os.environ.get("EMBER_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "ember"
    return root / "inductor"


def distrust(st: os.stat_result, uid: int, *, holder: bool) -> str | None:
    """Why a path with status `st` cannot be trusted by user `uid` (None: it can). A holder
    (the cache directory, an entry file) must be the user's and writable by the user alone; a
    directory above it may also be root's, and group/other-writable only if sticky (as /tmp):
    otherwise someone else could move the cache aside and put their own in its place."""
    owners = (uid,) if holder else (uid, 0)
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & 0o022 and (holder or not st.st_mode & stat.S_ISVTX):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_dir(d: Path) -> str | None:
    """Why directory `d` cannot hold this user's cache (None: it is private to the user)."""
    uid = os.geteuid()
    real = Path(os.path.realpath(d))
    for i, p in enumerate([real, *real.parents]):
        st = os.stat(p)
        if i == 0 and not stat.S_ISDIR(st.st_mode):
            return f"{p} is not a directory"
        why = distrust(st, uid, holder=i == 0)
        if why is not None:
            return f"{p} is {why}"
    return None


def _make_private(d: Path) -> None:
    """Create `d` and its missing parents, each mode 0700 (an existing one is left as is)."""
    missing: list[Path] = []
    p = d
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for q in reversed(missing):
        try:
            os.mkdir(q, 0o700)
        except FileExistsError:
            pass


def _private_dir() -> Path:
    """This process's private fallback directory (0700, removed at exit)."""
    if not _PRIVATE:
        d = Path(tempfile.mkdtemp(prefix="ember-inductor-"))
        atexit.register(shutil.rmtree, d, True)
        _PRIVATE.append(d)
    return _PRIVATE[0]


def _places() -> tuple[list[Path], Path | None, str]:
    """(directories to look entries up in, in order; the directory new entries go to, None for
    the private fallback; why the fallback, if it is used)."""
    d = configured_dir()
    try:
        _make_private(d)
        why = check_dir(d)
    except OSError as e:
        why = f"{e.filename or d}: {e.strerror or e}"
    private = list(_PRIVATE)
    if why is not None:
        return private, None, (f"ember: the kernel cache {d} is not used ({why}); kernels are "
                               f"compiled into a private temporary directory")
    real = Path(os.path.realpath(d))
    note = (f"ember: the kernel cache {real} is read-only; its entries are used, missing ones "
            f"are compiled into a private temporary directory")
    if not os.access(real, os.W_OK | os.X_OK):
        return [real, *private], None, note
    return [real, *private], real, note


def cache_dir() -> Path:
    """Where new entries are stored: the user's cache directory when it is private and
    writable, else this process's private temporary directory (with a CacheWarning)."""
    _, store, why = _places()
    if store is None:
        _warn(why)
        return _private_dir()
    return store


@functools.cache
def compiler_id() -> str:
    out = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else CXX


@functools.cache
def has_libmvec() -> bool:
    """glibc's vector math library, for vectorised exp/sin/... (see the prelude)."""
    try:
        out = subprocess.run([CXX, "-print-file-name=libmvec.so"], capture_output=True,
                             text=True, check=False).stdout.strip()
    except OSError:
        return False
    return os.path.isabs(out) and os.path.exists(out)


def flags() -> tuple[str, ...]:
    extra = ("-DEMBER_MVEC", "-lmvec") if has_libmvec() else ()
    return (*BASE_FLAGS, *extra)


@functools.cache
def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    try:
        mine = version("ember-inductor")
    except PackageNotFoundError:
        mine = "dev"
    return f"ember-inductor {mine}, torch {torch.__version__}"


@functools.cache
def cpu_id() -> str:
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "model name")):
                flags += line
            if line.startswith("flags"):
                break
    except OSError:
        pass
    return platform.machine() + hashlib.sha256(flags.encode()).hexdigest()[:16]


def cache_key(source: str) -> str:
    h = hashlib.sha256()
    for part in (source, CXX, " ".join(flags()), compiler_id(), cpu_id(), versions()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a private temporary file moved into place (mode 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_distrust(path: Path) -> str | None:
    """Why an entry file cannot be loaded (None: a regular file of the user's, writable by
    nobody else). A symlink is refused too: the check is on the file itself."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    return distrust(st, os.geteuid(), holder=True)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _valid(so: Path, meta: Path) -> bool:
    """The entry's library matches the digest in its .json (a .json that is not an object
    with a string `sha256` is a malformed entry: not valid)."""
    text, data = _read(meta), _read(so)
    if text is None or data is None:
        return False
    try:
        info = json.loads(text)
    except ValueError:
        return False
    return isinstance(info, dict) and info.get("sha256") == hashlib.sha256(data).hexdigest()


def _entry(source: str, lookup: Sequence[Path]) -> Path | None:
    """The cached library of `source` if a trusted, valid entry exists in one of `lookup` (an
    untrusted or corrupt one is noted, and is a miss)."""
    key = cache_key(source)
    for d in lookup:
        so, meta = d / f"{key}.so", d / f"{key}.json"
        if not (os.path.lexists(so) and os.path.lexists(meta)):
            continue
        why = file_distrust(so) or file_distrust(meta)
        if why is not None:
            STATS.refused.append(key)
            _warn(f"ember: the cached kernel library {so} is not loaded ({why}); it is rebuilt")
            continue
        if _valid(so, meta):
            return so
        STATS.rejected.append(key)
    return None


def build(source: str) -> Path:
    """The path of the compiled library for `source`, from the cache or freshly built."""
    return build_all([source])[0]


def build_all(sources: Sequence[str]) -> list[Path]:
    """The libraries of several translation units: cached ones are reused, the others are
    compiled by concurrent g++ processes (at most `jobs()` at once)."""
    lookup, store, why = _places()
    paths: list[Path | None] = [_entry(src, lookup) for src in sources]
    todo = [k for k, p in enumerate(paths) if p is None]
    STATS.hits += len(sources) - len(todo)
    if not todo:  # nothing to write: a read-only cache holding every entry serves them all
        return [p for p in paths if p is not None]
    tmp: str | None = None
    if store is not None:
        try:
            tmp = tempfile.mkdtemp(dir=store)
        except OSError as e:
            store, why = None, (f"ember: the kernel cache {store} is not writable "
                                f"({e.strerror or e}); missing entries are compiled into a "
                                f"private temporary directory")
    if store is None or tmp is None:
        _warn(why)
        store = _private_dir()
        tmp = tempfile.mkdtemp(dir=store)
    try:
        _compile(sources, todo, paths, Path(tmp), store)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [p for p in paths if p is not None]


def _compile(sources: Sequence[str], todo: list[int], paths: list[Path | None], tmp: Path,
             store: Path) -> None:
    """Compile the `todo` units, at most `jobs()` g++ processes at once, the longest source
    first and the next one started as soon as any finishes (threads only wait on g++)."""
    def run(k: int) -> tuple[int, subprocess.CompletedProcess[str], Path]:
        cpp, out = tmp / f"tu{k}.cpp", tmp / f"tu{k}.so"
        cpp.write_text(sources[k])
        return k, subprocess.run([CXX, *flags(), str(cpp), "-o", str(out)],
                                 capture_output=True, text=True, check=False), out

    order = sorted(todo, key=lambda k: (-len(sources[k]), k))
    if len(order) == 1:
        done = [run(order[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(jobs(), len(order))) as pool:
            done = list(pool.map(run, order))
    errors: list[str] = []
    for k, proc, out in sorted(done, key=lambda d: d[0]):
        if proc.returncode != 0:
            errors.append(proc.stderr[-4000:])
            continue
        paths[k] = _store(sources[k], out.read_bytes(), store)
    if errors:
        raise CompileError(f"{CXX} failed on the kernels:\n{errors[0]}")


def _store(source: str, data: bytes, d: Path) -> Path:
    """Write an entry into `d` (replacing a corrupt or untrusted one); where `d` refuses the
    write, into the private fallback directory."""
    key = cache_key(source)
    meta = json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "compiler": compiler_id(),
                       "flags": flags()}).encode()
    try:
        _write_entry(d, key, data, meta)
    except OSError as e:
        if d in _PRIVATE:
            raise
        _warn(f"ember: the kernel cache {d} is not writable ({e.strerror or e}); missing "
              f"entries are compiled into a private temporary directory")
        d = _private_dir()
        _write_entry(d, key, data, meta)
    STATS.builds += 1
    return d / f"{key}.so"


def _write_entry(d: Path, key: str, data: bytes, meta: bytes) -> None:
    atomic_write(d / f"{key}.so", data)
    atomic_write(d / f"{key}.json", meta)


def jobs() -> int:
    """Concurrent compiler processes: `EMBER_COMPILE_JOBS`, else one per CPU."""
    env = os.environ.get("EMBER_COMPILE_JOBS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


def load(source: str) -> ctypes.CDLL:
    """The loaded library for `source` (compiled or taken from the cache; loaded once)."""
    return load_all([source])[0]


def load_all(sources: Sequence[str]) -> list[ctypes.CDLL]:
    """The loaded libraries of several translation units, building the missing ones in
    parallel (each loaded once per process). Each library's owner and mode are checked again
    just before it is loaded."""
    keys = [cache_key(s) for s in sources]
    missing = [s for s, k in zip(sources, keys, strict=True) if k not in _LOADED]
    if missing:
        for s, path in zip(missing, build_all(missing), strict=True):
            why = file_distrust(path)
            if why is not None:
                raise CompileError(f"the kernel library {path} is not loaded: {why}")
            _LOADED[cache_key(s)] = ctypes.CDLL(str(path))
    return [_LOADED[k] for k in keys]


def forget_loaded() -> None:
    """Drop the in-process table of loaded libraries (tests: force a disk-cache lookup)."""
    _LOADED.clear()
