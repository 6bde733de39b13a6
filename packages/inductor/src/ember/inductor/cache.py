"""Compiling C++ kernel sources into shared libraries, cached on disk.

The key covers the source, the compiler command and flags, the compiler's version and the CPU
(`-march=native` code runs only where it was built). An entry is `<key>.so` plus `<key>.json`
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
from dataclasses import dataclass, field
from pathlib import Path

CXX = os.environ.get("EMBER_CXX", "g++")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fwrapv", "-std=c++17")


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
    for part in (source, CXX, " ".join(FLAGS), compiler_id(), cpu_id()):
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


def build(source: str) -> Path:
    """The path of the compiled library for `source`, from the cache or freshly built."""
    key = cache_key(source)
    d = cache_dir()
    so, meta = d / f"{key}.so", d / f"{key}.json"
    if so.exists() and meta.exists():
        if _valid(so, meta):
            STATS.hits += 1
            return so
        STATS.rejected.append(key)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        src = Path(tmp) / "kernels.cpp"
        src.write_text(source)
        out = Path(tmp) / "kernels.so"
        res = subprocess.run([CXX, *FLAGS, str(src), "-o", str(out)], capture_output=True,
                             text=True, check=False)
        if res.returncode != 0:
            raise CompileError(f"{CXX} failed on the kernels:\n{res.stderr[-4000:]}")
        data = out.read_bytes()
    _atomic_write(so, data)
    _atomic_write(meta, json.dumps({"sha256": hashlib.sha256(data).hexdigest(),
                                    "compiler": compiler_id(), "flags": FLAGS}).encode())
    STATS.builds += 1
    return so


def load(source: str) -> ctypes.CDLL:
    """The loaded library for `source` (compiled or taken from the cache; loaded once)."""
    key = cache_key(source)
    lib = _LOADED.get(key)
    if lib is None:
        lib = ctypes.CDLL(str(build(source)))
        _LOADED[key] = lib
    return lib


def forget_loaded() -> None:
    """Drop the in-process table of loaded libraries (tests: force a disk-cache lookup)."""
    _LOADED.clear()
