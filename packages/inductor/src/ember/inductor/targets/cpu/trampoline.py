"""A C caller of the C++ kernels' pointer ABI, cheaper per call than ctypes.

A generated wrapper calls each kernel with its buffers' data addresses and its size symbols'
values, all Python ints. Through ctypes (argtypes c_void_p / c_int64) each call converts every
argument through its type's `from_param` and builds a libffi call: ~0.75 us for six pointers
on the 2-core Xeon this was measured on, levit_128s making 298 such calls a forward. This
module builds (once per process, through the kernel cache) one small CPython extension
function, METH_FASTCALL, that reads the ints straight off the argument vector and calls the
kernel through a function pointer of its arity: ~0.25 us for the same call (thread CPU time,
interleaved with the ctypes call, 5000 calls each).

Pointers and int64 values travel in the same (integer) registers and stack slots in the x86-64
and AArch64 C calling conventions, so a kernel `void k(const float*, float*, int64_t)` is
called as `void (*)(int64_t, int64_t, int64_t)`: the call ctypes makes through libffi, without
libffi. The argument count is checked on every call (a TypeError, as ctypes raises), an argument that is
no integer raises TypeError, and the GIL is released around the kernel as ctypes releases it.
Where CPython's headers are missing or the build fails, kernels keep their ctypes call.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import struct
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ember.inductor.targets.cpu import cache

MAX_ARGS = 64  # kernels taking more keep ctypes (the switch below has a case per count)


def _source(include: str) -> str:
    cases = []
    for n in range(MAX_ARGS + 1):
        types = ", ".join(["int64_t"] * n) or "void"
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"    case {n}: ((void (*)({types}))fn)({args}); break;")
    body = "\n".join(cases)
    # (the header by its full path: the kernel cache compiles with fixed flags, no -I)
    return f'''#define PY_SSIZE_T_CLEAN
#include "{include}/Python.h"
#include <cstdint>
#include <cstdlib>
#include <cstring>
// self: a bytes object holding the kernel's address and its argument count (int64 each)
static PyObject* ember_kernel_call(PyObject* self, PyObject* const* args, Py_ssize_t n) {{
  const int64_t* info = (const int64_t*)PyBytes_AS_STRING(self);
  if (n != info[1]) {{
    PyErr_Format(PyExc_TypeError, "this kernel takes %lld arguments (%zd given)",
                 (long long)info[1], n);
    return NULL;
  }}
  int64_t a[{MAX_ARGS} + 1];
  for (Py_ssize_t i = 0; i < n; i++) {{
    if (PyLong_CheckExact(args[i])) {{
      a[i] = PyLong_AsLongLong(args[i]);
    }} else {{  // (an int subclass or an object with __index__, as ctypes takes them)
      PyObject* x = PyNumber_Index(args[i]);
      if (x == NULL) return NULL;
      a[i] = PyLong_AsLongLong(x);
      Py_DECREF(x);
    }}
    if (a[i] == -1 && PyErr_Occurred()) return NULL;
  }}
  void* fn = (void*)info[0];
  Py_BEGIN_ALLOW_THREADS
  switch (n) {{
{body}
  }}
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}}
// a callable named `name` (the kernel's symbol: dumps and benchmarks read it) calling the
// kernel `info` describes; its method definition lives as long as the process
extern "C" PyObject* ember_kernel_caller(PyObject* info, const char* name) {{
  PyMethodDef* def = (PyMethodDef*)std::calloc(1, sizeof(PyMethodDef));
  char* own = strdup(name);
  if (def == NULL || own == NULL) return PyErr_NoMemory();
  def->ml_name = own;
  def->ml_meth = (PyCFunction)(void (*)(void))ember_kernel_call;
  def->ml_flags = METH_FASTCALL;
  return PyCFunction_New(def, info);
}}
'''


@functools.cache
def _library_source() -> str | None:
    """The caller's C++ source, or None where it cannot be built here."""
    include = sysconfig.get_paths().get("include")
    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64") or not include \
            or not (Path(include) / "Python.h").is_file() or '"' in include:
        return None
    return _source(include)


_MAKERS: dict[str, Any] = {}  # library path -> its caller factory


def _maker() -> Callable[[bytes, bytes], Any] | None:
    """The library's caller factory, or None where it cannot be built here. Looked up in the
    kernel cache each time (once per kernel and argument count), as kernels are: an entry
    found corrupt is rebuilt, not kept because this process loaded it once."""
    src = _library_source()
    if src is None:
        return None
    try:
        lib = cache.load(src)
    except cache.CompileError:
        return None
    if lib._name not in _MAKERS:
        fn = ctypes.PyDLL(lib._name).ember_kernel_caller  # (PyDLL: called holding the GIL)
        fn.argtypes = [ctypes.py_object, ctypes.c_char_p]
        fn.restype = ctypes.py_object
        _MAKERS[lib._name] = fn
    return _MAKERS[lib._name]  # type: ignore[no-any-return]


def caller(fn: Any, nargs: int) -> Callable[..., None] | None:
    """A C callable of ctypes function `fn` (a kernel of the pointer ABI) taking `nargs` ints,
    or None (ctypes then): too many arguments, or no extension build here."""
    make = _maker()
    if make is None or nargs > MAX_ARGS:
        return None
    address = ctypes.cast(fn, ctypes.c_void_p).value
    if not address:
        return None
    name = getattr(fn, "__name__", "kernel")
    out: Callable[..., None] = make(struct.pack("2q", address, nargs), name.encode())
    return out


__all__ = ["MAX_ARGS", "caller"]
