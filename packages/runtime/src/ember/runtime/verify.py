"""`ember verify` (also `python -m ember.runtime.verify`): check an installation.

Like PyTorch's old verify_dynamo.py: rather than a traceback deep inside a compile, one line per
check saying what was found and, on failure, what to do. The checks run in the order of
`CHECKS`: the Python and torch versions against the ranges the ember packages declare (read from
their installed metadata), the ember packages themselves, the kernel cache directory, the CPU
target's toolchain (the C++ compiler the inductor's cache invokes, OpenMP with the inductor's
own flags), a tiny function compiled through the CPU target and checked against eager (and
checked to have run compiled C++, not a fallback), and the CUDA target (not built yet: a note).

A failed required check makes the exit status 1; notes never do. A check that raises is reported
as FAIL with the exception's one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import stat
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import torch

Status = Literal["ok", "fail", "note"]

# The distributions that make up ember, each with the module it provides.
PACKAGES = ("ember-ir", "ember-capture", "ember-prims", "ember-autograd", "ember-inductor",
            "ember-runtime")


@dataclass(frozen=True)
class Result:
    """One check's outcome: what was found and, unless it is ok, what to do about it."""

    name: str
    status: Status
    found: str
    fix: str = ""

    def line(self, width: int = 0) -> str:
        tag = {"ok": "ok", "fail": "FAIL", "note": "note"}[self.status]
        text = f"{tag:<5}{self.name:<{width}} {self.found}"
        return text + (f" — {self.fix}" if self.fix else "")


Done = Mapping[str, Result]  # the results of the checks run so far, by name
Check = Callable[[Done], Result]  # the table `CHECKS` names each check's result


def ok(found: str) -> Result:
    return Result("", "ok", found)


def fail(found: str, fix: str = "") -> Result:
    return Result("", "fail", found, fix)


def note(found: str, fix: str = "") -> Result:
    return Result("", "note", found, fix)


# ---- versions ----------------------------------------------------------------------------------

def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version (`2.13.0+cpu` -> (2, 13, 0)); pre-release, post and
    local parts are ignored: the ranges ember declares are plain lower bounds."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not m:
        raise ValueError(f"cannot read version {version!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def satisfies(version: str, spec: str) -> bool:
    """Whether `version` lies in a PEP 440 specifier set such as `>=2.9,<3` (the operators
    ~= == != <= >= < > and `==X.*`); ValueError for a clause it cannot read."""
    v = _release(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.fullmatch(r"(~=|==|!=|<=|>=|<|>)\s*(\d+(?:\.\d+)*)(\.\*)?", clause)
        if not m:
            raise ValueError(f"cannot read the version range {spec!r}")
        op, want, star = m.group(1), _release(m.group(2)), bool(m.group(3))
        if star:
            inside = v[:len(want)] + (0,) * (len(want) - len(v)) == want
            ok = inside if op == "==" else not inside if op == "!=" else None
            if ok is None:
                raise ValueError(f"cannot read the version range {spec!r}")
        elif op == "~=":
            ok = _cmp(v, want) >= 0 and _cmp(v[:len(want) - 1], want[:-1]) == 0
        else:
            c = _cmp(v, want)
            ok = {"==": c == 0, "!=": c != 0, "<=": c <= 0, ">=": c >= 0, "<": c < 0,
                  ">": c > 0}[op]
        if not ok:
            return False
    return True


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def torch_version() -> str:
    return str(torch.__version__)


def declared_python() -> list[tuple[str, str]]:
    """(distribution, Requires-Python) of each installed ember package that declares one."""
    out = []
    for dist in PACKAGES:
        try:
            spec = (metadata.metadata(dist).get_all("Requires-Python") or [""])[0]
        except metadata.PackageNotFoundError:
            continue
        if spec:
            out.append((dist, spec))
    return out


def declared_torch() -> list[tuple[str, str]]:
    """(distribution, specifier) of each installed ember package's requirement on torch."""
    out = []
    for dist in PACKAGES:
        try:
            reqs = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for r in reqs:
            m = re.fullmatch(r"torch\s*(?:\[[^\]]*\])?\s*\(?([^;)]*)\)?\s*(?:;.*)?", r.strip())
            if m and "extra ==" not in r:
                out.append((dist, m.group(1).strip()))
    return out


def _in_range(version: str, declared: list[tuple[str, str]], fix: str) -> Result:
    if not declared:
        return fail(f"{version}; no installed ember package declares the "
                      f"supported range", "install the ember packages (see `packages`)")
    specs = sorted({s for _, s in declared if s})
    bad = [(d, s) for d, s in declared if s and not satisfies(version, s)]
    rng = ",".join(specs) or "any"
    if bad:
        return fail(f"{version} is outside the supported range {rng} "
                      f"(declared by {', '.join(sorted({d for d, _ in bad}))})", fix)
    return ok(f"{version} (supported: {rng})")


def check_python(done: Done) -> Result:
    return _in_range(python_version(), declared_python(),
                     "use a supported Python (e.g. python3.11 -m venv .venv)")


def check_torch(done: Done) -> Result:
    specs = sorted({s for _, s in declared_torch() if s})
    want = "torch" + ",".join(specs) if specs else "a supported torch"
    return _in_range(torch_version(), declared_torch(),
                     f"install {want} (pip install '{want}')")


def check_packages(done: Done) -> Result:
    versions: dict[str, str] = {}
    missing: list[str] = []
    broken: list[str] = []
    for dist in PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            missing.append(dist)
            continue
        module = "ember." + dist.removeprefix("ember-")
        try:
            importlib.import_module(module)
        except Exception as e:
            broken.append(f"{module} ({type(e).__name__}: {_one_line(e)})")
    if missing:
        return fail(f"not installed: {', '.join(missing)}",
                      "install them together (in a checkout: python3 dev.py dev)")
    if broken:
        return fail(f"cannot import {'; '.join(broken)}",
                      "reinstall the ember packages (in a checkout: python3 dev.py dev)")
    distinct = sorted(set(versions.values()))
    if len(distinct) > 1:
        listed = ", ".join(f"{d} {v}" for d, v in versions.items())
        return fail(f"mixed versions: {listed}",
                      "install one release of every ember package")
    return ok(f"{len(versions)} packages, version {distinct[0]}, all importable")


# ---- the kernel cache --------------------------------------------------------------------------

def check_cache(done: Done) -> Result:
    """The inductor's kernel cache directory, judged by the inductor's own rules (cache.py):
    private to the user (else it is not used at all), writable (else read-only: its entries
    serve, new kernels go to a private temporary directory)."""
    from ember.inductor import cache

    d = cache.configured_dir()
    with warnings.catch_warnings():  # the refusal is this check's line, not a warning
        warnings.simplefilter("ignore", cache.CacheWarning)
        cache.cache_dir()  # creates it, mode 0700, where it is missing
    try:
        why = cache.check_dir(d)
    except OSError as e:
        why = f"{e.filename or d}: {e.strerror or e}"
    if why is not None:
        return fail(f"{d} is not used ({why}): every process compiles its kernels afresh",
                    f"chmod 700 {d} (and no directory above it writable by others), or set "
                    f"EMBER_CACHE_DIR to a directory of your own")
    real = Path(os.path.realpath(d))
    mode = stat.S_IMODE(os.stat(real).st_mode)
    if not os.access(real, os.W_OK | os.X_OK):
        return note(f"{real} is read-only (mode {mode:o}): its entries are used, new kernels "
                    f"are compiled into a private temporary directory each run",
                    f"chmod u+w {real} to keep them")
    if mode & 0o077:
        return note(f"{real} (mode {mode:o}) is writable by you alone but readable by others",
                    f"chmod 700 {real} to keep it private")
    return ok(f"{real} (mode {mode:o}: private, writable)")


# ---- the CPU target ----------------------------------------------------------------------------

def _compile_error_line(e: BaseException) -> str:
    """The compiler's first error line out of a CompileError's message (stderr attached)."""
    lines = [ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[0] if lines else _one_line(e) + " (no message from the compiler)"


def check_compiler(done: Done) -> Result:
    from ember.inductor import cache

    cxx = cache.CXX  # what the inductor invokes: $EMBER_CXX, else g++ on PATH
    via = f"EMBER_CXX={cxx}" if os.environ.get("EMBER_CXX") else cxx
    path = shutil.which(cxx)
    if path is None:
        fix = ("install it or set EMBER_CXX to a C++17 compiler" if os.environ.get("EMBER_CXX")
               else "install g++ (Debian: apt install g++) or set EMBER_CXX to a C++17 "
               "compiler")
        return fail(f"{via} not found on PATH", fix)
    version = cache.compiler_id()  # the line the cache key uses; the name alone if no output
    if version == cxx:
        return fail(f"`{path} --version` printed nothing: not a working compiler",
                      "install g++ (Debian: apt install g++) or set EMBER_CXX")
    return ok(f"{version} ({path})")


OPENMP_PROBE = """
#include <omp.h>
extern "C" int ember_verify_threads() {
    int n = 0;
#pragma omp parallel
    {
#pragma omp atomic
        n++;
    }
    return n;
}
"""


def check_openmp(done: Done) -> Result:
    """A tiny OpenMP library built and loaded exactly as kernels are (the inductor's flags,
    -fopenmp -march=native ..., through its cache)."""
    from ember.inductor import cache

    if blocked := _needs(done, "c++ compiler"):
        return fail(blocked)
    try:
        lib = cache.load(OPENMP_PROBE)
    except cache.CompileError as e:
        return fail(f"{cache.CXX} {' '.join(cache.flags())} failed: "
                      f"{_compile_error_line(e)}",
                      "install the compiler's OpenMP support (Debian: apt install libgomp1 "
                      "for g++, libomp-dev for clang)")
    threads = int(lib.ember_verify_threads())
    return ok(f"{threads} thread(s) in a parallel region "
                  f"(built with the inductor's flags)")


def _tiny(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * y + 1.0).sum(dim=-1)


def check_cpu_target(done: Done) -> Result:
    """A tiny function through ember.runtime.compile's inductor backend on CPU tensors: the
    result matches eager, and it ran compiled C++ (no fallback, no graph left to eager)."""
    from ember.runtime.bench import ember_status
    from ember.runtime.compile import compile
    from ember.runtime.dump import ENV as DUMP_ENV

    if blocked := _needs(done, "c++ compiler", "openmp"):
        return fail(blocked)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    dump = os.environ.pop(DUMP_ENV, None)  # the probe is not the user's graph: no dump of it
    try:
        with torch.no_grad():
            want = _tiny(x, y)
            compiled = compile(_tiny, backend="inductor")
            got = compiled(x, y)
    finally:
        if dump is not None:
            os.environ[DUMP_ENV] = dump
    st = ember_status(compiled)
    eager = [*st.get("fallbacks", []), *st.get("breaks", []), *st.get("eager_graphs", []),
             *(f"ops on the reference interpreter: {r}" for r in st.get("reference", []))]
    fix = "run `ember explain` on a function to see why; report it if the toolchain checks pass"
    if eager:
        return fail(f"did not run compiled C++: {_one_line(eager[0])}", fix)
    if not st.get("kernels"):
        return fail(f"no C++ kernel was compiled ({st.get('status')})", fix)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return fail("the compiled function returned the wrong shape", fix)
    err = float((got - want).abs().max())
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
        return fail(f"compiled result differs from eager (max abs error "
                      f"{err:.1e})", fix)
    return ok(f"a tiny function compiled to {st['kernels']} C++ kernel(s); "
                  f"matches eager (max abs error {err:.1e})")


def check_cuda_target(done: Done) -> Result:
    """Optional: the CUDA target is not built yet, so this is a note whatever is found."""
    try:
        importlib.import_module("triton")
        triton = "triton importable"
    except Exception:
        triton = "triton not installed"
    if torch.cuda.is_available():
        gpu = f"GPU {torch.cuda.get_device_name(0)}"
    elif torch.version.cuda is None:
        gpu = f"no GPU (torch {torch_version()} has no CUDA)"
    else:
        gpu = "no GPU visible"
    return note(f"not built yet: the inductor compiles CPU graphs "
                  f"only, CUDA inputs run eagerly ({triton}; {gpu})")


# The checks, in order, by name; a check may read the results of those before it.
CHECKS: list[tuple[str, Check]] = [
    ("python", check_python),
    ("torch", check_torch),
    ("ember packages", check_packages),
    ("kernel cache", check_cache),
    ("c++ compiler", check_compiler),
    ("openmp", check_openmp),
    ("cpu target", check_cpu_target),
    ("cuda target", check_cuda_target),
]


def _one_line(e: object) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return first or type(e).__name__


def _needs(done: Done, *names: str) -> str | None:
    failed = [n for n in names if n in done and done[n].status == "fail"]
    return f"not tried: needs {' and '.join(failed)} (see above)" if failed else None


def run_checks(checks: Sequence[tuple[str, Check]] | None = None) -> list[Result]:
    done: dict[str, Result] = {}
    for name, check in CHECKS if checks is None else checks:
        try:
            with warnings.catch_warnings():  # each outcome is its line: no stray warnings
                warnings.simplefilter("ignore")
                r = check(done)
        except Exception as e:  # an unexpected failure is a FAIL line, not a traceback
            r = fail(f"{type(e).__name__}: {_one_line(e)}")
        done[name] = replace(r, name=name)
    return list(done.values())


def summary(results: Sequence[Result]) -> str:
    failed = [r.name for r in results if r.status == "fail"]
    notes = sum(r.status == "note" for r in results)
    oks = sum(r.status == "ok" for r in results)
    counts = f"{oks} ok, {notes} note(s), {len(failed)} failed"
    if failed:
        return f"ember verify: FAILED ({counts}): {', '.join(failed)}"
    return f"ember verify: this installation works ({counts})"


def report(results: Sequence[Result]) -> str:
    width = max((len(r.name) for r in results), default=0)
    return "\n".join([*(r.line(width) for r in results), summary(results)]) + "\n"


def verify() -> int:
    """Run every check, print the report, return the exit status (1 if a required check
    failed)."""
    results = run_checks()
    sys.stdout.write(report(results))
    return 1 if any(r.status == "fail" for r in results) else 0


def add_verify_command(sub: Any) -> None:
    """Register the `verify` subcommand on the CLI's subparsers."""
    v = sub.add_parser("verify", help="check this installation: versions, packages, the C++ "
                       "toolchain, the kernel cache, a tiny compile")
    v.set_defaults(fn=lambda a: verify())


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m ember.runtime.verify",
                            description="check this ember installation").parse_args(argv)
    return verify()


if __name__ == "__main__":
    raise SystemExit(main())
