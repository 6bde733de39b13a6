"""Compiling C++ kernel sources into shared libraries, cached on disk.

The key covers the source, the compiler command and flags, the compiler's version, the CPU
(`-march=native` code runs only where it was built) and the versions of ember.inductor and torch.
A module's kernels are split into several translation units (`build_all`), compiled by
concurrent g++ processes, one library each. An entry is `<key>.so` plus `<key>.json`
holding the library's sha256; both are written to a temporary file and moved into place with
`os.replace`, so readers never see half a file. An entry whose digest does not match (a corrupt
or truncated file) is rebuilt, never loaded. The directory is `$EMBER_CACHE_DIR/inductor` or
`~/.cache/ember/inductor`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CXX = os.environ.get("EMBER_CXX", "g++")
# -fno-math-errno: libm calls may then be vectorised (kernels never read errno)
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fwrapv",
              "-fno-math-errno", "-std=c++17")


class CompileError(RuntimeError):
    """The C++ compiler rejected a kernel source."""


@dataclass
class CacheStats:
    hits: int = 0
    builds: int = 0
    rejected: list[str] = field(default_factory=list)  # keys of corrupt entries rebuilt


STATS = CacheStats()
_LOADED: dict[str, ctypes.CDLL] = {}


def cache_dir() -> Path:
    base = os.environ.get("EMBER_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "ember"
    d = root / "inductor"
    d.mkdir(parents=True, exist_ok=True)
    return d


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


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _valid(so: Path, meta: Path) -> bool:
    try:
        info = json.loads(meta.read_text())
        return bool(info.get("sha256") == _digest(so))
    except (OSError, ValueError):
        return False


def _entry(source: str) -> tuple[Path, Path] | None:
    """The cached library of `source` if a valid entry exists (a corrupt one is noted)."""
    key = cache_key(source)
    d = cache_dir()
    so, meta = d / f"{key}.so", d / f"{key}.json"
    if so.exists() and meta.exists():
        if _valid(so, meta):
            return so, meta
        STATS.rejected.append(key)
    return None


def build(source: str) -> Path:
    """The path of the compiled library for `source`, from the cache or freshly built."""
    return build_all([source])[0]


def build_all(sources: Sequence[str]) -> list[Path]:
    """The libraries of several translation units: cached ones are reused, the others are
    compiled by concurrent g++ processes (at most `jobs()` at once)."""
    paths: list[Path | None] = []
    todo: list[int] = []
    for k, src in enumerate(sources):
        hit = _entry(src)
        if hit is None:
            todo.append(k)
            paths.append(None)
        else:
            STATS.hits += 1
            paths.append(hit[0])
    d = cache_dir()
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        running: list[tuple[int, subprocess.Popen[str], Path]] = []
        errors: list[str] = []

        def reap(item: tuple[int, subprocess.Popen[str], Path]) -> None:
            k, proc, out = item
            _, err = proc.communicate()
            if proc.returncode != 0:
                errors.append(err[-4000:])
                return
            paths[k] = _store(sources[k], out.read_bytes())

        for k in todo:
            cpp = Path(tmp) / f"tu{k}.cpp"
            cpp.write_text(sources[k])
            out = Path(tmp) / f"tu{k}.so"
            while len(running) >= jobs():
                reap(running.pop(0))
            running.append((k, subprocess.Popen(
                [CXX, *flags(), str(cpp), "-o", str(out)], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True), out))
        for item in running:
            reap(item)
        if errors:
            raise CompileError(f"{CXX} failed on the kernels:\n{errors[0]}")
    return [p for p in paths if p is not None]


def _store(source: str, data: bytes) -> Path:
    key = cache_key(source)
    d = cache_dir()
    so, meta = d / f"{key}.so", d / f"{key}.json"
    _atomic_write(so, data)
    _atomic_write(meta, json.dumps({"sha256": hashlib.sha256(data).hexdigest(),
                                    "compiler": compiler_id(), "flags": flags()}).encode())
    STATS.builds += 1
    return so


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
    parallel (each loaded once per process)."""
    keys = [cache_key(s) for s in sources]
    missing = [s for s, k in zip(sources, keys, strict=True) if k not in _LOADED]
    if missing:
        for s, path in zip(missing, build_all(missing), strict=True):
            _LOADED[cache_key(s)] = ctypes.CDLL(str(path))
    return [_LOADED[k] for k in keys]


def forget_loaded() -> None:
    """Drop the in-process table of loaded libraries (tests: force a disk-cache lookup)."""
    _LOADED.clear()
